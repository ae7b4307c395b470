"""`sink_fills`: a constant fill of a transient array moves from where it is to just before the array is
next touched, so that the array is live only from there.

The reverse sweep sets every gradient buffer to zero in one state at its start (`init_gradients`) and
accumulates into each buffer much later. Each buffer then holds its (dead) zeros from the start of the
backward to its first use, so `share_dead_buffers` (run after this pass) can place no other value in it
meanwhile. Measured on the model zoo's transformer layer (batch 1024, float32): the backward's 40 gradient
buffers were all live at once from `init_gradients` on.

A fill is a part of a state that is not connected to the rest of it and writes one access node of a
transient array, all of it, without a write-conflict resolution, from tasklets with no inputs and no side
effects (in maps): a value made of constants and symbols. It moves, in gradflow's own analysis of the top-level program, when:
- the array is one `share_dead_buffers` may rename (`shared_buffers.candidates`: transient, top-level, named
  by no control code, tasklet code or nested symbol mapping, sized by no symbol set at run time), and the
  state has no other access node of it;
- the fill names no symbol set at run time (its value and extent are the same at the later position);
- the state is a position of the chain of positions of `shared_buffers.Positions` (not inside a loop or a
  conditional), and the array's next touch is at a later position, not the next one;
- the regions around both places have no conditional edge (a chain region whose edge condition is false
  ends early, and what follows it runs without the blocks it skipped).
It moves into a new state right before the block at that touch (in that block's region: every path to the
block passes the new state, and every path from the old state to the block passes no touch of the array).
The array then holds the same value at every read: nothing touched it between the two places.
"""

from __future__ import annotations

import re
from typing import ClassVar

import attrs
import dace
import networkx as nx
from dace import subsets
from dace.sdfg import nodes as nd

from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.optimize.shared_buffers import Positions, candidates, varying_symbols


def _fill(state: dace.SDFGState, component: set, names: set[str]) -> str | None:
    """The array the component fills (module doc), or None if it is no fill."""
    data = [n for n in component if isinstance(n, nd.AccessNode)]
    if len(data) != 1 or data[0].data not in names or state.out_degree(data[0]) or state.in_degree(data[0]) != 1:
        return None
    if any(not isinstance(n, (nd.AccessNode, nd.MapEntry, nd.MapExit, nd.Tasklet)) for n in component):
        return None
    if any(isinstance(n, nd.Tasklet) and (n.in_connectors or n.has_side_effects(state.sdfg)) for n in component):
        return None
    edge = state.in_edges(data[0])[0]
    desc = state.sdfg.arrays[data[0].data]
    if edge.data.wcr is not None or edge.data.data != data[0].data or edge.data.subset != subsets.Range.from_array(desc):
        return None
    return data[0].data


def _symbols(state: dace.SDFGState, component: set) -> set[str]:
    """Every name the component's code, ranges and memlets use (a superset of the symbols it reads)."""
    names = set()
    for n in component:
        if isinstance(n, nd.Tasklet):
            names |= set(re.findall(r"\w+", n.code.as_string))
        elif isinstance(n, nd.MapEntry):
            names |= set(map(str, n.map.range.free_symbols))
        for e in state.out_edges(n):
            names |= set(map(str, e.data.free_symbols))
    return names


def _unconditional(block) -> bool:
    """Every region around `block` runs its blocks in order without conditions: a chain region whose
    condition is false ends early, and the blocks after it run; a fill moved into it would then be
    skipped where the original one ran."""
    region = block.parent_graph
    while region is not None and not isinstance(region, dace.SDFG):
        if any(not e.data.is_unconditional() for e in region.edges()):
            return False
        region = region.parent_graph
    return region is None or all(e.data.is_unconditional() for e in region.edges())


@attrs.frozen
class Move:
    """Fills of `state` to move right before `before` (the block of the filled arrays' next touch)."""

    state: dace.SDFGState
    before: object
    components: tuple


def moves(sdfg: dace.SDFG) -> list[Move]:
    """The fills the pass moves (module doc), grouped by the state they leave and the block they precede."""
    names = candidates(sdfg)
    if not names:
        return []
    where = Positions(sdfg, names)
    varying = varying_symbols(sdfg)
    found: dict[tuple[int, int], Move] = {}
    for name, touches in where.touches.items():
        for k, (position, block) in enumerate(touches[:-1]):
            if not isinstance(block, dace.SDFGState):
                continue
            next_position, next_block = touches[k + 1]
            if next_position <= position + 1:
                continue
            own = [n for n in block.data_nodes() if n.data == name]
            if len(own) != 1:
                continue
            component = nx.node_connected_component(block.nx.to_undirected(as_view=True), own[0])
            if _fill(block, component, names) != name or _symbols(block, component) & varying:
                continue
            if not _unconditional(block) or not _unconditional(next_block):
                continue
            key = (id(block), id(next_block))
            move = found.get(key, Move(block, next_block, ()))
            found[key] = attrs.evolve(move, components=move.components + (frozenset(component),))
    return list(found.values())


@register_pass
@attrs.frozen
class SinkFills(RewritePass):
    """Constant fills of transient arrays move to just before the arrays' next touch (module doc)."""

    name: ClassVar[str] = "sink_fills"
    nested: ClassVar[bool] = False  # the top-level program's transients

    def matches(self, sdfg: dace.SDFG) -> list[list[Move]]:
        found = moves(sdfg)
        return [found] if found else []

    def rewrite(self, sdfg: dace.SDFG, match: list[Move]) -> None:
        # All moves were found on the program as it was: adding states changes no position's blocks.
        for move in match:
            region = move.before.parent_graph
            target = region.add_state_before(move.before, label=f"fill_before_{move.before.label}",
                                             is_start_block=region.start_block is move.before)
            for component in move.components:
                edges = [e for n in component for e in move.state.out_edges(n)]
                for n in component:
                    move.state.remove_node(n)
                for n in component:
                    target.add_node(n)
                for e in edges:
                    target.add_edge(e.src, e.src_conn, e.dst, e.dst_conn, e.data)
        sdfg.reset_cfg_list()
