"""`version_by_size`: a state inside a loop whose maps have symbolic sizes gets a parallel and a sequential
version, chosen at run time by those sizes. Here: what the pass builds, that both versions compute the
program's results (a size that takes only the sequential one, and one that takes each), and that a map
made sequential keeps its small temporaries on the stack. Every corpus program's gradients through the
default pipeline are compared with the unoptimized route in test_two_routes.py."""

from __future__ import annotations

import dace
import numpy as np
import pytest
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock

from gradflow.core.graph import Graph
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.schedules import ChooseSchedules
from gradflow.optimize.versioning import VersionBySize
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


@dace.program
def prefix_updates(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    """nb_syrk's shape: row prefixes of growing length, updated by a fused product in a loop."""
    for i in range(N):
        x[:i + 1] += 0.5 * y[i] * y[:i + 1]
    S[0] = np.sum(x)


def _versioned() -> Graph:
    return OPTIMIZE(Graph.of(prefix_updates.to_sdfg())).unwrap()


def _blocks(sdfg: dace.SDFG) -> list[ConditionalBlock]:
    return [b for b in sdfg.all_control_flow_blocks() if isinstance(b, ConditionalBlock)]


def _maps(state: dace.SDFGState) -> list[nd.MapEntry]:
    return [n for n in state.nodes() if isinstance(n, nd.MapEntry) and state.entry_node(n) is None]


def test_a_loop_body_with_a_symbolic_map_gets_a_parallel_and_a_sequential_version() -> None:
    sdfg = _versioned().sdfg
    [block] = [b for b in _blocks(sdfg) if b.label.endswith("_by_size")]
    (condition, parallel), (otherwise, sequential) = block.branches
    assert otherwise is None and "2048" in condition.as_string and "i" in condition.as_string
    [fast] = [m for s in parallel.states() for m in _maps(s)]
    [slow] = [m for s in sequential.states() for m in _maps(s)]
    assert fast.map.schedule == dace.ScheduleType.Default
    assert slow.map.schedule == dace.ScheduleType.Sequential
    # Each version has its own map-local temporaries (shared, DaCe would allocate one for both, outside
    # the parallel map); the sequential one's are on the stack.
    [fast_state] = parallel.states()
    [slow_state] = sequential.states()
    fast_local = {n.data for n in fast_state.data_nodes() if fast_state.entry_node(n) is not None}
    slow_local = {n.data for n in slow_state.data_nodes() if slow_state.entry_node(n) is not None}
    assert slow_local and not fast_local & slow_local
    assert all(sdfg.arrays[name].storage == dace.StorageType.Register for name in slow_local)


@pytest.mark.parametrize("n", [40, 2200])  # 2200: iterations i >= 2047 take the parallel version
def test_both_versions_compute_the_programs_results(n: int) -> None:
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    results = []
    for graph in (Graph.of(prefix_updates.to_sdfg()), _versioned()):
        out, S = x.copy(), np.zeros(1)
        compile_sdfg(graph)(x=out, y=y, S=S, N=n)
        results.append((out, S))
    expected = x.copy()
    for i in range(n):
        expected[:i + 1] += 0.5 * y[i] * y[:i + 1]
    for out, S in results:
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(S, [expected.sum()], rtol=1e-12)


def test_maps_outside_loops_and_of_constant_size_are_not_versioned() -> None:
    @dace.program
    def flat(x: dace.float64[N], S: dace.float64[1]):
        for i in range(4):
            x[:3] += 1.0
        x[:] *= 2.0
        S[0] = np.sum(x)

    graph = ChooseSchedules()(Graph.of(flat.to_sdfg())).unwrap()
    assert VersionBySize()(graph).unwrap() is graph


def test_versioning_twice_changes_nothing_more() -> None:
    once = _versioned()
    assert VersionBySize()(once).unwrap() is once


M = dace.symbol("M")


@dace.program
def column_powers(t: dace.float64[N], P: dace.float64[N, M]):
    """GradBench llsq's shape: each column the previous one times t, a copy into a strided column."""
    P[:, 0] = 1.0
    for j in range(1, M):
        P[:, j] = P[:, j - 1] * t


def _copies_between_arrays(state: dace.SDFGState) -> list:
    return [e for e in state.edges() if isinstance(e.src, nd.AccessNode) and isinstance(e.dst, nd.AccessNode)
            and not e.data.is_empty()]


def test_a_copy_in_a_loop_is_versioned_and_its_sequential_version_is_a_sequential_map() -> None:
    """DaCe lowers a copy into a default-scheduled map when it compiles: left as a copy, the sequential
    version still opened an OpenMP team per iteration (llsq at 16 rows: 45 us, 10 us without). Since
    `write_in_place` and `move_loops_into_maps`, this program has neither the copy nor the loop around the
    map: it is optimized without them, to keep the copy (as in loops those passes cannot prove)."""
    pipeline = OPTIMIZE.without("write_in_place").without("move_loops_into_maps")
    graph = pipeline(Graph.of(column_powers.to_sdfg())).unwrap()
    blocks = [b for b in _blocks(graph.sdfg) if b.label.endswith("_by_size")]
    assert blocks
    for block in blocks:
        (_, parallel), (_, sequential) = block.branches
        assert not any(_copies_between_arrays(s) for s in sequential.states())
        assert all(m.map.schedule == dace.ScheduleType.Sequential for s in sequential.states() for m in _maps(s))
    assert any(_copies_between_arrays(s) for b in blocks for s in b.branches[0][1].states())
    for n in (16, 2100):  # 2100: the parallel version
        t = np.random.default_rng(n).uniform(-1, 1, n)
        P = np.zeros((n, 5))
        compile_sdfg(graph)(t=t, P=P, N=n, M=5)
        np.testing.assert_allclose(P, t[:, None] ** np.arange(5), rtol=1e-13)
