"""`join_copy_states`: a state that only copies a map's temporary into an array joins the state of the map.

Reverse mode puts each operation of a program in a state of its own, so the forward sweep of a gradient
has `y[:] = f(y)` as a map writing a temporary in one state and the copy into `y` in the next: the shape
`write_in_place` removes (one pass over memory less per update) only when both are in one state, as in the
program compiled forward only. Joining them lets the gradient's loops lose their copies too (GradBench's
llsq builds its matrix a column at a time; ode updates its state vector).

The proof, on the two states A (the map) and B (the copies), which follow each other on one unconditional
edge without assignments, A having no other successor and B no other predecessor:
- B holds only copies between access nodes (no write-conflict resolution, no views), each from a transient
  T that A writes, from A's map, at A's one access node of T, into an array D that no copy of B reads;
- every access node of D in A is an ancestor of T's node in A, and so is every node reading from it:
  everything A does with D's old value runs before the copy that, joined, starts from T's node.
Joined, B's copies start at T's node in A and end at new access nodes of D: the order of A then B.
"""

from __future__ import annotations

import copy
from typing import ClassVar, Iterator

import attrs
import dace
import networkx as nx
from dace.sdfg import nodes as nd

from gradflow.analysis.access import accesses, successive_states
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass


def _copies(state: dace.SDFGState) -> list | None:
    """B's copies when it holds nothing else; None otherwise."""
    if not state.nodes() or any(not isinstance(n, nd.AccessNode) for n in state.nodes()):
        return None
    edges = list(state.edges())
    if not edges or any(e.data.is_empty() or e.data.wcr is not None for e in edges):
        return None
    if any(state.degree(n) == 0 for n in state.nodes()):
        return None
    return edges


def _joinable(first: dace.SDFGState, second: dace.SDFGState) -> bool:
    sdfg = first.sdfg
    copies = _copies(second)
    if copies is None:
        return False
    written_in_second = {e.dst.data for e in copies}
    if written_in_second & {e.src.data for e in copies}:
        return False  # a chain of copies
    for e in copies:
        source, dest = sdfg.arrays[e.src.data], sdfg.arrays[e.dst.data]
        if not source.transient or isinstance(source, dace.data.View) or isinstance(dest, dace.data.View):
            return False
        nodes_t = accesses(first, e.src.data)
        if len(nodes_t) != 1 or not any(isinstance(w.src, nd.MapExit) for w in first.in_edges(nodes_t[0])):
            return False
        before = nx.ancestors(first.nx, nodes_t[0])
        for n in first.data_nodes():
            if n.data != e.dst.data:
                continue
            if n not in before or any(r.dst not in before and r.dst is not nodes_t[0] for r in first.out_edges(n)):
                return False
    return True


@register_pass
@attrs.frozen
class JoinCopyStates(RewritePass):
    """A state of copies of a map's temporaries joins the map's state (module doc)."""

    name: ClassVar[str] = "join_copy_states"
    strategy: ClassVar[str] = ONE_AT_A_TIME
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> Iterator:
        return ((region, first, second) for region, first, second in successive_states(sdfg)
                if _joinable(first, second))

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        region, first, second = match
        for e in second.edges():
            source = accesses(first, e.src.data)[0]  # its one node (`_joinable`)
            dest = first.add_access(e.dst.data)
            first.add_edge(source, e.src_conn, dest, e.dst_conn, copy.deepcopy(e.data))
        for out in region.out_edges(second):
            region.add_edge(first, out.dst, out.data)
        region.remove_node(second)
