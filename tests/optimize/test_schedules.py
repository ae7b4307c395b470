"""`choose_schedules` makes a map sequential when all its iterations add into one element (the adjoint of
a scalar broadcast over a row): in a parallel map each of those adds is an atomic compare-and-swap on one
address. The results stay those of the unoptimized route (test_two_routes.py)."""

from __future__ import annotations

import dace
from dace.sdfg import nodes as nd

from gradflow.optimize.schedules import ChooseSchedules
from gradflow.verify import programs
from tests.corpus import npbench

programs.adopt(npbench.CASES)


def _reduces_to_one_element(state: dace.SDFGState, entry: nd.MapEntry) -> bool:
    """Some write-conflict edge leaving the map's body writes an element independent of its parameters."""
    params = set(entry.map.params)
    return any(e.data.wcr is not None and e.data.subset is not None and not e.data.is_empty()
               and not {str(s) for s in e.data.subset.free_symbols} & params
               for e in state.in_edges(state.exit_node(entry)))


def _one_element_maps(sdfg: dace.SDFG) -> list[tuple[nd.MapEntry, dace.ScheduleType]]:
    return [(n, n.map.schedule) for sub in sdfg.all_sdfgs_recursive() for s in sub.states() for n in s.nodes()
            if isinstance(n, nd.MapEntry) and s.entry_node(n) is None and _reduces_to_one_element(s, n)]


def test_a_map_adding_into_one_element_runs_sequentially() -> None:
    plain = programs.differentiated("nb_syrk", optimize=False)
    before = _one_element_maps(plain.sdfg)
    assert before and all(schedule == dace.ScheduleType.Default for _, schedule in before)
    after = _one_element_maps(ChooseSchedules()(plain).unwrap().sdfg)
    assert len(after) == len(before)
    assert all(schedule == dace.ScheduleType.Sequential for _, schedule in after)


@dace.program
def row_and_column_sums(x: dace.float64[64, 48], g: dace.float64[64, 48], gw: dace.float64[48],
                        gr: dace.float64[64]):
    # a LayerNorm's backward in small: j owns gw[j], i owns gr[i], neither owns both
    for i, j in dace.map[0:64, 0:48]:
        with dace.tasklet:
            a << x[i, j]
            b << g[i, j]
            w >> gw(1, lambda p, q: p + q)[j]
            r >> gr(1, lambda p, q: p + q)[i]
            w = a * b
            r = b


def test_a_map_whose_sums_no_one_parameter_owns_runs_sequentially() -> None:
    from gradflow.core.graph import Graph
    from gradflow.runtime.compile import compile_sdfg
    import numpy as np

    plain = Graph.of(row_and_column_sums.to_sdfg())
    chosen = ChooseSchedules()(plain).unwrap()
    [entry] = [n for n, _ in chosen.sdfg.all_nodes_recursive() if isinstance(n, nd.MapEntry)]
    assert entry.map.schedule == dace.ScheduleType.Sequential
    rng = np.random.default_rng(3)
    x, g = rng.standard_normal((64, 48)), rng.standard_normal((64, 48))
    gw, gr = np.zeros(48), np.zeros(64)
    compile_sdfg(chosen)(x=x, g=g, gw=gw, gr=gr)
    np.testing.assert_allclose(gw, (x * g).sum(axis=0), rtol=1e-13)
    np.testing.assert_allclose(gr, g.sum(axis=1), rtol=1e-13)
