"""`choose_schedules` makes a map sequential when all its iterations add into one element (the adjoint of
a scalar broadcast over a row): in a parallel map each of those adds is an atomic compare-and-swap on one
address. The results stay those of the unoptimized route (test_two_routes.py)."""

from __future__ import annotations

import dace
from dace.sdfg import nodes as nd

from gradflow.optimize.schedules import ChooseSchedules, _reduces_to_one_element
from gradflow.verify import programs
from tests.corpus import npbench

programs.adopt(npbench.CASES)


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
