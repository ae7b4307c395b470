"""Per-call overhead of forward+backward through gradflow's torch dispatchers.

One run measures, on the same small elementwise program (Y = X * X * W, the forward saves T = X * X), the
time of one forward + one backward through each route:

  fast_call          the two compiled SDFGs called directly with `CompiledSDFG.fast_call` and prebuilt
                     arguments (no allocation, no validation, no autograd): the floor
  torch native ops   the equivalent native torch ops (`X * X * W`, eager autograd)
  empty Function     an empty Python `torch.autograd.Function` (allocates its output, backward returns the
                     cotangent): the cost of torch's autograd machinery for a Python Function by itself
  empty C++ Function an empty C++ `torch::autograd::Function` called from a CPython entry point like
                     gradflow's extension (same machinery for C++ Functions; skipped with --no-cpp)
  gradflow ctypes    gradflow.torch.function(..., dispatcher="ctypes")
  gradflow cpp       gradflow.torch.function(..., dispatcher="cpp")  (generated C++ torch extension)
  ctypes arg path    the ctypes dispatcher's generated per-signature forward/backward (allocation, native
                     call, bookkeeping on a stand-in ctx) without autograd: what the fast path itself adds
                     to the kernels

Each forward+backward through autograd is `y = f(X, W); torch.autograd.grad(y, (X, W), g)`. The routes are
interleaved (one batch of each per repeat) so that a change of machine load affects them alike; each
figure is the median over repeats of the mean per-call time. Columns: "x fast_call" and "x torch" are
ratios; "added" is the route's time minus fast_call's (the kernels); "added over fast_call + empty
Function" also subtracts the whole time of the empty Python Function (torch.autograd.grad and a Python
autograd.Function doing nothing), i.e. what gradflow adds beyond the kernels and torch's autograd
machinery. fast_call itself spends ~1 us in DaCe's Python wrapper, which gradflow's routes do not, so both
"added" figures slightly understate gradflow's share.

    OMP_NUM_THREADS=1 python benchmarks/dispatch.py [--n 16] [--calls 2000] [--repeats 15] [--no-cpp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "torch"))

import vjp_programs as programs  # noqa: E402  (hand-written VJPResult pairs shared with the tests)

import gradflow.torch as gt  # noqa: E402
from gradflow.runtime.cache import cache_root  # noqa: E402

TARGET_US = 10.0

_EMPTY_CPP = r"""
#include <Python.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Exceptions.h>
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
struct Empty : public torch::autograd::Function<Empty> {
  static variable_list forward(AutogradContext*, at::Tensor x, at::Tensor w) { return {at::empty_like(x)}; }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], g[0]}; }
};
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !THPVariable_Check(args[0]) || !THPVariable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "call(x, w) takes two tensors");
    return nullptr;
  }
  variable_list out;
  {
    PyThreadState* state = PyEval_SaveThread();
    try { out = Empty::apply(THPVariable_Unpack(args[0]), THPVariable_Unpack(args[1])); }
    catch (...) { PyEval_RestoreThread(state); throw; }
    PyEval_RestoreThread(state);
  }
  return THPVariable_Wrap(std::move(out[0]));
  END_HANDLE_TH_ERRORS
}
PyMethodDef methods[] = {{"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&call)),
                          METH_FASTCALL, nullptr}, {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1, methods};
}  // namespace
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""


def empty_cpp_function():
    """The empty C++ autograd Function's entry point (built once into the gradflow cache)."""
    from torch.utils import cpp_extension

    key = hashlib.sha256((_EMPTY_CPP + torch.__version__).encode()).hexdigest()[:16]
    name = f"gradflow_bench_empty_{key}"
    folder = cache_root() / "torch_ext" / name
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.cpp"
    text = _EMPTY_CPP.replace("NAME", name)
    if not source.is_file() or source.read_text() != text:
        source.write_text(text)
    module = cpp_extension.load(name=name, sources=[str(source)], build_directory=str(folder),
                                extra_cflags=["-O2", "-std=c++17"], is_python_module=True)
    return module.call


def measure(routes: dict, calls: int, repeats: int) -> dict:
    """Median over `repeats` of the mean time of one call, in microseconds. The routes are interleaved
    (one batch of each per repeat) so that a change of machine load affects them alike."""
    for fn in routes.values():
        for _ in range(max(calls // 10, 10)):
            fn()
    samples = {name: [] for name in routes}
    for _ in range(repeats):
        for name, fn in routes.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="vector length (small: overhead dominates)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-cpp", action="store_true", help="skip the C++ routes (slow first build)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.n
    vjp = programs.square_mul(name="bench_sqmul")
    f_ctypes = gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="ctypes")
    f_cpp = None if args.no_cpp else gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="cpp")
    empty_cpp = None if args.no_cpp else empty_cpp_function()

    X = torch.rand(n, dtype=torch.float64, requires_grad=True)
    W = torch.rand(n, dtype=torch.float64, requires_grad=True)
    g = torch.rand(n, dtype=torch.float64)

    # (a) the compiled SDFGs themselves, prebuilt arguments
    fwd, bwd = f_ctypes.forward_compiled, f_ctypes.backward_compiled
    xs, ws, gs = (np.array(t.detach().numpy()) for t in (X, W, g))
    ys, ts, gx, gw = (np.empty(n) for _ in range(4))
    fargs = fwd.construct_arguments(X=xs, W=ws, Y=ys, T=ts, N=n)
    bargs = bwd.construct_arguments(X=xs, W=ws, T=ts, gY=gs, gX=gx, gW=gw, N=n)

    def direct():
        fwd.fast_call(*fargs)
        bwd.fast_call(*bargs)

    def native():
        y = X * X * W
        torch.autograd.grad(y, (X, W), g)

    def through(f):
        def run():
            y = f(X, W)
            torch.autograd.grad(y, (X, W), g)
        return run

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, gy):
            return gy, gy

    # correctness of what is timed: all routes give the same gradients
    ref = torch.autograd.grad(X * X * W, (X, W), g)
    for f in filter(None, (f_ctypes, f_cpp)):
        got = torch.autograd.grad(f(X, W), (X, W), g)
        assert all(torch.allclose(a, b) for a, b in zip(got, ref)), "dispatcher disagrees with torch"

    # the ctypes dispatcher's own code without the autograd engine: the generated per-signature
    # forward/backward (allocation, native call, bookkeeping on a plain object standing in for ctx)
    dispatcher = f_ctypes.autograd_function.dispatcher
    Xd, Wd = X.detach(), W.detach()
    f_ctypes(Xd, Wd)
    sig = dispatcher.signatures[(Xd.shape, Wd.shape)]

    class Ctx:
        needs_input_grad = (True, True)

        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

    def argument_path():
        ctx = Ctx()
        sig.forward(ctx, Xd, Wd)
        ctx.bwd(ctx, g)

    routes = {
        "fast_call (floor)": direct,
        "ctypes arg path (no autograd)": argument_path,
        "torch native ops": native,
        "empty Python Function": through(Empty.apply),
    }
    if empty_cpp is not None:
        routes["empty C++ Function"] = through(empty_cpp)
    routes["gradflow ctypes"] = through(f_ctypes)
    if f_cpp is not None:
        routes["gradflow cpp"] = through(f_cpp)
    results = measure(routes, args.calls, args.repeats)
    floor = results["fast_call (floor)"]
    empty = results["empty Python Function"]
    native_us = results["torch native ops"]
    print(f"forward+backward per call, N={n}, float64, torch {torch.__version__}, 1 thread, "
          f"median of {args.repeats} x {args.calls} calls")
    header = (f"{'route':<30} {'us/call':>8} {'x fast_call':>11} {'x torch':>8} {'added':>8} "
              f"{'added over fast_call + empty Function':>38}")
    print(header)
    print("-" * len(header))
    for name, us in results.items():
        beyond = f"{us - floor - empty:+.2f}" if name.startswith("gradflow") else ""
        print(f"{name:<30} {us:8.2f} {us / floor:11.2f} {us / native_us:8.2f} {us - floor:+8.2f} {beyond:>38}")
    print()
    print(f"added = route - fast_call ({floor:.2f} us); added over fast_call + empty Function = route - fast_call"
          f" - empty Python Function ({empty:.2f} us: torch's autograd machinery alone).")
    for name in ("gradflow ctypes", "gradflow cpp"):
        if name in results:
            added, beyond = results[name] - floor, results[name] - floor - empty
            print(f"{name}: {added:+.2f} us over fast_call ({'meets' if added <= TARGET_US else 'misses'} the "
                  f"<= {TARGET_US:g} us target measured that way), {beyond:+.2f} us over fast_call + an empty "
                  f"Python Function ({'meets' if beyond <= TARGET_US else 'misses'} it measured that way)")


if __name__ == "__main__":
    main()
