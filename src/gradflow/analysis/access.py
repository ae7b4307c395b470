"""Access patterns: where a program names an array, and how a map writes one.

Facts the optimization and canonicalization passes share, read off the graph without changing it:
- `accesses`, `touches`, `named_in_code`, `named_by_control`: where an array (or a symbol) is named: the
  access nodes of a state; anything in a block; a loop's or a conditional's own code; any control flow;
- `covers_array`: a memlet's subset covers its whole array;
- `ElementWrite` / `element_write`: a top-level map whose one tasklet writes every element of an array
  exactly once (plain or as a sum);
- `chain_of`, `chained_states`: the blocks of a region that form one chain, where a pass may reason about
  "the blocks after this state";
- `runs_right_after`, `successive_states`: two states the second of which always runs right after the
  first, which a pass may join into one.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

import attrs
import dace
import sympy
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.core.exact_subsets import covers
from gradflow.core.wcr import reduction_type


def covers_array(sdfg: dace.SDFG, memlet: dace.Memlet) -> bool:
    """The memlet's subset covers its whole array."""
    whole = dace.subsets.Range.from_array(sdfg.arrays[memlet.data])
    return memlet.subset is not None and covers(memlet.subset, whole)


def accesses(state: dace.SDFGState, name: str) -> list[nd.AccessNode]:
    """The access nodes of `state` naming `name`."""
    return [n for n in state.data_nodes() if n.data == name]


def named_in_code(block, name: str) -> bool:
    """`name` appears in a loop's or a conditional's own code (its condition, init or update) in `block`."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    for region in block.all_control_flow_regions():
        codes = []
        if isinstance(region, LoopRegion):
            codes = [region.loop_condition, region.init_statement, region.update_statement]
        elif isinstance(region, ConditionalBlock):
            codes = [condition for condition, _ in region.branches]
        if any(code is not None and word.search(code.as_string) for code in codes):
            return True
    return False


def named_by_control(sdfg: dace.SDFG, name: str) -> bool:
    """An interstate edge, or a loop's or a conditional's own code, anywhere in `sdfg` names `name`."""
    return (any(name in map(str, e.data.free_symbols) for e in sdfg.all_interstate_edges(recursive=True))
            or named_in_code(sdfg, name))


def control_names(sdfg: dace.SDFG) -> frozenset[str]:
    """Every name `named_by_control(sdfg, name)` is true of, found in one walk (for passes that ask it of
    many names): the free symbols of every interstate edge and the words of loops' and conditionals' code.
    Also of a block (a loop, a conditional, a region) and everything inside it."""
    names = {str(s) for e in sdfg.all_interstate_edges(recursive=True) for s in e.data.free_symbols}
    for region in sdfg.all_control_flow_regions():  # as `named_in_code`: this SDFG's own regions
        codes = []
        if isinstance(region, LoopRegion):
            codes = [region.loop_condition, region.init_statement, region.update_statement]
        elif isinstance(region, ConditionalBlock):
            codes = [condition for condition, _ in region.branches]
        names.update(w for code in codes if code is not None for w in re.findall(r"\w+", code.as_string))
    return frozenset(names)


def touches(block, name: str) -> bool:
    """`block` (a state, or a region with everything in it) names `name`: an access node, a symbol of an
    interstate edge, a loop's or a conditional's own code."""
    if isinstance(block, dace.SDFGState):
        return bool(accesses(block, name))
    return (any(isinstance(n, nd.AccessNode) and n.data == name for n, _ in block.all_nodes_recursive())
            or any(name in e.data.free_symbols for e in block.all_interstate_edges(recursive=True))
            or named_in_code(block, name))


def _assigns(tasklet: nd.Tasklet, connector: str) -> bool:
    """The tasklet's Python code assigns `connector` in a statement of its own, not under a condition."""
    if tasklet.code.language != dace.Language.Python:
        return False
    return any(isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == connector
                                                    for t in stmt.targets)
               for stmt in tasklet.code.code)


def assigns_zero(tasklet: nd.Tasklet, connector: str) -> bool:
    """The tasklet's Python code assigns `connector` once, in a statement of its own: the constant 0."""
    if tasklet.code.language != dace.Language.Python:
        return False
    targets = [t for stmt in tasklet.code.code for node in ast.walk(stmt)
               if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    named = [t for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == connector]
    return len(named) == 1 and any(
        isinstance(stmt, ast.Assign) and stmt.targets == named and isinstance(named[0], ast.Name)
        and isinstance(stmt.value, ast.Constant)
        and type(stmt.value.value) in (int, float) and stmt.value.value == 0 for stmt in tasklet.code.code)


@attrs.frozen
class ElementWrite:
    """A top-level map whose one tasklet writes `data[p0, p1, ...]` of a whole array, one dimension per
    parameter of its enclosing maps (each once, each over a whole dimension): every element is written by
    exactly one iteration."""

    tasklet: nd.Tasklet
    leaf: object  # the tasklet's edge into the map exit
    edges: tuple  # every edge of the write's memlet tree, the outer one first
    params: tuple[str, ...]  # the parameter indexing each dimension
    wcr: str | None


def scope_ranges(state: dace.SDFGState, node) -> dict[str, tuple]:
    """The parameters of every map around `node` in `state` -> their (begin, end, step) ranges."""
    ranges: dict[str, tuple] = {}
    scope = state.entry_node(node)
    while scope is not None:
        ranges.update({str(p): r for p, r in zip(scope.map.params, scope.map.range)})
        scope = state.entry_node(scope)
    return ranges


def element_write(state: dace.SDFGState, edge) -> ElementWrite | None:
    """The `ElementWrite` behind `edge` (a map exit into an access node), or None. A sum must be the only
    write-conflict resolution; the tasklet's Python code must assign the connector unconditionally."""
    if not isinstance(edge.src, nd.MapExit) or edge.data.dynamic:
        return None
    if state.entry_node(state.entry_node(edge.src)) is not None:  # (an exit's scope is its own map)
        return None
    if edge.data.wcr is not None and reduction_type(edge.data.wcr) != dace.dtypes.ReductionType.Sum:
        return None
    tree = state.memlet_tree(edge)
    leaves = tree.leaves()
    if len(leaves) != 1:
        return None
    leaf = leaves[0]
    tasklet = leaf.src
    if not isinstance(tasklet, nd.Tasklet) or leaf.data.dynamic or not _assigns(tasklet, leaf.src_conn):
        return None
    ranges = scope_ranges(state, tasklet)
    shape = state.sdfg.arrays[edge.data.data].shape
    subset = leaf.data.subset
    if subset is None or len(subset) != len(shape):
        return None
    used = []
    for (begin, end, _), size in zip(subset, shape):
        param = str(begin)
        if begin != end or param not in ranges or param in used:
            return None
        low, high, stride = ranges[param]
        if stride != 1 or sympy.simplify(low) != 0 or sympy.simplify(high - (size - 1)) != 0:
            return None
        used.append(param)
    if set(used) != set(ranges) or not covers_array(state.sdfg, edge.data):
        return None
    edges = tuple(node.edge for node in tree.traverse_children(include_self=True))
    return ElementWrite(tasklet, leaf, edges, tuple(used), edge.data.wcr)


def chain_of(region: ControlFlowRegion) -> list | None:
    """The blocks of `region` in order when they form a chain, else None."""
    start = region.start_block
    order, block = [start], start
    while region.out_degree(block):
        if region.out_degree(block) != 1:
            return None
        block = region.out_edges(block)[0].dst
        if block in order:
            return None
        order.append(block)
    return order if len(order) == len(region.nodes()) else None


def chained_states(sdfg: dace.SDFG) -> Iterator[tuple[ControlFlowRegion, list, int, dace.SDFGState]]:
    """(region, its blocks in order, k, the k-th block) for every state of a region whose blocks form one
    chain (`chain_of`): where passes may reason about "the blocks after this state"."""
    for region in sdfg.all_control_flow_regions():
        if not isinstance(region, ControlFlowRegion) or not region.nodes():
            continue
        order = chain_of(region)
        if order is None:
            continue
        for k, block in enumerate(order):
            if isinstance(block, dace.SDFGState):
                yield region, order, k, block


def runs_right_after(region: ControlFlowRegion, first: dace.SDFGState, second: dace.SDFGState) -> bool:
    """`second` runs right after `first`, every time, and nothing else: the one edge between them is
    unconditional and assigns nothing, `first` has no other successor, `second` no other predecessor and
    is not where `region` starts."""
    if region.out_degree(first) != 1 or region.in_degree(second) != 1 or region.start_block is second:
        return False
    edge = region.out_edges(first)[0]
    return edge.dst is second and edge.data.is_unconditional() and not edge.data.assignments


def successive_states(sdfg: dace.SDFG) -> Iterator[tuple[ControlFlowRegion, dace.SDFGState, dace.SDFGState]]:
    """(region, A, B) for every two states of `sdfg`'s regions where B runs right after A
    (`runs_right_after`): the pairs a pass may join into one state (lazy, for `ONE_AT_A_TIME`)."""
    for region in sdfg.all_control_flow_regions():
        for second in region.nodes():
            if not isinstance(second, dace.SDFGState) or region.in_degree(second) != 1:
                continue
            first = region.in_edges(second)[0].src
            if isinstance(first, dace.SDFGState) and runs_right_after(region, first, second):
                yield region, first, second
