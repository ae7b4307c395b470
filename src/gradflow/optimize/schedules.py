"""`choose_schedules`: parallel loops only where the work pays for a parallel region.

DaCe's CPU code generator opens an OpenMP parallel region (`#pragma omp parallel for`) for every map of the
default schedule at the top of a state. Reverse mode emits many maps of a few elements (tape pushes and
pops, clears and seeds of single elements), often inside loops, where opening a parallel region costs far
more than the work (microseconds per iteration of the enclosing loop). This pass gives a map the
sequential schedule when its iteration count (times that of the largest map nest inside it) is a constant
below `min_parallel`; maps nested inside another map are sequential already. Symbolic extents are assumed
large here; inside loops `version_by_size` decides them at run time.

A map every iteration of which adds into the same element (a write-conflict sum whose index uses none
of the map's parameters: the adjoint of a scalar broadcast over a row, `g_alpha += A[i] * g[i]`) is also
made sequential, whatever its size: in a parallel map DaCe makes each of those adds an atomic
compare-and-swap on one address, which serializes the threads anyway and costs far more than the add
(nb_syrk's backward spent most of its time there). Sequential, the adds are plain. The same holds for
a map whose sums no one parameter owns (`nest_reductions`), such as a LayerNorm's backward, which sums
into the weight's and bias's gradients per column and into the mean's and deviation's per row: every add
was atomic, and every thread added into the same columns (with the attention reshapes, a third of a
transformer layer's backward went to `lock cmpxchg`).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd

from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.optimize.nest_reductions import owns

#: Largest transient (elements) inside a sequential map that `make_sequential` keeps on the stack.
REGISTER_LIMIT = 1024


def work(state: dace.SDFGState, entry: nd.MapEntry):
    """Iterations of the map times those of the largest map nest inside it (maps nested by
    `nest_reductions` count with their parent)."""
    inner = [work(state, n) for n in state.scope_children()[entry] if isinstance(n, nd.MapEntry)]
    count = entry.map.range.num_elements()
    if not inner:
        return count
    try:
        return count * max(int(w) for w in inner)
    except TypeError:  # a symbolic count inside: assumed large
        return count * inner[0]


def _small(state: dace.SDFGState, entry: nd.MapEntry, min_parallel: int) -> bool:
    try:
        return int(work(state, entry)) < min_parallel
    except TypeError:  # a symbolic count: assumed large
        return False


def make_sequential(state: dace.SDFGState, entry: nd.MapEntry) -> None:
    """Give the map the sequential schedule, and the small transients its body uses stack storage.

    Why the storage: DaCe places a default-storage transient inside a parallel map in registers, but inside
    a sequential one at the top level on the heap, allocated and freed in every iteration (a fused
    one-element temporary made nb_syrk's forward 20x slower than the parallel map it replaced)."""
    entry.map.schedule = dace.ScheduleType.Sequential
    sdfg = state.sdfg
    for node in state.scope_subgraph(entry).nodes():
        if not isinstance(node, nd.AccessNode):
            continue
        desc = node.desc(sdfg)
        if (desc.transient and desc.storage == dace.StorageType.Default and not desc.free_symbols
                and int(desc.total_size) <= REGISTER_LIMIT and _scope_local(sdfg, node.data)):
            desc.storage = dace.StorageType.Register


def _scope_local(sdfg: dace.SDFG, name: str) -> bool:
    """Every access to `name` in `sdfg` is inside some map."""
    return all(state.entry_node(n) is not None for state in sdfg.states() for n in state.data_nodes()
               if n.data == name)


def _sums_without_one_owner(state: dace.SDFGState, entry: nd.MapEntry) -> bool:
    """The map's body makes write-conflict sums and no one of its parameters owns all of them (see
    `nest_reductions.owns`), so DaCe would make adds atomic (or `runtime/races.py` the map sequential)."""
    params = set(entry.map.params)
    sums = [e for e in state.in_edges(state.exit_node(entry))
            if e.data.wcr is not None and e.data.subset is not None and not e.data.is_empty()]
    return bool(sums) and not any(all(owns(e.data.subset, p, params) for e in sums) for p in params)


def _sequential_candidates(sdfg: dace.SDFG, min_parallel: int) -> list[tuple[dace.SDFGState, nd.MapEntry]]:
    found = []
    for state in sdfg.states():
        for node in state.nodes():
            if (isinstance(node, nd.MapEntry) and node.map.schedule == dace.ScheduleType.Default
                    and state.entry_node(node) is None
                    and (_small(state, node, min_parallel) or _sums_without_one_owner(state, node))):
                found.append((state, node))
    return found


@register_pass
@attrs.frozen
class ChooseSchedules(RewritePass):
    """Small top-level maps, and maps whose sums no one parameter owns (all adding into one element, or
    per row and per column), become sequential loops (see the module docstring)."""

    min_parallel: int = 2048
    name: ClassVar[str] = "choose_schedules"

    def matches(self, sdfg: dace.SDFG) -> list:
        return _sequential_candidates(sdfg, self.min_parallel)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        make_sequential(*match)
