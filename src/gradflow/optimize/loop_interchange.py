"""`move_loops_into_maps`: a loop around one map, walking an array along its rows while the map walks across
them, becomes the map around the loop.

numpy code builds a matrix a column at a time: `for j in range(1, M): P[:, j] = P[:, j - 1] * t` (GradBench's
llsq). Each iteration is a map over the rows that touches one element per row, a row's length apart: the
loop passes over the whole matrix M times, a cache line for every element, and with a row of 1 KiB the lines
fall into a few cache sets (llsq's primal at n = 4096: 2.6x JAX). With the map outside, each row is built
by one iteration of the map, its loop walking it contiguously.

The proof is gradflow's own, on the map's exact memlets (DaCe's `MoveLoopIntoMap` does the rewriting; its
applicability check must agree, but is not the proof): after the interchange, each point of the map runs all
the loop's iterations in order, and different points run in any order. That keeps the results when no
element is touched by two different points of the map, in any two iterations of the loop, with one of
them writing it. Shown per array the map writes: every access of it in the map is one element, and a set
of its dimensions holds, in every access, the same map parameter plus the same offset (free of the loop
variable and of the parameters), each parameter in one of them. Two points that differ in a parameter
then differ in that dimension of every element they touch. Arrays the loop only reads are free. Nothing
after the loop reads its variable (Python keeps its last value; after the rewrite it is set inside the map
only).

Scope-local temporaries of the map's body (two fused maps' `__map_fusion_t`) are allowed when each
iteration writes them before reading them. DaCe's rewrite takes loops of step 1 or -1 only.

The rewrite applies where it pays: the loop's variable indexes a written array in its contiguous (unit
stride) dimension, which the map's own dimensions are not. A loop around a map along the rows
(`for t: A[:] = 2 * A`) keeps its shape.
"""

from __future__ import annotations

import re
from typing import ClassVar, Iterator

import attrs
import dace
import sympy
from dace import symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, LoopRegion
from dace.transformation.interstate import MoveLoopIntoMap

from gradflow.analysis.access import covers_array
from gradflow.analysis.dependence import accessed_at_one_node
from gradflow.analysis.indices import affine_row, same_value
from gradflow.analysis.loops import counted_loop
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass


def _the_map(loop: LoopRegion) -> tuple[dace.SDFGState, nd.MapEntry] | None:
    """The loop's body when it is one state holding one map of Python tasklets, and access nodes outside it
    connected only to the map; else None."""
    blocks = loop.nodes()
    if len(blocks) != 1 or not isinstance(blocks[0], dace.SDFGState):
        return None
    state = blocks[0]
    scope = state.scope_dict()
    entries = [n for n in state.nodes() if isinstance(n, nd.MapEntry) and scope[n] is None]
    if len(entries) != 1:
        return None
    entry = entries[0]
    exit_ = state.exit_node(entry)
    body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    for n in body:
        if isinstance(n, nd.AccessNode):
            if not _iteration_local(state, n):
                return None
        elif not (isinstance(n, nd.Tasklet) and n.language == dace.Language.Python):
            return None
    for n in state.nodes():
        if scope[n] is None and n not in (entry, exit_) and not isinstance(n, nd.AccessNode):
            return None
    for e in state.edges():
        if scope[e.src] is None and scope[e.dst] is None and not (e.dst is entry or e.src is exit_):
            return None  # a copy between access nodes beside the map
        if e.data.is_empty() and (e.dst is entry or e.src is exit_):
            return None
    return state, entry


def _iteration_local(state: dace.SDFGState, node: nd.AccessNode) -> bool:
    """A temporary of one iteration of the map's body (`__map_fusion_t` of two fused maps): transient, with
    this one access node in the SDFG, written there before anything reads it. Moved into the loop, each
    iteration writes all of it again before reading it: no value passes from one iteration to another."""
    desc = state.sdfg.arrays[node.data]
    return (desc.transient and not isinstance(desc, dace.data.View) and state.in_degree(node) > 0
            and all(not e.data.is_empty() and e.data.wcr is None and not e.data.dynamic
                    and covers_array(state.sdfg, e.data) for e in state.in_edges(node))
            and accessed_at_one_node(state.sdfg, node.data))


def _inner_accesses(state: dace.SDFGState, entry: nd.MapEntry) -> Iterator[tuple[str, object, bool]]:
    """(array, subset, written?) of each memlet between the map's scope nodes and its body."""
    exit_ = state.exit_node(entry)
    for e in state.out_edges(entry):
        if not e.data.is_empty():
            yield e.data.data, e.data.subset, False
    for e in state.in_edges(exit_):
        if not e.data.is_empty():
            yield e.data.data, e.data.subset, True


def _owned_dims(accesses: list, params: list, var: str) -> dict[int, int] | None:
    """{dimension: parameter index} held by the same parameter plus the same offset in every access (module
    doc), covering every parameter; None when there is no such set."""
    symbols = [symbolic.pystr_to_symbolic(p) for p in params]
    common: dict[int, tuple[int, object]] | None = None
    for subset in accesses:
        found = {}
        for d, (begin, end, _) in enumerate(subset.ndrange()):
            if not same_value(begin, end):
                return None  # more than one element
            begin = symbolic.pystr_to_symbolic(str(begin))
            row = affine_row(begin, symbols, others=[var])
            if row is None or sorted(row) != [0] * (len(row) - 1) + [1]:
                continue
            k = row.index(1)
            found[d] = (k, sympy.expand(begin - symbols[k]))
        if common is None:
            common = found
        else:
            common = {d: v for d, v in common.items()
                      if d in found and found[d][0] == v[0] and same_value(found[d][1], v[1])}
    if not common or sorted({k for k, _ in common.values()}) != list(range(len(params))):
        return None
    return {d: k for d, (k, _) in common.items()}


def _walks_contiguously(sdfg: dace.SDFG, name: str, accesses: list, owned: dict[int, int], var: str) -> bool:
    """The loop variable indexes a unit-stride dimension of the array that the map's dimensions are not."""
    strides = sdfg.arrays[name].strides
    unit = [d for d, s in enumerate(strides) if same_value(s, 1)]
    return any(d not in owned and any(var in {str(s) for s in sympy.sympify(sub.ndrange()[d][0]).free_symbols}
                                      for sub in accesses) for d in unit)


def _rebinds(block, var: str, loop: LoopRegion) -> bool:
    """`block` lies in (or is) another loop over `var`: what it reads of `var` that loop set."""
    while block is not None and not isinstance(block, dace.SDFG):
        if isinstance(block, LoopRegion) and block is not loop and block.loop_variable == var:
            return True
        block = block.parent_graph
    return False


def _read_after(loop: LoopRegion, var: str) -> bool:
    """Does anything outside the loop read its variable (Python keeps its last value after the loop)? After
    the interchange it is set only inside the map. Another loop over the same name sets its own."""
    named = re.compile(rf"\b{re.escape(var)}\b")
    inside = set(loop.all_control_flow_blocks()) | {loop}
    sdfg = loop.sdfg
    for block in sdfg.all_control_flow_blocks():
        if block in inside or _rebinds(block, var, loop):
            continue
        if isinstance(block, dace.SDFGState) and var in {str(s) for s in block.free_symbols}:
            return True
        if isinstance(block, ConditionalBlock) and any(
                cond is not None and named.search(cond.as_string) for cond, _ in block.branches):
            return True
    for edge in sdfg.all_interstate_edges():
        if edge.src not in inside and not _rebinds(edge.src, var, loop) and var in {
                str(s) for s in edge.data.free_symbols}:
            return True
    return False


def interchangeable(loop: LoopRegion) -> bool:
    """The loop may become the body of its map, and gains by it (module doc)."""
    found = _the_map(loop)
    if found is None or counted_loop(loop, frozenset()) is None or _read_after(loop, loop.loop_variable):
        return False
    state, entry = found
    var = loop.loop_variable
    if var in {str(s) for s in entry.map.range.free_symbols}:
        return False
    by_array: dict[str, list] = {}
    written: set[str] = set()
    for name, subset, is_write in _inner_accesses(state, entry):
        if subset is None:
            return False
        by_array.setdefault(name, []).append(subset)
        if is_write:
            written.add(name)
    pays = False
    for name in written:
        owned = _owned_dims(by_array[name], entry.map.params, var)
        if owned is None:
            return False
        pays = pays or _walks_contiguously(state.sdfg, name, by_array[name], owned, var)
    return pays


@register_pass
@attrs.frozen
class MoveLoopsIntoMaps(RewritePass):
    """A loop around one map walking an array contiguously becomes the map around the loop (module doc)."""

    name: ClassVar[str] = "move_loops_into_maps"
    strategy: ClassVar[str] = ONE_AT_A_TIME
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> Iterator:
        for region in sdfg.all_control_flow_regions():
            if isinstance(region, LoopRegion) and region.sdfg is sdfg and interchangeable(region):
                step = MoveLoopIntoMap()
                parent = region.parent_graph
                step.setup_match(sdfg, parent.cfg_id, -1, {MoveLoopIntoMap.loop: parent.node_id(region)}, 0)
                if step.can_be_applied(parent, 0, sdfg):
                    yield parent, step

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        parent, step = match
        step.apply(parent, sdfg)
        sdfg.reset_cfg_list()
