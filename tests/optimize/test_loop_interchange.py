"""`move_loops_into_maps`: a matrix built a column at a time in a loop (`P[:, j] = P[:, j - 1] * t`) is built
a row at a time by a map around the loop; a loop whose map points read each other's rows, or whose map walks
the contiguous dimension itself, keeps its shape. Values equal numpy's (one build each, hypothesis data);
the optimized gradient of such a loop equals torch's."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE, optimized
from gradflow.optimize.loop_interchange import interchangeable
from gradflow.runtime.compile import compile_sdfg

N, M = dace.symbol("N"), dace.symbol("M")


@dace.program
def powers(t: dace.float64[N], x: dace.float64[M], out: dace.float64[N]):
    P = np.ndarray([N, M], dtype=np.float64)
    P[:, 0] = 1.0
    for j in range(1, M):
        P[:, j] = P[:, j - 1] * t
    out[:] = P @ x


def powers_numpy(t, x):
    return (t[:, None] ** np.arange(len(x))[None, :]) @ x


@dace.program
def shifted(t: dace.float64[N], P: dace.float64[N, M]):
    for j in range(1, M):
        P[1:, j] = P[:N - 1, j - 1] * t[1:]  # a point reads the row above, which another point writes


def shifted_numpy(t, P):
    for j in range(1, P.shape[1]):
        P[1:, j] = P[:-1, j - 1] * t[1:]
    return P


@dace.program
def rescaled(A: dace.float64[N, M]):
    for _ in range(3):
        A[:] = 0.5 * A + 1.0  # the map walks the rows itself: nothing to gain


def _loops_in_maps(graph: Graph) -> int:
    """Loops that lie in a nested SDFG inside a map."""
    count = 0
    for node, state in graph.sdfg.all_nodes_recursive():
        if isinstance(node, nd.NestedSDFG) and state.entry_node(node) is not None:
            count += sum(isinstance(r, LoopRegion) for r in node.sdfg.all_control_flow_regions())
    return count


def _interchangeable(graph: Graph) -> int:
    return sum(isinstance(r, LoopRegion) and interchangeable(r)
               for sdfg in graph.sdfg.all_sdfgs_recursive() for r in sdfg.all_control_flow_regions())


def before_interchange(program) -> Graph:
    """`program` through the passes of `OPTIMIZE` that come before `move_loops_into_maps`."""
    names = [step.name for step in OPTIMIZE.steps]
    return optimized(Graph.of(program), Pipeline(OPTIMIZE.steps[:names.index("move_loops_into_maps")]))


def test_the_column_loop_becomes_a_loop_inside_the_row_map() -> None:
    before = before_interchange(powers)
    after = optimized(Graph.of(powers))
    assert (_interchangeable(before), _loops_in_maps(before)) == (1, 0)
    assert (_interchangeable(after), _loops_in_maps(after)) == (0, 1)


_POWERS = None


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_the_interchanged_loop_computes_numpys_powers(n: int, m: int, seed: int) -> None:
    global _POWERS
    if _POWERS is None:
        _POWERS = compile_sdfg(optimized(Graph.of(powers)).sdfg)
    rng = np.random.default_rng(seed)
    t, x, out = rng.uniform(-1.5, 1.5, n), rng.normal(size=m), np.zeros(n)
    _POWERS(t=t, x=x, out=out, N=n, M=m)
    np.testing.assert_allclose(out, powers_numpy(t, x), rtol=1e-12, atol=1e-12)


def test_points_that_read_each_others_rows_keep_the_loop_outside() -> None:
    graph = optimized(Graph.of(shifted))
    loops = [r for r in graph.sdfg.all_control_flow_regions() if isinstance(r, LoopRegion)]
    assert loops and not any(interchangeable(r) for r in loops) and _loops_in_maps(graph) == 0
    rng = np.random.default_rng(3)
    t, P = rng.normal(size=7), rng.normal(size=(7, 5))
    got = P.copy()
    compile_sdfg(graph.sdfg)(t=t, P=got, N=7, M=5)
    np.testing.assert_allclose(got, shifted_numpy(t, P.copy()), rtol=1e-13)


def test_a_map_that_walks_the_rows_itself_keeps_its_loop() -> None:
    before = before_interchange(rescaled)
    assert _interchangeable(before) == 0
    assert _loops_in_maps(optimized(Graph.of(rescaled))) == 0


@dace.program
def weighted_powers(t: dace.float64[N], W: dace.float64[N, M], S: dace.float64[1]):
    P = np.ndarray([N, M], dtype=np.float64)
    P[:, 0] = 1.0
    for j in range(1, M):
        P[:, j] = P[:, j - 1] * t
    S[0] = np.sum(P * W)


def test_the_gradient_of_a_column_loop_equals_torchs() -> None:
    """Through the whole of `OPTIMIZE` (the new pass included). The gradient's loop keeps its shape: with
    t active, its body also stores each column on a tape (a gradient whose loop has no tape is interchanged:
    `tests/optimize/test_copy_states.py`)."""
    rng = np.random.default_rng(5)
    n, m = 9, 6
    t, W = rng.uniform(-1.2, 1.2, n), rng.normal(size=(n, m))
    value, grad_t = gradflow.value_and_grad(weighted_powers, wrt="t", of="S")(t=t.copy(), W=W, N=n, M=m)

    tt = torch.tensor(t, requires_grad=True)
    columns = [torch.ones(n, dtype=torch.float64)]
    for _ in range(1, m):
        columns.append(columns[-1] * tt)
    total = (torch.stack(columns, dim=1) * torch.tensor(W)).sum()
    total.backward()
    np.testing.assert_allclose(value, total.item(), rtol=1e-12)
    np.testing.assert_allclose(grad_t, tt.grad.numpy(), rtol=1e-11)


# Other ways users write column loops: two columns back (two maps fused, with a temporary per iteration),
# every other column (a step of 2: DaCe's rewrite takes unit steps only), a descending loop of two maps, a
# trip count passed as an argument over every other row (a strided copy stays). Each is compiled once and
# compared with numpy; `INTERCHANGED` says which of them the pass rewrites.
@dace.program
def two_columns_back(t: dace.float64[N], P: dace.float64[N, M]):
    for j in range(2, M):
        P[:, j] = P[:, j - 2] * t + P[:, j - 1]


def two_columns_back_numpy(t, P):
    for j in range(2, P.shape[1]):
        P[:, j] = P[:, j - 2] * t + P[:, j - 1]
    return P


@dace.program
def every_other_column(t: dace.float64[N], P: dace.float64[N, M]):
    for j in range(2, M, 2):
        P[:, j] = P[:, j - 2] * t + P[:, j - 1]


def every_other_column_numpy(t, P):
    for j in range(2, P.shape[1], 2):
        P[:, j] = P[:, j - 2] * t + P[:, j - 1]
    return P


@dace.program
def right_to_left(t: dace.float64[N], P: dace.float64[N, M]):
    for j in range(M - 2, -1, -1):
        P[:, j] = np.sin(P[:, j + 1]) * t


def right_to_left_numpy(t, P):
    for j in range(P.shape[1] - 2, -1, -1):
        P[:, j] = np.sin(P[:, j + 1]) * t
    return P


@dace.program
def counted_rows(t: dace.float64[N], P: dace.float64[N, M], K: dace.int64):
    for j in range(1, K):
        P[::2, j] = P[::2, j - 1] * t[::2]


def counted_rows_numpy(t, P, K):
    for j in range(1, K):
        P[::2, j] = P[::2, j - 1] * t[::2]
    return P


STYLES = {"two_columns_back": (two_columns_back, two_columns_back_numpy, {}),
          "every_other_column": (every_other_column, every_other_column_numpy, {}),
          "right_to_left": (right_to_left, right_to_left_numpy, {}),
          "counted_rows": (counted_rows, counted_rows_numpy, {"K": 5})}
INTERCHANGED = {"two_columns_back"}


@pytest.mark.parametrize("name", sorted(STYLES))
def test_column_loops_of_other_styles_keep_their_values(name: str) -> None:
    program, twin, extra = STYLES[name]
    graph = optimized(Graph.of(program))
    assert _loops_in_maps(graph) == (name in INTERCHANGED)
    rng = np.random.default_rng(len(name))
    t, P = rng.uniform(-1.2, 1.2, 9), rng.normal(size=(9, 7))
    got = P.copy()
    compile_sdfg(graph.sdfg)(t=t, P=got, N=9, M=7, **extra)
    np.testing.assert_allclose(got, twin(t, P.copy(), **extra), rtol=1e-13, atol=1e-14)


@dace.program
def last_column_read(t: dace.float64[N], P: dace.float64[N, M], out: dace.float64[1]):
    for j in range(1, M):
        P[:, j] = P[:, j - 1] * t
    out[0] = P[0, j]  # the loop variable after the loop: set only inside the map once interchanged


def test_a_loop_whose_variable_is_read_after_it_keeps_its_shape() -> None:
    # (no value check: DaCe's own forward leaves j one step past Python's last value, j = M)
    before = before_interchange(last_column_read)
    loops = [r for r in before.sdfg.all_control_flow_regions() if isinstance(r, LoopRegion)]
    assert len(loops) == 1 and interchangeable_but_for_the_variable(loops[0])
    assert _loops_in_maps(optimized(Graph.of(last_column_read))) == 0


def interchangeable_but_for_the_variable(loop: LoopRegion) -> bool:
    """`interchangeable` with the read of the variable after the loop ignored: the refusal has that cause."""
    from gradflow.optimize import loop_interchange

    saved = loop_interchange._read_after
    loop_interchange._read_after = lambda loop, var: False
    try:
        return loop_interchange.interchangeable(loop) and saved(loop, loop.loop_variable)
    finally:
        loop_interchange._read_after = saved
