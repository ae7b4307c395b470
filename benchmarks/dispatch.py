"""Per-call overhead of forward+backward through gradflow's torch dispatchers.

One run measures, on the same small elementwise program (Y = X * X * W, the forward saves T = X * X), the
time of one forward + one backward:

  fast_call   the two compiled SDFGs called directly with `CompiledSDFG.fast_call` and prebuilt arguments
              (no allocation, no validation, no autograd): the floor
  torch       the equivalent native torch ops (`X * X * W`, eager autograd)
  ctypes      gradflow.torch.function(..., dispatcher="ctypes")
  cpp         gradflow.torch.function(..., dispatcher="cpp")   (generated C++ torch extension)
  noop        an empty Python torch.autograd.Function (allocates its output, backward returns the
              cotangent): the cost of torch's autograd machinery alone, for reference
  arg path    the ctypes dispatcher's generated per-signature forward/backward (allocation + native
              call) without autograd: what the fast path itself costs

Each forward+backward is `y = f(X, W); torch.autograd.grad(y, (X, W), g)`. "added" is the dispatcher's
time minus fast_call's; the last column also subtracts the noop Function. Figures are medians over
repeats (routes interleaved) of mean per-call times.

    OMP_NUM_THREADS=1 python benchmarks/dispatch.py [--n 16] [--calls 2000] [--repeats 15] [--no-cpp]
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--no-cpp", action="store_true", help="skip the C++ extension (slow first build)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.n
    vjp = programs.square_mul(name="bench_sqmul")
    f_ctypes = gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="ctypes")
    f_cpp = None if args.no_cpp else gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="cpp")

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

    class Noop(torch.autograd.Function):
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

    # the ctypes dispatcher's own call path without the autograd engine: the generated per-signature
    # forward/backward (allocation + native call) after the same acceptance test the Function runs
    dispatcher = f_ctypes.autograd_function.dispatcher
    Xd, Wd = X.detach(), W.detach()
    f_ctypes(Xd, Wd)
    sig = dispatcher.signatures[(Xd.shape, Wd.shape)]

    def argument_path():
        outs, extras = sig.forward(Xd, Wd)
        sig.backward(Xd, Wd, extras[0], g)

    routes = {
        "fast_call": direct,
        "ctypes argument path (no autograd)": argument_path,
        "torch native ops": native,
        "noop autograd.Function": through(Noop.apply),
        "gradflow ctypes": through(f_ctypes),
    }
    if f_cpp is not None:
        routes["gradflow cpp extension"] = through(f_cpp)
    results = measure(routes, args.calls, args.repeats)
    floor = results["fast_call"]
    machinery = results["noop autograd.Function"]
    print(f"forward+backward per call, N={n}, float64, torch {torch.__version__}, 1 thread, "
          f"median of {args.repeats} x {args.calls} calls")
    print(f"{'route':<38} {'us/call':>8} {'vs fast_call':>13} {'vs fast_call+noop Function':>27}")
    for name, us in results.items():
        extra = f"{us - floor - machinery:+.2f}" if name.startswith("gradflow") else ""
        print(f"{name:<38} {us:8.2f} {us - floor:+13.2f} {extra:>27}")
    print("(a Python autograd.Function plus torch.autograd.grad costs the 'noop autograd.Function' row "
          "by itself; the last column is what gradflow adds beyond that machinery and the kernels)")


if __name__ == "__main__":
    main()
