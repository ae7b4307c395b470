"""`write_in_place`: a time step `y[:] = y + h * k` (DaCe: a map into a temporary `y_slice`, then a copy into
`y`), in one or two dimensions, writes `y` directly; a map that reads other elements of the array, or
whose array is read by a node not ordered before it, keeps its temporary. Values equal numpy's on
hypothesis data (one build each)."""

from __future__ import annotations

import dace
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE, WriteInPlace, optimized
from gradflow.optimize.in_place import match_at
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


@dace.program
def euler(x: dace.float64[N], y: dace.float64[N]):
    k = np.ndarray([N], dtype=np.float64)
    for _ in range(3):
        k[0] = x[0]
        k[1:] = x[1:] * y[:-1]
        y[:] = y + 0.1 * k


def euler_numpy(x, y):
    for _ in range(3):
        k = np.empty_like(y)
        k[0] = x[0]
        k[1:] = x[1:] * y[:-1]
        y = y + 0.1 * k
    return y


@dace.program
def damping(A: dace.float64[N, N], B: dace.float64[N, N]):
    for _ in range(2):
        A[:, :] = A + 0.1 * np.tanh(B) * A


def damping_numpy(A, B):
    for _ in range(2):
        A = A + 0.1 * np.tanh(B) * A
    return A


@dace.program
def smoothing(y: dace.float64[N]):
    for _ in range(3):
        y[1:N - 1] = y[1:N - 1] + 0.5 * (y[:N - 2] + y[2:])


def smoothing_numpy(y):
    for _ in range(3):
        y[1:-1] = y[1:-1] + 0.5 * (y[:-2] + y[2:])
    return y


def _transients(sdfg: dace.SDFG) -> set[str]:
    return {name for name, desc in sdfg.arrays.items() if desc.transient and desc.total_size != 1}


#: the pipeline the temporaries are compared under: `tile_element_chains` decides which states
#: `version_by_size` copies, and so which copies' temporaries get a name of their own
UNTILED = OPTIMIZE.without("tile_element_chains")


def _without_in_place(graph: Graph) -> dace.SDFG:
    return optimized(graph, UNTILED.without("write_in_place")).sdfg


def _euler_data(rng, n):
    return {"x": rng.standard_normal(n), "y": rng.standard_normal(n)}


def _damping_data(rng, n):
    return {"A": rng.standard_normal((n, n)), "B": rng.standard_normal((n, n))}


#: name -> (program, its numpy twin, the array it updates, its temporary, data of size n)
STEPS = {"euler": (euler, euler_numpy, "y", "y_slice", _euler_data),
         "damping": (damping, damping_numpy, "A", "A_slice", _damping_data)}


@pytest.fixture(scope="module", params=sorted(STEPS))
def step_built(request):
    graph = Graph.of(STEPS[request.param][0])
    after = optimized(graph, UNTILED).sdfg
    return request.param, _without_in_place(graph), after, compile_sdfg(optimized(graph).sdfg)


def test_the_time_step_writes_its_array_directly(step_built):
    name, before, after, _ = step_built
    gone = _transients(before) - _transients(after)
    assert gone and all(g.startswith(STEPS[name][3]) for g in gone), gone


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 7), st.integers(0, 2**32 - 1))
def test_the_time_step_keeps_its_values(step_built, n, seed):
    name, _, _, run = step_built
    _, twin, updated, _, data = STEPS[name]
    arrays = data(np.random.default_rng(seed), n)
    want = twin(**{k: v.copy() for k, v in arrays.items()})
    run(**arrays, N=n)
    np.testing.assert_allclose(arrays[updated], want, rtol=1e-13, atol=1e-13)


@pytest.fixture(scope="module")
def smoothing_built():
    graph = Graph.of(smoothing)
    after = optimized(graph, UNTILED).sdfg
    return _without_in_place(graph), after, compile_sdfg(optimized(graph).sdfg)


def test_a_map_reading_its_neighbours_keeps_its_temporary(smoothing_built):
    before, after, _ = smoothing_built
    assert _transients(before), "no temporary to keep: the test no longer tests the refusal"
    assert _transients(after) == _transients(before)


@settings(max_examples=10, deadline=None)
@given(st.integers(3, 9), st.integers(0, 2**32 - 1))
def test_a_map_reading_its_neighbours_keeps_its_values(smoothing_built, n, seed):
    y = np.random.default_rng(seed).standard_normal(n)
    want = smoothing_numpy(y.copy())
    smoothing_built[2](y=y, N=n)
    np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-13)


def _update_with(other_reader: bool, split_tasklets: bool) -> dace.SDFG:
    """y <- y + 1 through a temporary and a copy, built directly. `other_reader`: another map reads the old
    y beside it (b = 2 y, not ordered before the update, nor before the copy); `split_tasklets`: the
    update's map also reads y in a second tasklet (b = 2 y) that nothing orders before the one that writes
    the temporary."""
    sdfg = dace.SDFG(f"update_{int(other_reader)}{int(split_tasklets)}")
    sdfg.add_array("y", [N], dace.float64)
    sdfg.add_array("b", [N], dace.float64)
    sdfg.add_transient("t", [N], dace.float64)
    state = sdfg.add_state()
    y_old, t, y_new = state.add_read("y"), state.add_access("t"), state.add_write("y")
    b = state.add_write("b") if other_reader or split_tasklets else None
    entry, exit_ = state.add_map("update", {"i": "0:N"})
    writer = state.add_tasklet("writer", {"a"}, {"o"}, "o = a + 1")
    state.add_memlet_path(y_old, entry, writer, dst_conn="a", memlet=dace.Memlet("y[i]"))
    state.add_memlet_path(writer, exit_, t, src_conn="o", memlet=dace.Memlet("t[i]"))
    if split_tasklets:
        reader = state.add_tasklet("reader", {"a"}, {"o"}, "o = 2 * a")
        state.add_memlet_path(y_old, entry, reader, dst_conn="a", memlet=dace.Memlet("y[i]"))
        state.add_memlet_path(reader, exit_, b, src_conn="o", memlet=dace.Memlet("b[i]"))
    state.add_nedge(t, y_new, dace.Memlet("t[0:N] -> [0:N]"))
    if other_reader:
        state.add_mapped_tasklet("double", {"i": "0:N"}, {"a": dace.Memlet("y[i]")}, "o = 2 * a",
                                 {"o": dace.Memlet("b[i]")}, input_nodes={"y": y_old}, output_nodes={"b": b},
                                 external_edges=True)
    sdfg.validate()
    return sdfg


@pytest.mark.parametrize("other_reader, split_tasklets, rewritten", [
    (False, False, True), (True, False, False), (False, True, False)])
def test_the_old_value_is_read_before_it_is_overwritten(other_reader, split_tasklets, rewritten):
    sdfg = _update_with(other_reader, split_tasklets)
    state = sdfg.start_block
    temp = next(n for n in state.data_nodes() if n.data == "t")
    assert (match_at(sdfg, state, temp) is not None) == rewritten
    out = WriteInPlace()(Graph.of(sdfg)).unwrap().sdfg
    assert ("t" not in out.arrays) == rewritten
    if other_reader:
        return  # DaCe orders nothing between `double` and the copy either: only the refusal is defined
    y = np.arange(5.0)
    b = np.zeros(5)
    compile_sdfg(out)(y=y, b=b, N=5)
    np.testing.assert_array_equal(y, np.arange(5.0) + 1)
    if split_tasklets:
        np.testing.assert_array_equal(b, 2 * np.arange(5.0))


@dace.program
def columns(t: dace.float64[N], P: dace.float64[N, 5]):
    for j in range(1, 5):
        P[:, j] = P[:, j - 1] * t


@dace.program
def columns_from_below(t: dace.float64[N], P: dace.float64[N, 5]):
    for j in range(1, 5):
        P[1:, j] = P[:N - 1, j] * t[1:]  # reads elements of the column it writes, a row apart


def _copied_back(sdfg: dace.SDFG) -> int:
    return sum(len(list(WriteInPlace().matches(sub))) for sub in sdfg.all_sdfgs_recursive())


def _before_in_place(program) -> Graph:
    """`program` through the passes of `OPTIMIZE` before `write_in_place`."""
    names = [step.name for step in OPTIMIZE.steps]
    return optimized(Graph.of(program), Pipeline(OPTIMIZE.steps[:names.index("write_in_place")]))


def test_a_column_built_from_the_previous_column_is_written_in_place():
    # column j - 1 is read, column j written: no iteration writes what another reads
    before = _before_in_place(columns)
    assert _copied_back(before.sdfg) == 1
    assert _copied_back(WriteInPlace()(before).unwrap().sdfg) == 0
    rng = np.random.default_rng(2)
    t, P = rng.standard_normal(6), rng.standard_normal((6, 5))
    got = P.copy()
    compile_sdfg(optimized(Graph.of(columns)).sdfg)(t=t, P=got, N=6)
    for j in range(1, 5):
        P[:, j] = P[:, j - 1] * t
    np.testing.assert_allclose(got, P, rtol=1e-13)


def test_a_column_built_from_its_own_other_rows_keeps_its_temporary():
    before = _before_in_place(columns_from_below)
    temps = [m for sub in before.sdfg.all_sdfgs_recursive() for st in sub.states() for n in st.data_nodes()
             if (m := match_at(sub, st, n)) is not None]
    assert not temps and _transients(before.sdfg), "no temporary to keep: the test no longer tests the refusal"
