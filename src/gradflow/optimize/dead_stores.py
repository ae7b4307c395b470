"""`drop_dead_stores`: plain writes into a transient that nothing reads afterwards are removed.

Reverse mode resets an output's gradient after its elementwise adjoint has consumed it (`g_y[i] = 0`:
the value the forward overwrote has no gradient), so that a later contribution to the same location,
say in the next iteration of a loop, starts from zero; and it zeroes every gradient buffer before the
backward sweep. In straight-line code most of those buffers are never read again: each reset is a full
extra write stream per elementwise adjoint (a BatchNorm's backward map reads two arrays and writes two,
one of them the reset), and a zeroing of a buffer nothing reads is all cost.

A write is dead when it is a plain (non-sum) write from a Python tasklet into a transient array (living
for one call) in a state of the top-level SDFG that no loop or cycle may run again, every other access
node of the array in that state comes before the written one, no block after the state touches the
array (access nodes, interstate edges, loop or branch conditions), and no view aliases it. The write's
memlet path goes; a tasklet left without outputs goes with its inputs, then maps left empty, then access
nodes left isolated, then the array itself if nothing names it any more. The assignment in the tasklet's
code stays, as a local.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
import networkx as nx
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, LoopRegion
from returns.result import Success

from gradflow.analysis.access import named_in_code, touches
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass

#: lifetimes whose values outlive one call: a write may be read by the next
KEPT_LIFETIMES = (dace.dtypes.AllocationLifetime.Persistent, dace.dtypes.AllocationLifetime.Global,
         dace.dtypes.AllocationLifetime.External)


def viewed_arrays(sdfg: dace.SDFG) -> set[str]:
    """Arrays some view node of `sdfg` connects to (a write through one would alias them)."""
    names = set()
    for state in sdfg.states():
        for node in state.data_nodes():
            if isinstance(node.desc(sdfg), dace.data.View):
                names.add(node.data)
                for e in state.all_edges(node):
                    other = e.dst if e.src is node else e.src
                    if isinstance(other, nd.AccessNode):
                        names.add(other.data)
    return names


def read_later(sdfg: dace.SDFG, state, name: str, on_edges: set[str]) -> bool:
    """Whether anything after `state` (a state, or any block) in `sdfg`'s control flow may read `name`
    (True where unsure): the blocks after it in its region, then after that region in its parent, up to the
    SDFG; a loop on the way (or a cycle) may run the state again after a later read. `on_edges`: the names
    any interstate edge of `sdfg` reads (conservatively, wherever the edge is)."""
    if name in on_edges:
        return True
    if named_in_code(sdfg, name):
        return True
    block = state
    while block is not sdfg:
        region = block.parent_graph
        if isinstance(region, LoopRegion) or region is None:
            return True
        if not isinstance(region, ConditionalBlock):  # a branch runs once; what follows is after the block
            graph = region.nx
            if block not in graph or any(nx.has_path(graph, s, block) for s in graph.successors(block)):
                return True
            if any(touches(later, name) for later in nx.descendants(graph, block)):
                return True
        block = region
    return False


def _dead_writes(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.AccessNode]]:
    """(state, access node) pairs whose incoming plain writes from Python tasklets are dead."""
    viewed = viewed_arrays(sdfg)
    on_edges = {str(x) for e in sdfg.all_interstate_edges(recursive=True) for x in e.data.free_symbols}
    found = []
    for state in sdfg.states():
        for node in state.data_nodes():
            desc = node.desc(sdfg)
            if (not desc.transient or isinstance(desc, dace.data.View) or node.data in viewed
                    or desc.lifetime in KEPT_LIFETIMES or state.out_degree(node) or not state.in_degree(node)):
                continue
            before = nx.ancestors(state.nx, node)
            if any(n.data == node.data and n is not node and n not in before for n in state.data_nodes()):
                continue  # read after the write, or unordered with it
            if not all(_plain_tasklet_writes(state, e) for e in state.in_edges(node)):
                continue
            if read_later(sdfg, state, node.data, on_edges):
                continue
            found.append((state, node))
    return found


def _plain_tasklet_writes(state: dace.SDFGState, edge) -> bool:
    """One plain write from one Python tasklet reaches `edge` (a tree with more leaves is left alone)."""
    tree = state.memlet_tree(edge)
    leaves = tree.leaves()
    plain = edge.data.wcr is None and all(t.edge.data.wcr is None for t in tree.traverse_children(True))
    return (plain and len(leaves) == 1 and isinstance(leaves[0].src, nd.Tasklet)
            and leaves[0].src.language == dace.dtypes.Language.Python and _alone_in_scope(state, leaves[0].src))


def _alone_in_scope(state: dace.SDFGState, tasklet: nd.Tasklet) -> bool:
    """The tasklet is the only node of its map (or at the top level): removing it removes the whole
    computation. (A map whose tasklets feed each other through scalars would keep the others, then without
    a path to its exit, which leaves the state malformed.)"""
    entry = state.entry_node(tasklet)
    return entry is None or state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes() == [tasklet]


def _cut(state: dace.SDFGState, edge) -> None:
    """Remove `edge`'s memlet path and the scope connectors nothing else uses any more."""
    for e in state.memlet_path(edge):
        state.remove_edge(e)
        for node in (e.src, e.dst):
            if not isinstance(node, (nd.EntryNode, nd.ExitNode)):
                continue
            used = {x.dst_conn for x in state.in_edges(node)} | {x.src_conn for x in state.out_edges(node)}
            for conn in [c for c in node.in_connectors if c not in used and c.startswith("IN_")]:
                node.remove_in_connector(conn)
            for conn in [c for c in node.out_connectors if c not in used and c.startswith("OUT_")]:
                node.remove_out_connector(conn)


def drop_writes(state: dace.SDFGState, node: nd.AccessNode) -> None:
    """Remove every write into `node` (plain tasklet writes), the tasklets and maps left with nothing to
    compute, and the access nodes left isolated."""
    writers = set()
    for edge in list(state.in_edges(node)):
        [leaf] = state.memlet_tree(edge).leaves()
        writers.add(leaf.src)
        leaf.src.remove_out_connector(leaf.src_conn)
        _cut(state, leaf)
    for tasklet in writers:
        if not tasklet.out_connectors:  # nothing left to compute: its inputs go with it
            for e in list(state.in_edges(tasklet)):
                if e.data.is_empty():
                    state.remove_edge(e)
                else:
                    _cut(state, e)
            state.remove_node(tasklet)
    _remove_empty_maps(state)
    for n in [n for n in state.data_nodes() if state.degree(n) == 0]:
        state.remove_node(n)


def _remove_empty_maps(state: dace.SDFGState) -> None:
    """Maps with nothing left between their entry and their exit go, innermost first."""
    while True:
        exits = {n.map: n for n in state.nodes() if isinstance(n, nd.MapExit)}
        empty = [(n, exits[n.map]) for n in state.nodes() if isinstance(n, nd.MapEntry) and n.map in exits
                 and all(e.dst is exits[n.map] for e in state.out_edges(n))
                 and all(e.src is n for e in state.in_edges(exits[n.map]))]
        if not empty:
            return
        for entry, exit_ in empty:
            for e in list(state.in_edges(entry)) + list(state.out_edges(exit_)):
                if e.data.is_empty():
                    state.remove_edge(e)
                else:
                    _cut(state, e)
            state.remove_nodes_from([n for n in (entry, exit_) if n in state.nodes()])


def _unnamed(sdfg: dace.SDFG, name: str) -> bool:
    return not any(isinstance(n, nd.AccessNode) and n.data == name for n, _ in sdfg.all_nodes_recursive())


@register_pass
@attrs.frozen
class DropDeadStores(Pass):
    """Plain tasklet writes into transients nothing reads afterwards are removed (see the module
    docstring)."""

    name: ClassVar[str] = "drop_dead_stores"

    def run(self, graph: Graph) -> PassResult:
        # the top-level SDFG only: a nested SDFG runs once per call of its node, and its transients'
        # lifetimes across those calls are DaCe's to choose
        if not _dead_writes(graph.sdfg):
            return Success(graph)
        sdfg = graph.editable()
        for state, node in _dead_writes(sdfg):
            if node not in state.nodes():
                continue  # removed with an earlier write's orphans
            name = node.data
            drop_writes(state, node)
            if _unnamed(sdfg, name) and name not in sdfg.free_symbols:
                sdfg.remove_data(name, validate=False)
        return Success(Graph.adopt(sdfg, graph.meta))
