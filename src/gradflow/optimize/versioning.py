"""`version_by_size`: inside loops, a map of symbolic size runs in parallel only when it is large.

`choose_schedules` decides from constant sizes; a map whose size is symbolic (`C[i, :i + 1] += ...` in
nb_syrk: `i + 1` elements, its loop variable bounded by the program's `N`) is assumed large and stays
parallel. At the top level of a program that costs one parallel region; inside sequential loops it costs
one per iteration: OpenMP opens a team even for one thread (about 0.35 us with one thread, 1.8 us with
two, on this machine), and an `if` clause on the pragma does not avoid it. nb_syrk's forward opened
48,000 of them around ~120 multiply-adds each: 18 ms, against 1.6 ms for the same loops sequential.
Whether the map is large is known only at run time, so a state inside a loop that holds such maps becomes
a conditional block with two versions of it: the maps parallel when each of them does at least
`min_parallel` iterations (counted as in `choose_schedules`), sequential otherwise.

A copy of the state is made for the sequential version; states holding nested SDFGs are left alone (their
copies would share symbols and data descriptors with the original in ways a plain copy does not
maintain).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import dace
from dace.properties import CodeBlock
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.names import private_copies
from gradflow.core.passes import Pass, PassResult, register_pass
from gradflow.optimize.schedules import make_sequential, work

_SUFFIX = "_by_size"


def _in_loop(block) -> bool:
    """Some enclosing control-flow region, in this SDFG or one that nests it, is a loop."""
    region = block.parent_graph
    while region is not None:
        if isinstance(region, LoopRegion):
            return True
        if isinstance(region, dace.SDFG):
            state = region.parent  # the state holding the nested SDFG node, or None at the root
            if state is None:
                return False
            region = state.parent_graph
        else:
            region = region.parent_graph
    return False


def _symbolic_maps(state: dace.SDFGState) -> list[tuple[nd.MapEntry, object]]:
    found = []
    for node in state.nodes():
        if (isinstance(node, nd.MapEntry) and node.map.schedule == dace.ScheduleType.Default
                and state.entry_node(node) is None):
            count = work(state, node)
            try:
                int(count)
            except TypeError:
                found.append((node, count))
    return found


def _versioned(state: dace.SDFGState) -> bool:
    """`state` is one of the two versions this pass made (so it is not versioned again)."""
    block = state.parent_graph.parent_graph
    return isinstance(block, ConditionalBlock) and block.label.endswith(_SUFFIX)


def _candidates(sdfg: dace.SDFG) -> list[dace.SDFGState]:
    return [s for s in sdfg.states()
            if not any(isinstance(n, nd.NestedSDFG) for n in s.nodes())
            and not _versioned(s) and _symbolic_maps(s) and _in_loop(s)]


def _state_locals(state: dace.SDFGState) -> set[str]:
    """Transients accessed in `state` and nowhere else in its SDFG (no other state, no condition or
    interstate assignment)."""
    sdfg = state.sdfg
    names = {n.data for n in state.data_nodes() if n.desc(sdfg).transient}
    for other in sdfg.states():
        if other is not state:
            names -= {n.data for n in other.data_nodes()}
    for edge in sdfg.all_interstate_edges():
        names -= set(edge.data.read_symbols())
    for block in (*sdfg.all_control_flow_regions(), *sdfg.all_control_flow_blocks()):
        for code in getattr(block, "get_meta_codeblocks", tuple)():
            names -= {str(s) for s in code.get_free_symbols()}
    return names


def _rename(state: dace.SDFGState, names: set[str]) -> None:
    """Give the data `names` in `state` (a copy, already in its SDFG) descriptors of their own."""
    fresh = private_copies(state.sdfg, names, "_seq")
    for node in state.data_nodes():
        if node.data in fresh:
            node.data = fresh[node.data]
    for edge in state.edges():
        if edge.data.data in fresh:
            edge.data.data = fresh[edge.data.data]


def _version(state: dace.SDFGState, min_parallel: int) -> None:
    region = state.parent_graph
    maps = _symbolic_maps(state)
    local = _state_locals(state)
    sizes = dict.fromkeys(dace.symbolic.symstr(count, cpp_mode=False) for _, count in maps)
    condition = " and ".join(f"(({size}) >= {min_parallel})" for size in sizes)
    small = copy.deepcopy(state)
    small.label = f"{state.label}_sequential"

    block = ConditionalBlock(f"{state.label}{_SUFFIX}", sdfg=region.sdfg)
    was_start = region.start_block is state
    incoming = [(e.src, e.data) for e in region.in_edges(state)]
    outgoing = [(e.dst, e.data) for e in region.out_edges(state)]
    region.remove_node(state)
    region.add_node(block, is_start_block=was_start)
    for src, data in incoming:
        region.add_edge(src, block, data)
    for dst, data in outgoing:
        region.add_edge(block, dst, data)
    for body, label, cond in ((state, "parallel", condition), (small, "sequential", None)):
        branch = ControlFlowRegion(f"{state.label}_{label}", sdfg=region.sdfg)
        branch.add_node(body, is_start_block=True)
        block.add_branch(CodeBlock(cond) if cond else None, branch)
    # Own descriptors for the copy's state-local data. Shared by the two versions, DaCe would allocate
    # them once for the whole program: outside the parallel map (a race between its threads), and before
    # the loop defines the symbols of their sizes.
    _rename(small, local)
    for entry, _ in _symbolic_maps(small):
        make_sequential(small, entry)


@register_pass
@attrs.frozen
class VersionBySize(Pass):
    """States inside loops whose maps have symbolic sizes get a parallel and a sequential version, chosen at
    run time by the maps' sizes (see the module docstring)."""

    min_parallel: int = 2048
    name: ClassVar[str] = "version_by_size"

    def run(self, graph: Graph) -> PassResult:
        if not any(_candidates(s) for s in graph.sdfg.all_sdfgs_recursive()):
            return Success(graph)
        sdfg = graph.editable()
        for sub in list(sdfg.all_sdfgs_recursive()):
            for state in _candidates(sub):
                _version(state, self.min_parallel)
        sdfg.reset_cfg_list()
        return Success(Graph.adopt(sdfg, graph.meta))
