"""`register_scalar_sums`: a sequential map's sum into one element accumulates in a local variable.

The reverse of an operation that reads one element for a whole row (softmax's `P[i, j] / s`, `exp(X[i, j]
- m)`, go_fast's `a + trace`) sums into that element's gradient from every iteration: `g_s[0] += ...`, a
write-conflict sum into a heap array. Where the map runs sequentially (`choose_schedules`: inside a
sequential loop, or small) DaCe emits `*g_s += v` per iteration, and the C++ compiler keeps the element
in memory, as it may alias the other arrays the loop touches: each add waits for the store of the
previous one (a store-to-load round trip on top of the add's latency).

This pass gives each such sum a one-element `Register` transient (a local variable of the generated
function): zeroed before the map, summed into by the map's iterations, added to the element once after
it. Applies to top-level maps whose schedule is `Sequential`, for each edge leaving the map that sums
(`wcr` sum) into one element of a floating-point array the map does not read. The order of the additions
is unchanged except that the old value of the element comes last (one rounding).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.frontend.operations import detect_reduction_type
from dace.sdfg import nodes as nd

from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.optimize.nest_reductions import accumulate_in_register

_FLOATS = (dace.float16, dace.float32, dace.float64)


def _scalar_sum(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry, edge) -> bool:
    m = edge.data
    if m.is_empty() or m.wcr is None or detect_reduction_type(m.wcr) != dace.dtypes.ReductionType.Sum:
        return False
    if m.subset.num_elements() != 1 or not isinstance(edge.dst, nd.AccessNode):
        return False
    desc = sdfg.arrays[m.data]
    if desc.dtype not in _FLOATS or desc.storage == dace.StorageType.Register:
        return False  # not a float, or a local already
    if {str(s) for s in m.subset.free_symbols} & set(entry.map.params):
        return False
    return not any(e.data.data == m.data for e in state.in_edges(entry))


def _candidates(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.MapEntry, object]]:
    found = []
    for state in sdfg.states():
        for entry in state.nodes():
            if (isinstance(entry, nd.MapEntry) and state.entry_node(entry) is None
                    and entry.map.schedule == dace.ScheduleType.Sequential):
                found.extend((state, entry, e) for e in state.out_edges(state.exit_node(entry))
                             if _scalar_sum(sdfg, state, entry, e))
    return found


@register_pass
@attrs.frozen
class RegisterScalarSums(RewritePass):
    """Sums of a sequential map into one element go through a local variable (see the module doc)."""

    name: ClassVar[str] = "register_scalar_sums"

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        state, entry, edge = match
        accumulate_in_register(sdfg, state, edge, entry)
