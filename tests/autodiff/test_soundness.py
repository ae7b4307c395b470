"""Programs written the way users write them that once got silently wrong gradients (an accumulator reading
its own target in a loop made a map; a float-to-integer conversion differentiated as the identity) or were
refused after being differentiated before (strided in-place loops, a triangular recurrence), and one the
fuzzer found (two in-place updates of one element per iteration under RECOMPUTE_ALL). Each is checked
against `torch.autograd` in float64 on every route a user takes: `grad` and the split `vjp`, STORE_ALL and
RECOMPUTE_ALL, optimized and not. One build per route (content cache); hypothesis varies the data.
"""

from __future__ import annotations

import copy

import dace
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.analysis.dependence import loop_independence
from gradflow.verify.routes import gradient

N = dace.symbol("N")
RTOL = 1e-10


@dace.program
def ema(x: dace.float64[N], S: dace.float64[1]):
    m = np.zeros([1], dtype=np.float64)
    for i in range(N):
        m[0] += 0.5 * (x[i] - m[0])
    S[0] = m[0]


def t_ema(x, S):
    m = torch.zeros((), dtype=torch.float64)
    for i in range(x.shape[0]):
        m = m + 0.5 * (x[i] - m)
    return m


@dace.program
def transient_accumulator(x: dace.float64[4], S: dace.float64[1]):
    t = np.zeros([1], dtype=np.float64)
    for i in range(4):
        t[0] += t[0] * 0.1 + x[i] ** 3
    S[0] = t[0]


def t_transient_accumulator(x, S):
    t = torch.zeros((), dtype=torch.float64)
    for i in range(4):
        t = t + t * 0.1 + x[i] ** 3
    return t


@dace.program
def output_accumulator(x: dace.float64[4], S: dace.float64[1]):
    for i in range(4):
        S[0] += S[0] * 0.1 + x[i] ** 3


def t_output_accumulator(x, S):
    s = S[0]
    for i in range(4):
        s = s + s * 0.1 + x[i] ** 3
    return s


@dace.program
def float_to_int(A: dace.float64[N], S: dace.float64[1]):
    B = np.zeros((N,), dtype=np.int64)
    B[:] = A * 10.0
    S[0] = np.sum(B * A)


def t_float_to_int(A, S):
    return (torch.trunc(A * 10.0).detach() * A).sum()


@dace.program
def strided_step2(A: dace.float64[9], B: dace.float64[9], S: dace.float64[1]):
    for i in range(0, 8, 2):
        A[i + 1] = A[i] * B[i] + np.sin(A[i + 1])
    S[0] = np.sum(A * A)


@dace.program
def strided_step2_odd_end(A: dace.float64[9], B: dace.float64[9], S: dace.float64[1]):
    for i in range(0, 7, 2):
        A[i + 1] = A[i] * B[i] + np.sin(A[i + 1])
    S[0] = np.sum(A * A)


@dace.program
def strided_step3(A: dace.float64[11], B: dace.float64[11], S: dace.float64[1]):
    for i in range(1, 10, 3):
        A[i + 1] = A[i] * B[i] + np.sin(A[i + 1])
    S[0] = np.sum(A * A)


def _t_strided(start, stop, step):
    def fn(A, B, S):
        a = list(A)
        for i in range(start, stop, step):
            a[i + 1] = a[i] * B[i] + torch.sin(a[i + 1])
        return sum(v * v for v in a)
    return fn


@dace.program
def triangular_recurrence(A: dace.float64[N], B: dace.float64[N, N], S: dace.float64[1]):
    for i in range(N):
        for j in range(i):
            A[i] += A[j] * B[i, j]
    S[0] = np.sum(A * A)


def t_triangular_recurrence(A, B, S):
    a = list(A)
    for i in range(A.shape[0]):
        for j in range(i):
            a[i] = a[i] + a[j] * B[i, j]
    return sum(v * v for v in a)


@dace.program
def chained_update(x: dace.float64[N], S: dace.float64[1]):
    for i in range(0, N - 1):
        S[0] = S[0] * x[N - 3]
        S[0] = S[0] * x[N - 3]


def t_chained_update(x, S):
    s = S[0]
    for _ in range(x.shape[0] - 1):
        s = s * x[-3]
        s = s * x[-3]
    return s


def _normal(rng, shape, scale=1.0):
    return rng.normal(size=shape) * scale


#: name -> (program, torch reference, wrt, inputs(rng), symbols)
CASES = {
    "ema": (ema, t_ema, ("x",), lambda r: {"x": _normal(r, 6)}, {"N": 6}),
    "transient_accumulator": (transient_accumulator, t_transient_accumulator, ("x",),
                              lambda r: {"x": _normal(r, 4, 0.7)}, {}),
    "output_accumulator": (output_accumulator, t_output_accumulator, ("x", "S"),
                           lambda r: {"x": _normal(r, 4, 0.7), "S": _normal(r, 1)}, {}),
    # values away from the integers' jumps (x * 10 at least 0.05 from an integer)
    "float_to_int": (float_to_int, t_float_to_int, ("A",),
                     lambda r: {"A": (r.integers(-30, 30, 7) + r.uniform(0.05, 0.95, 7)) / 10.0}, {"N": 7}),
    "strided_step2": (strided_step2, _t_strided(0, 8, 2), ("A", "B"),
                      lambda r: {"A": _normal(r, 9), "B": _normal(r, 9)}, {}),
    "strided_step2_odd_end": (strided_step2_odd_end, _t_strided(0, 7, 2), ("A", "B"),
                              lambda r: {"A": _normal(r, 9), "B": _normal(r, 9)}, {}),
    "strided_step3": (strided_step3, _t_strided(1, 10, 3), ("A", "B"),
                      lambda r: {"A": _normal(r, 11), "B": _normal(r, 11)}, {}),
    # (fuzz seed 5755, program 88: RECOMPUTE_ALL rebuilt the second update's input from a value the tape
    # no longer restored, the first update's read of S, recomputed for the first update's own reverse)
    "chained_update": (chained_update, t_chained_update, ("x", "S"),
                       lambda r: {"x": r.uniform(0.5, 1.2, 6), "S": _normal(r, 1)}, {"N": 6}),
    "triangular_recurrence": (triangular_recurrence, t_triangular_recurrence, ("A", "B"),
                              lambda r: {"A": _normal(r, 6), "B": _normal(r, (6, 6), 0.4)}, {"N": 6}),
}


def _torch_reference(name: str, arrays: dict) -> tuple[float, dict[str, np.ndarray]]:
    _, fn, wrt, _, _ = CASES[name]
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in wrt) for k, v in arrays.items()}
    value = fn(**tensors)
    grads = torch.autograd.grad(value, [tensors[x] for x in wrt])
    return float(value), {x: g.numpy() for x, g in zip(wrt, grads)}


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "unoptimized"])
@pytest.mark.parametrize("policy", ["store_all", "recompute_all"])
@pytest.mark.parametrize("route", ["grad", "vjp"])
@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_gradient_matches_torch_on_every_route(name, route, policy, optimize, seed) -> None:
    program, _, wrt, make, symbols = CASES[name]
    if route == "vjp":  # vjp names a gradient and a cotangent alike: of is no wrt there
        wrt = tuple(x for x in wrt if x != "S")
    rng = np.random.default_rng(seed)
    arrays = {**make(rng)}
    arrays.setdefault("S", np.zeros(1))
    forwarding = gradflow.STORE_ALL if policy == "store_all" else gradflow.RECOMPUTE_ALL
    after, grads = gradient(program, wrt, "S", arrays, symbols, route=route, forwarding=forwarding,
                            optimize=optimize)
    value, expected = _torch_reference(name, arrays)
    np.testing.assert_allclose(after["S"][0], value, rtol=RTOL)
    for x in wrt:
        np.testing.assert_allclose(grads[x], expected[x], rtol=RTOL, atol=1e-13, err_msg=f"d S / d {x}")


def _loops(sdfg):
    return [b for b in sdfg.all_control_flow_regions(recursive=True) if isinstance(b, dace.sdfg.state.LoopRegion)]


def test_triangular_recurrence_forward_stays_a_loop_and_is_right_on_two_threads() -> None:
    """Iteration i reads A[j], which iteration j summed into: the outer loop is no map in the optimized
    forward program (the inner one may be), and two OpenMP threads compute what numpy does."""
    graph = gradflow.optimize.optimized(triangular_recurrence)
    outer = [loop for loop in _loops(graph.sdfg) if loop.loop_variable == "i"]
    assert len(outer) == 1, "the loop over i must stay a loop"
    script = (
        "import numpy as np, gradflow, sys\n"
        "from gradflow.runtime.compile import compile_sdfg\n"
        "from gradflow.optimize import optimized\n"
        "sys.path.insert(0, %r)\n"
        "from test_soundness import triangular_recurrence\n"
        "n = 300\n"
        "rng = np.random.default_rng(3)\n"
        "A = rng.normal(size=n); B = rng.normal(size=(n, n)) * (0.5 / n)\n"
        "ref = A.copy()\n"
        "for i in range(n):\n"
        "    ref[i] += ref[:i] @ B[i, :i]\n"
        "got = A.copy(); S = np.zeros(1)\n"
        "compile_sdfg(optimized(triangular_recurrence))(A=got, B=B, S=S, N=n)\n"
        "np.testing.assert_allclose(got, ref, rtol=1e-12)\n"
        "np.testing.assert_allclose(S[0], np.sum(ref * ref), rtol=1e-12)\n"
    ) % str(__import__("pathlib").Path(__file__).parent)
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _normalized_loops(program):
    """The loops of `program` as `loops_to_maps` sees them (the normalization steps before it applied)."""
    from gradflow.autodiff.normalize import NORMALIZE
    from gradflow.transforms.parallel_loops import _sums_in_loops
    from gradflow.core.graph import Graph

    graph = Graph.of(program)
    for step in NORMALIZE.steps:
        if step.name == "loops_to_maps":
            break
        graph = step(graph).unwrap()
    sdfg = copy.deepcopy(graph.sdfg)
    _sums_in_loops(sdfg)
    return {loop.loop_variable: loop for loop in _loops(sdfg)}


@pytest.mark.parametrize("name, var, independent, names", [
    ("ema", "i", False, "'m' (sum in one iteration, read in another)"),
    ("output_accumulator", "i", False, "'S' (sum in one iteration, read in another)"),
    ("strided_step2", "i", True, None),  # A[i + 1] written, A[i] read: i + 1 is never another iteration's i
    ("triangular_recurrence", "j", True, None),  # A[i] summed into, A[j < i] read
])
def test_dependence_verdicts(name, var, independent, names) -> None:
    verdict = loop_independence(_normalized_loops(CASES[name][0])[var])
    assert verdict.independent == independent, verdict.describe()
    if names is not None:
        assert names in verdict.describe()


@dace.program
def shifted_view_update(x: dace.float64[N], S: dace.float64[1]):
    t = x[1:]
    t[:] -= x[:N - 1]  # numpy reads the old x (it buffers the overlap); DaCe's map reads what others overwrote
    S[0] = np.sum(x * x)


def test_a_racing_update_is_refused_naming_its_line() -> None:
    import inspect

    lines, first = inspect.getsourcelines(shifted_view_update.f)
    line = first + next(k for k, text in enumerate(lines) if "t[:] -=" in text)
    with pytest.raises(gradflow.NotDifferentiableError,
                       match=rf"^line {line} \(.*the map reads 'x' and overwrites elements of 'x'; iterations would race"):
        gradflow.grad(shifted_view_update, wrt="x", of="S")


@dace.program
def copied_rows(a: dace.float64[N, 4]):
    for i in range(1, N):
        a[i, :] = a[i - 1, :]  # one copy edge within `a`: its write is a[i, :], its read a[i - 1, :]


def test_a_copy_within_one_array_reads_and_writes_its_own_rows() -> None:
    """A copy between two access nodes of one array names the array at both ends (`subset` and
    `other_subset`): the dependence test took the written end's subset for the read too, so the row
    recurrence above read as independent iterations (and `gather_element_maps` swapped the boundary copies
    of nb_cavity_flow's pressure loop, `p[:, -1] = p[:, -2]` and `p[-1, :] = 0`)."""
    from dace.sdfg.state import LoopRegion

    from gradflow.analysis.dependence import body_accesses

    (loop,) = [r for r in copied_rows.to_sdfg(simplify=True).all_control_flow_regions() if isinstance(r, LoopRegion)]
    accesses = {a.kind: a.subset for a in body_accesses(loop.nodes()[0])}
    assert accesses == {"read": "i - 1, 0:4", "write": "i, 0:4"}
    verdict = loop_independence(loop)
    assert not verdict.independent and "'a' (write in one iteration, read in another)" in verdict.describe()
