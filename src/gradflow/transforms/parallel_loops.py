"""`loops_to_maps`: a counted loop whose iterations are independent becomes a map.

Reverse mode handles a loop by replaying it backwards: every value an iteration overwrites is pushed on
a tape in the forward sweep and popped in the backward one. A map needs none of that (its reverse is a
map of the adjoints, reading the forward values where they are). NPBench and the loop corpus write many
loops that are maps in disguise: `for i: for j: S[0] += B[i, j] * B[i, j] * A[j, i]` (go_fast) pushed four
scalars per iteration, a million of them, and popped them again; as a map with a sum into `S` it has no
tape (lp_go_fast's forward and backward 11.4 -> 7.6 ms, with `own_scatter_writes` adding the two
adjoints of `B[i, j]` in one map; its backward is three plain maps).

What the pass does, on a private copy:
1. additions only: `x[k] = x[k] + e` (a top-level tasklet of a loop body reading and writing the same
   element) becomes a write-conflict sum `x[k] += e`, so that iterations adding into one element no
   longer depend on each other through that read (`_sums_in_loops`; DaCe's `AugAssignToWCR` lost the
   copy that fed the other operand when the state also read the array elsewhere);
2. `LoopToMap`, applied only to loops whose body is one state of tasklets on single elements, or one
   map of them (what a converted inner loop left), so that the map is one reverse mode differentiates,
   and only when gradflow's own dependence test (`analysis.dependence.loop_independence`) proves the
   iterations independent: no element written by one iteration is read or written by another, a sum
   included (DaCe's own check, which must also agree, let a sum that other iterations read through);
   and not when the body reads an array it overwrites at another element (no reverse for such a map);
   innermost loops first so that a nest becomes a nest of maps;
3. `InlineSDFG`: the one-state body `LoopToMap` nested goes back into the map (`collapse_maps`, later in
   `NORMALIZE`, merges a nest of such maps).
Other loops stay loops: a multi-state body would stay a nested SDFG inside the map, and a map around
slice operations (`x[:i + 1] *= b` in a loop) would hold maps that are not perfectly nested. Under reverse
mode (`ragged=False`, as `NORMALIZE` runs it) a loop around a map whose range depends on the loop's variable
(`for i: for j in range(i + 1): s += ...`, a triangle) stays a loop too: `collapse_maps` cannot make such a
nest one map, and reverse mode differentiates one map (until 2026-12-05 the triangle was refused). When no
loop converts, the input is returned unchanged (step 1 is not kept on its own).
"""

from __future__ import annotations

import ast
import copy
from typing import ClassVar, Iterable

import attrs
import dace
import networkx as nx
from dace.sdfg import nodes as nd
from dace.sdfg.propagation import propagate_memlets_sdfg
from dace.sdfg.state import LoopRegion
from dace.transformation.interstate import InlineSDFG, LoopToMap, StateFusion
from returns.result import Success

from gradflow.analysis.dependence import body_accesses, loop_independence
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass
from gradflow.core.wcr import SUM


def _accumulation(state: dace.SDFGState, tasklet: nd.Tasklet) -> tuple | None:
    """(the edge reading the target, the edge writing it, the expression added) when the top-level tasklet is
    `out = t + e` (or `e + t`) with `t` read from exactly the element `out` writes and `e` not reading `t`."""
    if tasklet.language is not dace.Language.Python or len(tasklet.code.code) != 1:
        return None
    stmt = tasklet.code.code[0]
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add)):
        return None
    outs = [e for e in state.out_edges(tasklet) if e.src_conn == stmt.targets[0].id]
    if len(outs) != 1 or len(state.out_edges(tasklet)) != 1:
        return None
    write = outs[0]
    if not isinstance(write.dst, nd.AccessNode) or write.data.wcr is not None or write.data.dynamic \
            or write.data.data != write.dst.data:
        return None
    for target, added in ((stmt.value.left, stmt.value.right), (stmt.value.right, stmt.value.left)):
        if not isinstance(target, ast.Name) or any(isinstance(n, ast.Name) and n.id == target.id
                                                   for n in ast.walk(added)):
            continue
        reads = [e for e in state.in_edges(tasklet) if e.dst_conn == target.id]
        if len(reads) == 1 and isinstance(reads[0].src, nd.AccessNode) and reads[0].src.data == write.dst.data \
                and reads[0].data.data == write.data.data and reads[0].data.subset == write.data.subset:
            return reads[0], write, added
    return None


def _sums_in_loops(sdfg: dace.SDFG) -> int:
    """Rewrite each top-level tasklet of a loop body that adds into the element it reads (`t[k] = t[k] + e`)
    as a write-conflict sum (`t[k] += e`), so iterations adding into one element no longer read it. Only the
    tasklet's own read of the element goes: any other read of the array in the state (`e` reading `t[k]`
    through a copy, as `m[0] += 0.5 * (x[i] - m[0])` does) stays, and the dependence test sees it. (DaCe's
    `AugAssignToWCR` moved such a tasklet into a state of its own and lost the copy its other operand came
    through: the sum read an uninitialised temporary.) Returns how many were rewritten."""
    rewritten = 0
    for loop in _loops(sdfg):
        for state in loop.nodes():
            if not isinstance(state, dace.SDFGState):
                continue
            for tasklet in [n for n in state.nodes() if isinstance(n, nd.Tasklet) and state.entry_node(n) is None]:
                found = _accumulation(state, tasklet)
                if found is None:
                    continue
                read, write, added = found
                source = read.src
                state.remove_edge(read)
                tasklet.remove_in_connector(read.dst_conn)
                if state.degree(source) == 0:
                    state.remove_node(source)
                tasklet.code = dace.properties.CodeBlock(f"{write.src_conn} = {ast.unparse(added)}")
                write.data.wcr = SUM
                rewritten += 1
    return rewritten


def _loops(sdfg: dace.SDFG) -> list[LoopRegion]:
    return [b for b in sdfg.all_control_flow_regions(recursive=True) if isinstance(b, LoopRegion)]


def _elementwise(state: dace.SDFGState, nodes, outside: set[str]) -> bool:
    """`nodes` are tasklets and access nodes, the transients among them single elements or data that the
    program also uses outside the loop."""
    for node in nodes:
        if isinstance(node, nd.AccessNode):
            desc = node.desc(state.sdfg)
            if desc.transient and node.data not in outside and desc.total_size != 1:
                return False
        elif not isinstance(node, nd.Tasklet):
            return False
    return True


def _eligible(loop: LoopRegion, ragged: bool = True) -> bool:
    """The body is one state whose map would be one reverse mode differentiates: tasklets on single
    elements (a map body holding other maps is not), or one map of such tasklets (the loop around a
    converted one) and nothing else but access nodes, which `collapse_maps` later makes one map; unless
    `ragged`, only a map whose range does not depend on the loop's variable (which it could not)."""
    body = loop.nodes()
    if len(body) != 1 or not isinstance(body[0], dace.SDFGState):
        return False
    state = body[0]
    outside = {n.data for s in state.sdfg.states() if s is not state for n in s.data_nodes()}
    top = [n for n in state.nodes() if state.entry_node(n) is None]
    maps = [n for n in top if isinstance(n, nd.MapEntry)]
    if not maps:
        return _elementwise(state, top, outside)
    if len(maps) != 1:
        return False
    if not ragged and loop.loop_variable in map(str, maps[0].map.range.free_symbols):
        return False
    exit_ = state.exit_node(maps[0])
    rest = [n for n in top if n is not maps[0] and n is not exit_]
    return (all(isinstance(n, nd.AccessNode) for n in rest)
            and _elementwise(state, state.scope_subgraph(maps[0], include_entry=False, include_exit=False).nodes(),
                             outside))


def _state_chain(loop: LoopRegion) -> bool:
    return len(loop.nodes()) > 1 and all(isinstance(b, dace.SDFGState) for b in loop.nodes())


def _fuse_body(loop: LoopRegion) -> None:
    """Merge a loop body that is a chain of states into one state where DaCe's `StateFusion` can (the
    frontend writes `P[i, j] = np.exp(X[i, j] - m); s += P[i, j]` as six states)."""
    while _state_chain(loop):
        first = loop.start_block
        out = loop.out_edges(first)
        if len(out) != 1 or out[0].data.assignments or not out[0].data.is_unconditional():
            return
        fusion = StateFusion()
        fusion.setup_match(loop.sdfg, loop.cfg_id, -1, {StateFusion.first_state: loop.node_id(first),
                                                         StateFusion.second_state: loop.node_id(out[0].dst)}, 0)
        if not fusion.can_be_applied(loop, 0, loop.sdfg):
            return
        fusion.apply(loop, loop.sdfg)


def _forward_written_elements(state: dace.SDFGState) -> None:
    """Where a tasklet writes one element of an array and the same state then copies that element into a
    one-element transient (`P[i, j] = e; s += P[i, j]`), the tasklet writes the transient and the array is
    copied from it: the array then has no reader in the state. DaCe cannot inline the body of a
    `LoopToMap` map back into the map otherwise (an output of a nested SDFG in a map must not be read
    there).

    The copy into the array then ends a path of its own: whatever came after the array's node through
    its read is no longer ordered after that write. Not done when a later access node of the same array
    is among those (`S[0] = 2.0; S[0] = S[0] + 2.0`: the second write would race the copy of the first;
    `gradflow fuzz --seed 31236`, programs 27-28, where S lost the addition), nor when the transient has
    another writer."""
    for node in list(state.data_nodes()):
        writes = state.in_edges(node)
        if len(writes) != 1 or not isinstance(writes[0].src, nd.Tasklet):
            continue
        write = writes[0]
        if write.data.wcr is not None or write.data.data != node.data or write.data.subset is None \
                or write.data.subset.num_elements() != 1:
            continue
        reads = [r for r in state.out_edges(node)
                 if isinstance(r.dst, nd.AccessNode) and r.data.data == node.data and r.data.wcr is None
                 and r.dst.desc(state.sdfg).transient and r.dst.desc(state.sdfg).total_size == 1
                 and r.data.src_subset == write.data.subset]
        if len(reads) != 1 or state.out_degree(node) != 1:
            continue
        holder = reads[0].dst
        if state.in_degree(holder) != 1 or any(isinstance(later, nd.AccessNode) and later.data == node.data
                                               for later in nx.descendants(state.nx, holder)):
            continue
        one = dace.subsets.Range.from_array(holder.desc(state.sdfg))
        state.remove_edge(write)
        state.remove_edge(reads[0])
        # each memlet its own subset objects: DaCe's validation refuses one subset in two memlets
        state.add_edge(write.src, write.src_conn, holder, None, dace.Memlet(data=holder.data, subset=one))
        state.add_edge(holder, None, node, None, dace.Memlet(data=node.data, subset=copy.deepcopy(write.data.subset),
                                                             other_subset=copy.deepcopy(one)))


def _rereads_overwritten(state: dace.SDFGState) -> str | None:
    """An array the body overwrites and reads at another element, if any. Such a loop may be a map, but
    not one reverse mode differentiates (the map's reverse would read elements other iterations
    overwrote): it stays a loop, reversed as a loop."""
    accesses = body_accesses(state)
    written_at: dict[str, set[str]] = {}
    for access in accesses:
        if access.kind == "write":
            written_at.setdefault(access.array, set()).add(access.subset)
    for access in accesses:
        if access.kind == "read" and access.array in written_at and access.subset not in written_at[access.array]:
            return access.array
    return None


def _to_map(sdfg: dace.SDFG, loop: LoopRegion) -> bool:
    """Apply `LoopToMap` to `loop` when gradflow's own dependence test proves its iterations independent
    (`analysis.dependence`) and the map would be one reverse mode differentiates; DaCe's applicability
    check must agree too (it does the rewriting), but is never the proof."""
    verdict = loop_independence(loop)
    if not verdict.independent or _rereads_overwritten(loop.nodes()[0]) is not None:
        return False
    assert verdict.counted is not None  # `loop_independence` finds iterations independent only in a counted loop
    if verdict.counted.step < 0:
        # DaCe's LoopToMap gives `range(M - 1, 1, -2)` a map over one value too few when the span is even
        # (`gradflow fuzz --seed 203`, program 596): a descending loop is not rewritten
        return False
    region = loop.parent_graph
    step = LoopToMap()
    step.setup_match(region.sdfg, region.cfg_id, -1, {LoopToMap.loop: region.node_id(loop)}, 0)
    if not step.can_be_applied(region, 0, region.sdfg):
        return False
    step.apply(region, region.sdfg)
    return True


def _inline(node: nd.NestedSDFG, state: dace.SDFGState) -> bool:
    inline = InlineSDFG()
    inline.setup_match(state.sdfg, state.parent_graph.cfg_id, state.block_id,
                       {InlineSDFG.nested_sdfg: state.node_id(node)}, 0)
    if not inline.can_be_applied(state, 0, state.sdfg):
        return False
    inline.apply(state, state.sdfg)
    _sums_along_paths(state)
    return True


def _sums_along_paths(state: dace.SDFGState) -> None:
    """Give every edge on the path of a write-conflict sum the sum: `InlineSDFG` leaves the edges out of
    the surrounding map plain, and `LoopToMap` then reads the outer loop's writes as conflicts."""
    for edge in state.edges():
        if edge.data.wcr is not None:
            for hop in state.memlet_path(edge):
                if hop.data.wcr is None and hop.data.data == edge.data.data:
                    hop.data.wcr = edge.data.wcr


def _nested(sdfg: dace.SDFG) -> list[tuple[nd.NestedSDFG, dace.SDFGState]]:
    return [(n, s) for n, s in sdfg.all_nodes_recursive() if isinstance(n, nd.NestedSDFG)]


def _convert(program: dace.SDFG, skip: set[str] | frozenset[str],
             ragged: bool = True) -> tuple[dace.SDFG, int, str | None]:
    """A copy of `program` with its loops converted, innermost first, except those labelled in `skip`:
    (copy, loops converted, label of a loop whose body could not be inlined back, or None)."""
    sdfg = copy.deepcopy(program)
    _sums_in_loops(sdfg)
    converted = 0
    progress = True
    while progress:
        progress = False
        sdfg.reset_cfg_list()
        for loop in reversed(_loops(sdfg)):  # listed outer first: reversed, inner loops come first
            if loop.label not in skip:
                _fuse_body(loop)
                if len(loop.nodes()) == 1 and isinstance(loop.nodes()[0], dace.SDFGState):
                    _forward_written_elements(loop.nodes()[0])
            if loop.label in skip or not _eligible(loop, ragged):
                continue
            before = {id(n) for n, _ in _nested(sdfg)}
            if not _to_map(sdfg, loop):
                continue
            for node, state in _nested(sdfg):
                if id(node) not in before and not _inline(node, state):
                    return sdfg, converted, loop.label
            converted += 1
            progress = True
            break
    sdfg.reset_cfg_list()
    if converted:
        # The map's outer memlets are the whole arrays `LoopToMap` gave its nested SDFG: narrowed to what
        # the iterations access, the tape saves a row where it saved the array.
        propagate_memlets_sdfg(sdfg)
    return sdfg, converted, None


def _labels(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@register_pass
@attrs.frozen
class LoopsToMaps(Pass):
    """Counted loops with independent iterations and one-state bodies become maps (see the module
    docstring). Loops labelled in `keep` stay loops: a forwarding policy that checkpoints a loop names it
    by its label (`ad_pipeline` passes those labels). `ragged`: whether a map may hold a map whose range
    depends on its parameter (yes for programs that run as they are, no before reverse mode)."""

    keep: frozenset[str] = attrs.field(default=frozenset(), converter=_labels)
    ragged: bool = True
    name: ClassVar[str] = "loops_to_maps"

    def run(self, graph: Graph) -> PassResult:
        # A loop becomes eligible only through an eligible loop inside it converting: without one to start
        # from, nothing converts (checked before the copy and the pattern matching, which `OPTIMIZE` would
        # otherwise spend on every differentiated program).
        if not any((_eligible(loop, self.ragged) or _state_chain(loop)) and loop.label not in self.keep
                   for loop in _loops(graph.sdfg)):
            return Success(graph)
        # One loop at a time, its body inlined before the next: the loop around a converted one then has
        # a one-state body with no nested SDFG, which DaCe's analysis can convert in turn. A loop whose
        # body cannot be inlined back is skipped, from a fresh copy.
        skip: set[str] = set(self.keep)
        while True:
            sdfg, converted, failed = _convert(graph.sdfg, skip, self.ragged)
            if failed is None:
                break
            skip.add(failed)
        if not converted:
            return Success(graph)
        return Success(Graph.adopt(sdfg, graph.meta))
