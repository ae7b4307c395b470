"""Checks of forward mode and second order against PyTorch: the tangent of a corpus case's `of` along a
random direction against `torch.func.jvp` of its torch reference (and against central differences of the
tangent program's own values along it, where the program is smooth there), and Hessian-vector products against
`torch.func.jvp` of `torch.func.grad` (forward over reverse in torch too), and the gradient of a gradient
program against torch's double backward. Float64, the tolerances of the
other program checks. Programs (dataflow and loop corpora) and library cases (`corpus/library.py`, at
drawn sizes) both report the tangent rules their builds applied (`rules_used`), which `gradflow verify`
counts per rule."""

from __future__ import annotations

from typing import Any, Mapping

import dace
import numpy as np
import torch

from gradflow.core.graph import parse
from gradflow.verify.compare import agree
from gradflow.verify.corpus.case import Case, to_tensors
from gradflow.verify.programs import ATOL, RTOL, forwarding_of

#: corpus programs forward mode refuses, with the message: write-conflict maxima written as maps (not `np.max`)
REFUSED = {
    "df_softmax_wcr": "write-conflict resolution",
}


def direction(case: Case, inputs: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """A random tangent for every `wrt` array of `case` (standard normal, drawn from `seed`)."""
    rng = np.random.default_rng(seed + 7919)
    return {x: rng.standard_normal(np.shape(inputs[x])) for x in case.wrt}


def _torch_of(case: Case, inputs: Mapping[str, np.ndarray]):
    """(the torch reference as a function of the `wrt` tensors, those tensors)."""
    tensors = to_tensors(inputs)

    def f(*xs: torch.Tensor) -> torch.Tensor:
        return case.torch_fn(**{**tensors, **dict(zip(case.wrt, xs))}).reshape(())

    return f, tuple(tensors[x] for x in case.wrt)


def torch_jvp(case: Case, inputs: Mapping[str, np.ndarray], tangents: Mapping[str, np.ndarray]) -> float:
    f, primals = _torch_of(case, inputs)
    return float(torch.func.jvp(f, primals, tuple(torch.tensor(tangents[x]) for x in case.wrt))[1])


def torch_hvp(case: Case, inputs: Mapping[str, np.ndarray], tangents: Mapping[str, np.ndarray]) -> dict:
    f, primals = _torch_of(case, inputs)
    grad = torch.func.grad(f, argnums=tuple(range(len(primals))))
    _, out = torch.func.jvp(grad, primals, tuple(torch.tensor(tangents[x]) for x in case.wrt))
    return {x: t.detach().numpy() for x, t in zip(case.wrt, out)}


def torch_double_backward(case: Case, inputs: Mapping[str, np.ndarray],
                          cotangents: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """torch's double backward: the gradient of `sum(w * grad)` over the `wrt` gradients (built with
    `create_graph=True`), `w` the `cotangents`; a gradient torch finds constant contributes nothing."""
    f, primals = _torch_of(case, inputs)
    xs = tuple(p.detach().clone().requires_grad_(True) for p in primals)
    first = torch.autograd.grad(f(*xs), xs, create_graph=True)
    varied = [k for k, g in enumerate(first) if g.requires_grad]
    second = torch.autograd.grad([first[k] for k in varied], xs, allow_unused=True,
                                 grad_outputs=[torch.tensor(cotangents[case.wrt[k]]) for k in varied]) \
        if varied else (None,) * len(xs)
    return {x: np.zeros(np.shape(inputs[x])) if t is None else t.detach().numpy() for x, t in zip(case.wrt, second)}


def _arguments(case: Case, inputs: Mapping[str, np.ndarray], program_symbols) -> dict[str, Any]:
    arrays: dict[str, Any] = {k: np.array(v, copy=True) for k, v in inputs.items()}
    arrays.update({k: v for k, v in case.symbols.items() if k in program_symbols})
    return arrays


_BUILT: dict[tuple[str, str], Any] = {}


def _built(case: Case, kind: str):
    """The built function of `case` (one build per case name and kind in a process; the jvp's tangent
    program is the one `rules_used` reports on)."""
    from gradflow.api import grad_graph, vjp
    from gradflow.forward import ValueAndJVP, _Call, hvp

    key = (case.name, kind)
    if key not in _BUILT:
        if kind == "jvp":
            graph = _graph(case.name, lambda: case.to_sdfg(), tuple(case.wrt), case.of)
            _BUILT[key] = ValueAndJVP(_Call(graph, tuple(case.wrt)), [case.of])
        elif kind == "hvp":
            _BUILT[key] = hvp(case.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=forwarding_of(case))
        else:  # grad_of_grad: the split vjp of the gradient program, and its gradients' names
            gradient = grad_graph(case.to_sdfg(), list(case.wrt), case.of, forwarding=forwarding_of(case),
                                  optimize=False)
            grads = gradient.meta["ad"].grads
            _BUILT[key] = (vjp(gradient.sdfg, wrt=list(case.wrt), of=[grads[x] for x in case.wrt], prefix=None),
                           grads)
    return _BUILT[key]


#: central differences: step (times the inputs' scale) and the agreement of steps h and 2h below which the
#: program counts as smooth along the direction (Richardson: the error at h is then about a third of it)
FD_STEP, FD_SMOOTH, FD_RTOL = 1e-5, 1e-6, 1e-5


def central_difference(value_at, inputs: Mapping[str, np.ndarray],
                       tangents: Mapping[str, np.ndarray]) -> tuple[float, float] | None:
    """(d value / d t of `value_at(inputs + t * tangents)` at 0 by central differences, the absolute error
    rounding allows it), or None where steps h and 2h disagree (a kink or a jump along the direction: a
    tie of `max`, a branch)."""
    scale = max([1.0] + [float(np.max(np.abs(inputs[x]), initial=0.0)) for x in tangents])
    h = FD_STEP * scale
    values = {}

    def moved(step: float) -> float:
        values[step] = value_at({**inputs, **{x: np.asarray(inputs[x]) + step * t for x, t in tangents.items()}})
        return values[step]

    near = (moved(h) - moved(-h)) / (2 * h)
    far = (moved(2 * h) - moved(-2 * h)) / (4 * h)
    rounding = 64 * np.finfo(np.float64).eps * max(abs(v) for v in values.values()) / h
    if abs(near - far) > FD_SMOOTH * max(1.0, abs(near)) + rounding:
        return None
    return near, rounding


def check_jvp(case: Case, seed: int = 0) -> float:
    """`value_and_jvp` of `case` along a random direction against torch: the worst relative error of the
    value and the tangent, or `CheckFailure`."""
    f = _built(case, "jvp")
    inputs = case.inputs(seed)
    tangents = direction(case, inputs, seed)
    symbols = f.arguments
    value, tangent = f(**_arguments(case, inputs, symbols), **{f"tan_{x}": tangents[x] for x in case.wrt})
    f_torch, primals = _torch_of(case, inputs)
    with torch.no_grad():
        want_value = float(f_torch(*primals))
    worst = agree(np.asarray(value[case.of]).reshape(-1)[0], want_value, rtol=RTOL, atol=ATOL,
                  what=f"{case.name}: value of the tangent program")
    got = np.asarray(tangent[case.of]).reshape(-1)[0]
    worst = max(worst, agree(got, torch_jvp(case, inputs, tangents), rtol=RTOL, atol=ATOL,
                             what=f"{case.name}: tangent of {case.of}"))

    def value_at(moved: Mapping[str, np.ndarray]) -> float:
        out, _ = f(**_arguments(case, moved, symbols), **{f"tan_{x}": tangents[x] for x in case.wrt})
        return float(np.asarray(out[case.of]).reshape(-1)[0])

    fd = central_difference(value_at, inputs, tangents)
    if fd is not None:  # the tangent program's own values, differenced, agree with its tangent
        agree(got, fd[0], rtol=FD_RTOL, atol=FD_RTOL * 1e-2 + fd[1], what=f"{case.name}: tangent of {case.of} "
              "against central differences")
    return worst


def check_hvp(case: Case, seed: int = 0) -> float:
    """`hvp` of `case` along a random direction against torch (forward over reverse there too)."""
    f = _built(case, "hvp")
    inputs = case.inputs(seed)
    tangents = direction(case, inputs, seed)
    got = f(**_arguments(case, inputs, f.arguments), **{f"tan_{x}": tangents[x] for x in case.wrt})
    want = torch_hvp(case, inputs, tangents)
    return max(agree(got[x], want[x], rtol=RTOL, atol=ATOL, what=f"{case.name}: (H v) of {x}") for x in case.wrt)


def check_grad_of_grad(case: Case, seed: int = 0) -> float:
    """Reverse over reverse: `gradflow.vjp` of `case`'s gradient program (`grad`, built with
    `optimize=False`, tapes included) with a random cotangent on each gradient `grad_<x>`, against torch's
    double backward."""
    from gradflow.verify.routes import run_vjp

    built, grads = _built(case, "grad_of_grad")
    inputs = case.inputs(seed)
    cotangents = direction(case, inputs, seed)
    arrays, symbols = _arguments(case, inputs, ()), dict(case.symbols)
    for name, desc in built.forward.arrays.items():  # the gradients and flags the gradient program writes
        if not desc.transient and name not in arrays and name not in symbols and name not in built.saved:
            shape = tuple(int(dace.symbolic.evaluate(d, {dace.symbol(k): v for k, v in symbols.items()}))
                          for d in desc.shape)
            arrays[name] = np.zeros(shape, dtype=desc.dtype.as_numpy_dtype())
    _, got = run_vjp(built, arrays, symbols, {grads[x]: cotangents[x] for x in case.wrt})
    want = torch_double_backward(case, inputs, cotangents)
    return max(agree(got[x], want[x], rtol=RTOL, atol=ATOL, what=f"{case.name}: double backward of {x}")
               for x in case.wrt)


def rules_used(case: Case) -> tuple[str, ...]:
    """The tangent rules `jvp` applies to `case` (a build without compilation)."""
    return _graph(case.name, lambda: case.to_sdfg(), tuple(case.wrt), case.of).meta["tangent"].rules_used


_GRAPHS: dict[str, Any] = {}


def _graph(name: str, program, wrt: tuple[str, ...], of: str):
    from gradflow.forward import jvp_graph

    if name not in _GRAPHS:
        _GRAPHS[name] = jvp_graph(program(), list(wrt), [of])
    return _GRAPHS[name]


def library_rules_used(name: str) -> tuple[str, ...]:
    """The tangent rules `jvp` applies to library case `name`."""
    from gradflow.verify.corpus.library import CASES_BY_NAME

    case = CASES_BY_NAME[name]
    return _graph(f"library:{name}", lambda: parse(case.program), tuple(case.wrt),
                  "S").meta["tangent"].rules_used


def check_library_jvp(name: str, sizes: Mapping[str, int], seed: int) -> float:
    """The tangent of library case `name` at `sizes` along a random direction against `torch.func.jvp`."""
    from gradflow.runtime.invoke import Invoker
    from gradflow.verify.corpus.library import CASES_BY_NAME

    case = CASES_BY_NAME[name]
    graph = _graph(f"library:{name}", lambda: parse(case.program), tuple(case.wrt), "S")
    rng = np.random.default_rng(seed)
    inputs = case.make_inputs(rng, dict(sizes))
    tangents = {x: rng.standard_normal(np.shape(inputs[x])) for x in case.wrt}
    names = graph.meta["tangent"].arguments()
    arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
    arrays.setdefault("S", np.zeros(1))  # some cases accumulate into S
    arrays.update({names[x]: tangents[x].copy() for x in case.wrt})  # an in-place program overwrites its tangent
    taken = set(map(str, graph.sdfg.free_symbols))
    invoker, extents = Invoker(graph), {k: v for k, v in sizes.items() if k in taken}
    out, _ = invoker(**arrays, **extents)
    tensors = to_tensors(inputs)

    def f(*xs: torch.Tensor) -> torch.Tensor:
        return case.torch_fn(**{**tensors, **dict(zip(case.wrt, xs))}).reshape(())

    want = torch.func.jvp(f, tuple(tensors[x] for x in case.wrt), tuple(torch.tensor(tangents[x]) for x in case.wrt))
    got = np.asarray(out[names["S"]]).reshape(-1)[0]
    worst = agree(got, float(want[1]), rtol=RTOL, atol=ATOL, what=f"{name}: tangent of S at sizes {dict(sizes)}")

    def value_at(moved: Mapping[str, np.ndarray]) -> float:
        given = {k: np.array(v, copy=True) for k, v in moved.items()}
        given.setdefault("S", np.zeros(1))
        given.update({names[x]: tangents[x].copy() for x in case.wrt})
        after, _ = invoker(**given, **extents)
        return float(np.asarray(after["S"]).reshape(-1)[0])

    fd = central_difference(value_at, inputs, tangents)
    if fd is not None:
        agree(got, fd[0], rtol=FD_RTOL, atol=FD_RTOL * 1e-2 + fd[1],
              what=f"{name}: tangent of S against central differences")
    return worst
