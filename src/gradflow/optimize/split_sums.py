"""`split_sum_maps`: a map summing into arrays owned by different parameters becomes one map per array.

Reverse mode gives the adjoint of a product inside a map both factors' gradients from one tasklet: a
depthwise convolution's `y[n, c, o + k] += x[n, c, o + k] * w[c, k]` reverses into one map that adds
into `gw[c, k]` (a sum over n and o for each element) and into `gx[n, c, o + k]` (a few terms per
element). `nest_reductions` can only nest the map by the parameters that own *every* sum (c), so
neither sum gets its best order: `gw`'s element changes with the innermost loop and is loaded, added
and stored at every iteration (a quarter of MobileNet's backward). Split, the map that sums into `gw`
is owned by (c, k) and sums over n and o in registers, and the one that sums into `gx` by (n, c).

Applies to a top-level map whose body is one Python tasklet (pure: its code only assigns its outputs)
whose outputs all leave the map as write-conflict sums into one element each (no index computed in the
code), when grouping those outputs by the set of parameters owning them (`nest_reductions.owns`; outputs
into one array kept together) gives two groups or more, and one of them would sum in registers alone but
not nested by the owners all groups share (else a split only reads the inputs again: the adjoint of
`a + trace` made two passes over the matrix, lp_go_fast's backward 3.2 -> 3.4-3.6 ms). Each group gets a
copy of the map with the same range and a copy of the tasklet; the tasklet's other outputs go to a local
scalar in that copy, a dead store the C++ compiler removes. Precondition, checked: no array the map reads
is one it sums into, so running the copies one after the other reads what the one map read, and each
array receives the same additions in the same order.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import dace
from dace.frontend.operations import detect_reduction_type
from dace.sdfg import nodes as nd

from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.optimize.nest_reductions import fixed_by, long_enough, owns


def _body(state: dace.SDFGState, entry: nd.MapEntry) -> nd.Tasklet | None:
    """The map's one Python tasklet, when the map holds nothing else."""
    inside = [n for n in state.scope_children()[entry] if n is not state.exit_node(entry)]
    if len(inside) != 1 or not isinstance(inside[0], nd.Tasklet):
        return None
    tasklet = inside[0]
    return tasklet if tasklet.language == dace.dtypes.Language.Python else None


def groups(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry) -> list[list] | None:
    """The tasklet's output edges grouped by the parameters that own them (two groups or more), or None
    where the map is not split (module doc)."""
    tasklet = _body(state, entry)
    if tasklet is None or any(not (e.dst_conn or "IN_").startswith("IN_") for e in state.in_edges(entry)):
        return None  # not one tasklet; or a range read from data, which a copy of the map would have to read too
    exit_ = state.exit_node(entry)
    outs = state.out_edges(tasklet)
    if not outs or any(e.dst is not exit_ or e.data.is_empty() or e.data.wcr is None or e.data.subset is None
                       or e.data.subset.num_elements() != 1  # an index computed in the code (a scatter)
                       or detect_reduction_type(e.data.wcr) != dace.dtypes.ReductionType.Sum for e in outs):
        return None
    summed = {e.data.data for e in outs}
    read = {e.data.data for e in state.in_edges(entry) if not e.data.is_empty()}
    if summed & read or any(isinstance(sdfg.arrays[n], dace.data.View) for n in summed | read):
        return None
    params = set(entry.map.params)
    by_array: dict[str, list] = {}
    for e in outs:
        by_array.setdefault(e.data.data, []).append(e)
    by_owners: dict[frozenset, list] = {}
    for edges in by_array.values():
        owned = frozenset(p for p in params if all(owns(e.data.subset, p, params) for e in edges))
        by_owners.setdefault(owned, []).extend(edges)
    if len(by_owners) < 2:
        return None
    common = frozenset.intersection(*by_owners)
    if not any(_gains_registers(entry, edges, owned, common) for owned, edges in by_owners.items()):
        return None
    return [by_owners[k] for k in sorted(by_owners, key=lambda k: sorted(k))]


def _gains_registers(entry: nd.MapEntry, edges: list, owned: frozenset, common: frozenset) -> bool:
    """Whether these sums, alone in a map, would run in registers (`nest_reductions`: their elements fixed
    by their owners, over `MIN_REGISTER_SUM` terms or more) where in the one map, nested by the owners all
    sums share, they would not. Otherwise a split only makes each copy read the map's inputs again (the
    adjoint of `a + trace`: a plain copy and a sum over one matrix, twice as many passes over it)."""
    params = set(entry.map.params)
    if not owned or not all(fixed_by(e.data.subset, owned, params) for e in edges):
        return False
    if common and all(fixed_by(e.data.subset, common, params) for e in edges):
        return False
    return long_enough(entry, owned)


def _candidates(sdfg: dace.SDFG) -> list:
    found = []
    for state in sdfg.states():
        for node in state.nodes():
            if isinstance(node, nd.MapEntry) and state.entry_node(node) is None:
                parts = groups(sdfg, state, node)
                if parts is not None:
                    found.append((state, node, parts))
    return found


def _sink(sdfg: dace.SDFG, state: dace.SDFGState, tasklet: nd.Tasklet, edge, exit_: nd.MapExit) -> None:
    """The output `edge` carried now goes to a local scalar nothing reads (ordered before the map's exit,
    which keeps it inside the map's scope)."""
    dtype = sdfg.arrays[edge.data.data].dtype
    name, _ = sdfg.add_scalar(f"gradflow_unused_{edge.src_conn}", dtype, transient=True,
                              storage=dace.StorageType.Register, find_new_name=True)
    sink = state.add_access(name)
    state.add_edge(tasklet, edge.src_conn, sink, None, dace.Memlet(data=name, subset="0"))
    state.add_nedge(sink, exit_, dace.Memlet())


def _split(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry, parts: list[list]) -> None:
    exit_ = state.exit_node(entry)
    tasklet = _body(state, entry)
    assert tasklet is not None
    ins = state.in_edges(tasklet)  # all from `entry`: the tasklet is the one node inside the map
    for part in parts[1:]:
        new_map = copy.deepcopy(entry.map)
        new_entry, new_exit = nd.MapEntry(new_map), nd.MapExit(new_map)
        twin = copy.deepcopy(tasklet)
        twin.label = f"{tasklet.label}_split"
        state.add_nodes_from([new_entry, new_exit, twin])
        for e in ins:
            if e.data.is_empty():
                state.add_nedge(new_entry, twin, dace.Memlet())
                continue
            conn = e.src_conn[len("OUT_"):]
            if new_entry.add_in_connector("IN_" + conn):  # once per connector, however many reads it feeds
                new_entry.add_out_connector("OUT_" + conn)
                [outer] = [o for o in state.in_edges(entry) if o.dst_conn == "IN_" + conn]
                state.add_edge(outer.src, outer.src_conn, new_entry, "IN_" + conn, copy.deepcopy(outer.data))
            state.add_edge(new_entry, "OUT_" + conn, twin, e.dst_conn, copy.deepcopy(e.data))
        mine = {e.src_conn for e in part}
        for e in state.out_edges(tasklet):
            if e.src_conn not in mine:
                _sink(sdfg, state, twin, e, new_exit)
                continue
            conn = e.dst_conn[len("IN_"):]
            if new_exit.add_in_connector("IN_" + conn):  # once per connector, however many sums it carries
                new_exit.add_out_connector("OUT_" + conn)
                [outer] = [o for o in state.out_edges(exit_) if o.src_conn == "OUT_" + conn]
                state.add_edge(new_exit, "OUT_" + conn, outer.dst, outer.dst_conn, copy.deepcopy(outer.data))
            state.add_edge(twin, e.src_conn, new_exit, "IN_" + conn, copy.deepcopy(e.data))
    moved = {e.src_conn for part in parts[1:] for e in part}
    for e in list(state.out_edges(tasklet)):
        if e.src_conn in moved:
            state.remove_edge(e)
            _sink(sdfg, state, tasklet, e, exit_)
    for conn in [c for c in exit_.in_connectors if not any(True for _ in state.in_edges_by_connector(exit_, c))]:
        for outer in [o for o in state.out_edges(exit_) if o.src_conn == "OUT_" + conn[len("IN_"):]]:
            state.remove_edge(outer)
        exit_.remove_in_connector(conn)
        exit_.remove_out_connector("OUT_" + conn[len("IN_"):])


@register_pass
@attrs.frozen
class SplitSumMaps(RewritePass):
    """Maps summing into arrays that different parameters own: one map per such array (module doc)."""

    name: ClassVar[str] = "split_sum_maps"

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        state, entry, parts = match
        _split(sdfg, state, entry, parts)
