"""`join_elementwise_states`: a state of element-wise maps joins the state before it when one of its maps
reads what a map there writes over the same range, so that `fuse_maps` (which fuses within a state) can
fuse the two.

Reverse mode puts each operation's reverse in a state of its own. A GPT layer's backward then runs the
output gradient's copy, the dropout mask's product and GELU's derivative as three passes over the same
16 x 64 x 512 elements, each in its own state, with two temporaries between them; joined, they are one map.

The proof, on the two states A and B, which follow each other on one unconditional edge without
assignments, A having no other successor and B no other predecessor, B not the region's start:
- B holds only access nodes and element-wise maps (`transforms.fusion.elementwise_scope`: tasklets and
  scope-local data), no views;
- an array B writes is not accessed in A (joined, nothing orders B's write after A's accesses);
- an array B reads that A writes has one access node in A: B's reads start from it, after A's write.
Arrays both only read need no order. Joined, every dependence between A and B is an edge of the state,
so any order DaCe's code generator picks runs A's writes before B's reads, as the two states did. An
empty state between A and a state that would join it joins A first (it does nothing).
"""

from __future__ import annotations

from typing import ClassVar, Iterator

import attrs
import dace
from dace.sdfg import nodes as nd

from gradflow.analysis.access import accesses, runs_right_after, successive_states
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass
from gradflow.transforms.fusion import elementwise_scope


def _written(state: dace.SDFGState) -> set[str]:
    """The arrays some access node of `state` (at any scope) is written through."""
    return {n.data for n in state.data_nodes() if state.in_degree(n) > 0}


def _only_elementwise_maps(state: dace.SDFGState) -> bool:
    """B's nodes are access nodes (no views) and element-wise maps, and there is at least one map."""
    scopes = state.scope_dict()
    entries = [n for n in state.nodes() if isinstance(n, nd.MapEntry) and scopes[n] is None]
    if not entries or not all(elementwise_scope(state, e) for e in entries):
        return False
    for node in state.nodes():
        if scopes[node] is not None or isinstance(node, (nd.MapEntry, nd.MapExit)):
            continue
        if not isinstance(node, nd.AccessNode) or isinstance(node.desc(state.sdfg), dace.data.View):
            return False
    return True


def _feeds_a_map_of_the_same_range(first: dace.SDFGState, second: dace.SDFGState, shared: set[str]) -> bool:
    """A top-level map of A writes an array of `shared` that a top-level map of B over the same range
    reads: the pair `fuse_maps` may fuse once the states are one."""
    first_scopes, second_scopes = first.scope_dict(), second.scope_dict()
    ranges = {}
    for name in shared:
        (node,) = accesses(first, name)
        ranges[name] = [e.src.map.range for e in first.in_edges(node)
                        if isinstance(e.src, nd.MapExit) and first_scopes[first.entry_node(e.src)] is None]
    for node in second.data_nodes():
        if node.data not in shared:
            continue
        for e in second.out_edges(node):
            if (isinstance(e.dst, nd.MapEntry) and second_scopes[e.dst] is None
                    and any(r == e.dst.map.range for r in ranges[node.data])):
                return True
    return False


def _joinable(first: dace.SDFGState, second: dace.SDFGState) -> bool:
    """The module doc's conditions on the two states' contents, and a pair for `fuse_maps` among them."""
    if not _only_elementwise_maps(second):
        return False
    in_first = {n.data for n in first.data_nodes()}
    if _written(second) & in_first:
        return False
    shared = {n.data for n in second.data_nodes()} & _written(first)
    scopes = first.scope_dict()
    if any(len(nodes := accesses(first, name)) != 1 or scopes[nodes[0]] is not None for name in shared):
        return False
    return bool(shared) and _feeds_a_map_of_the_same_range(first, second, shared)


def _empty_before_a_join(region, first: dace.SDFGState, second: dace.SDFGState) -> bool:
    """`second` is empty (the ONNX lowering leaves one where a transpose folded into a weight) and the state
    after it would join `first`: joining the empty state first makes them neighbours."""
    if second.nodes() or region.out_degree(second) != 1:
        return False
    third = region.out_edges(second)[0].dst
    return isinstance(third, dace.SDFGState) and runs_right_after(region, second, third) and _joinable(first, third)


@register_pass
@attrs.frozen
class JoinElementwiseStates(RewritePass):
    """A state of element-wise maps that reads a same-range map's result joins that map's state (module
    doc)."""

    name: ClassVar[str] = "join_elementwise_states"
    strategy: ClassVar[str] = ONE_AT_A_TIME
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> Iterator:
        return ((region, first, second) for region, first, second in successive_states(sdfg)
                if _joinable(first, second) or _empty_before_a_join(region, first, second))

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        region, first, second = match
        written = _written(first)
        # B's reads of what A writes start at A's one node of that array (`_joinable`)
        same = {n: accesses(first, n.data)[0] for n in second.data_nodes() if n.data in written}
        moved = {}
        for node in second.nodes():
            if node in same:
                moved[node] = same[node]
            else:
                first.add_node(node)
                moved[node] = node
        for e in second.edges():
            first.add_edge(moved[e.src], e.src_conn, moved[e.dst], e.dst_conn, e.data)
        for out in region.out_edges(second):
            region.add_edge(first, out.dst, out.data)
        region.remove_node(second)
