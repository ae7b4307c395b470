"""`version_by_size`: inside loops, a map of symbolic size runs in parallel only when it is large.

`choose_schedules` decides from constant sizes; a map whose size is symbolic (`C[i, :i + 1] += ...` in
nb_syrk: `i + 1` elements, its loop variable bounded by the program's `N`) is assumed large and stays
parallel. At the top level of a program that costs one parallel region; inside sequential loops it costs
one per iteration: OpenMP opens a team even for one thread (about 0.35 us with one thread, 1.8 us with
two, on this machine), and an `if` clause on the pragma does not avoid it. nb_syrk's forward opened
48,000 of them around ~120 multiply-adds each: 18 ms, against 1.6 ms for the same loops sequential.
Whether the map is large is known only at run time, so a state inside a loop that holds such maps becomes
a conditional block with two versions of it: the maps parallel when each of them does at least
`min_parallel` iterations (counted as in `choose_schedules`), sequential otherwise. A copy between two
arrays counts as such a map: DaCe lowers it to one when it compiles, with the default schedule; the
sequential version writes it as a sequential map itself (`_sequential_copies`).

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
from gradflow.core.names import private_copies, rename_data
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
            and not _versioned(s) and (_symbolic_maps(s) or _symbolic_copies(s)) and _in_loop(s)]


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


def _version(state: dace.SDFGState, min_parallel: int) -> None:
    region = state.parent_graph
    counts = [count for _, count in _symbolic_maps(state)] + [c.count for c in _symbolic_copies(state)]
    local = _state_locals(state)
    sizes = dict.fromkeys(dace.symbolic.symstr(count, cpp_mode=False) for count in counts)
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
    rename_data(small, private_copies(small.sdfg, local, "_seq"))
    for entry, _ in _symbolic_maps(small):
        make_sequential(small, entry)
    _sequential_copies(small)


def _element(subset, dims: tuple[int, ...], params: list[str]) -> str:
    """The element of `subset` whose index in its non-unit dimensions `dims` is `params`."""
    index, named = [], dict(zip(dims, params))
    for d, (begin, _end, step) in enumerate(subset):
        index.append(f"({begin}) + ({step}) * {named[d]}" if d in named else str(begin))
    return ", ".join(index)


@attrs.frozen
class _Copy:
    """A copy edge between two access nodes that `_sequential_copies` can write as a map: the subsets it
    reads and writes and their non-unit dimensions, paired in order with equal extents."""

    edge: object
    read: object
    written: object
    rdims: tuple[int, ...]
    wdims: tuple[int, ...]

    @property
    def count(self):
        return dace.symbolic.simplify(self.read.num_elements())


def _copies(state: dace.SDFGState) -> list[_Copy]:
    """The copies of `state` DaCe would lower to a map and a map can perform: a strided side (a contiguous
    block to a contiguous block is one memcpy: as a map, nb_deriche's forward was 1.30x slower), outside map
    scopes, not within one array (which may overlap), not through a View, without a write-conflict, between
    subsets of the same shape up to unit dimensions."""
    sdfg, found = state.sdfg, []
    for edge in state.edges():
        src, dst, memlet = edge.src, edge.dst, edge.data
        if (not isinstance(src, nd.AccessNode) or not isinstance(dst, nd.AccessNode) or memlet.is_empty()
                or memlet.wcr is not None or src.data == dst.data or state.entry_node(src) is not None
                or isinstance(src.desc(sdfg), dace.data.View) or isinstance(dst.desc(sdfg), dace.data.View)):
            continue
        read, written = memlet.get_src_subset(edge, state), memlet.get_dst_subset(edge, state)
        if read is None or written is None or (read.is_contiguous_subset(src.desc(sdfg))
                                               and written.is_contiguous_subset(dst.desc(sdfg))):
            continue  # DaCe copies a contiguous block with one memcpy, no OpenMP team
        rdims = tuple(d for d, n in enumerate(read.size()) if n != 1)
        wdims = tuple(d for d, n in enumerate(written.size()) if n != 1)
        if rdims and len(rdims) == len(wdims) and all(
                dace.symbolic.simplify(read.size()[a] - written.size()[b]) == 0 for a, b in zip(rdims, wdims)):
            found.append(_Copy(edge, read, written, rdims, wdims))
    return found


def _symbolic_copies(state: dace.SDFGState) -> list[_Copy]:
    found = []
    for copy_ in _copies(state):
        try:
            int(copy_.count)
        except TypeError:
            found.append(copy_)
    return found


def _sequential_copies(state: dace.SDFGState) -> None:
    """Copies between two access nodes of `state` (`_copies`) become sequential maps of the same elements.
    DaCe lowers a copy, when it compiles, into a nested SDFG whose map has the default (parallel) schedule:
    one OpenMP team per loop iteration, what the sequential version is for (llsq's column loop
    `P[:, j] = P[:, j - 1] * t` at 16 rows spent 0.28 us of its 0.29 us per iteration there)."""
    for c in _copies(state):
        src, dst = c.edge.src, c.edge.dst
        params = [f"__copy{k}" for k in range(len(c.rdims))]
        state.add_mapped_tasklet(
            f"copy_{src.data}_to_{dst.data}", {p: f"0:{c.read.size()[d]}" for p, d in zip(params, c.rdims)},
            {"__in": dace.Memlet(f"{src.data}[{_element(c.read, c.rdims, params)}]")}, "__out = __in",
            {"__out": dace.Memlet(f"{dst.data}[{_element(c.written, c.wdims, params)}]")},
            schedule=dace.ScheduleType.Sequential, input_nodes={src.data: src}, output_nodes={dst.data: dst},
            external_edges=True)
        state.remove_edge(c.edge)


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
