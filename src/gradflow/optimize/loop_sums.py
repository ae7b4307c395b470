"""`overwrite_loop_sums`: a gradient buffer that a loop's body first adds into and then resets is
overwritten by that first sum instead; the resets and the zeroing before the loop go.

Reverse mode keeps a gradient buffer zero between its uses: it zeroes the buffer before the backward
sweep, every adjoint adds its contribution (`g_k[i] += ...`), and the adjoint of the operation that wrote
`k` reads `g_k` and resets what it read (`g_k[i] = 0`), so that the next iteration of a reversed loop adds
into zeros again. Per iteration that is a read of the buffer by the first sum and a write by each reset,
and per call a zeroing pass: GradBench's ode reverses a Runge-Kutta step with five such buffers (the four
stages and the step's update; its gradient 7-8% faster without them at s = 1, `benchmarks/results/gradbench.md`).

The rewrite, for a transient buffer B and a loop L whose body's blocks form a chain:
- the first access of B in the body is a map adding into every element of B once (`ElementWrite`): it
  becomes a plain write;
- the resets of B in the body go, and so does the zeroing of B before L, when no read can see their zeros.

What it must show first, with gradflow's own analysis (it does nothing where it cannot):
1. B is zero before the first sum at every iteration. At the first, a map zeroes all of B before L in the
   same chain of blocks and nothing in between (blocks, interstate edges, L's own code) names B. At the
   next, the zero writes after the sum in the body cover all of B: each is a Python tasklet assigning the
   constant 0, alone or in a map whose subscripts are its parameters plus offsets (`_zero_region`), their
   regions chain end to start along one dimension (`_cover`), and no other write after one overlaps it.
   The body has no `break`, `continue` or `return`, no conditional edge between its blocks, and no symbol
   a zero region names is assigned in it.
2. The sum writes each element once, so the plain write gives each element the value the sum gave it.
3. A reset or the zeroing goes only where its zeros are read by nothing: nothing after L names B
   (`dead_stores.read_later`, which also refuses a loop around L), no access after the reset in the body
   overlaps it (in the reset's own map only the element the same iteration resets is read, before it is
   reset), and the next iteration's first access is the sum, which now overwrites all of B.
"""

from __future__ import annotations

from typing import ClassVar, Iterator

import attrs
import dace
import networkx as nx
import sympy
from dace import subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import BreakBlock, ContinueBlock, LoopRegion, ReturnBlock

from gradflow.analysis.access import (ElementWrite, accesses, assigns_zero, chain_of, element_write, named_in_code,
                                      scope_ranges, touches)
from gradflow.core.exact_subsets import exact_subsets
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass
from gradflow.optimize.dead_stores import KEPT_LIFETIMES, drop_writes, read_later, viewed_arrays
from gradflow.optimize.overwrite_zeroed_products import zeroing_maps


def _equal(a, b) -> bool:
    """`a` and `b` are provably the same integer expression (False where that cannot be shown)."""
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def _names(expr) -> set[str]:
    return {str(s) for s in sympy.sympify(expr).free_symbols}


def _zero_region(state: dace.SDFGState, edge, unstable: set[str]) -> subsets.Range | None:
    """The elements `edge` (into an access node) sets to zero, exactly, or None: one Python tasklet
    assigning the constant 0, at the top level of `state` (one element) or in maps whose every parameter
    indexes one dimension as `p + offset` over a range of step 1. `unstable`: symbols that may change
    between the write and where the region is used (then None)."""
    if edge.data.wcr is not None or edge.data.dynamic or not isinstance(edge.dst, nd.AccessNode):
        return None
    tree = state.memlet_tree(edge)
    leaves = tree.leaves()
    if len(leaves) != 1 or any(t.edge.data.wcr is not None for t in tree.traverse_children(include_self=True)):
        return None
    leaf = leaves[0]
    if not isinstance(leaf.src, nd.Tasklet) or leaf.data.dynamic or not assigns_zero(leaf.src, leaf.src_conn):
        return None
    ranges = scope_ranges(state, leaf.src)
    params = set(ranges)
    if leaf.data.subset is None or any(_names(x) & (params | unstable) for r in ranges.values() for x in r[:2]):
        return None
    dims, used = [], set()
    for begin, end, _ in leaf.data.subset:
        if not _equal(begin, end) or _names(begin) & unstable:
            return None
        inner = _names(begin) & params
        if not inner:
            dims.append((begin, begin, 1))
            continue
        if len(inner) != 1 or inner <= used:
            return None
        (param,) = inner
        used |= inner
        low, high, step = ranges[param]
        offset = sympy.expand(begin - next(s for s in sympy.sympify(begin).free_symbols if str(s) == param))
        if step != 1 or _names(offset) & params:
            return None
        dims.append((low + offset, high + offset, 1))
    if used != params:  # a parameter indexing nothing: its range may be empty, and with it the write
        return None
    return subsets.Range(dims)


def _disjoint(a, b) -> bool:
    """`a` and `b` provably share no element (False where either is unknown or it cannot be decided)."""
    if a is None or b is None:
        return False
    with exact_subsets():
        try:
            return subsets.intersects(a, b) is False
        except (TypeError, ValueError):
            return False


def _cover(regions: list[subsets.Range], shape) -> bool:
    """The regions together provably hold every element of an array of `shape`: one dimension is chained
    from 0 to its size, each region starting where the one before ended, and every region spans the other
    dimensions whole. (Every index from 0 to the last end lies in the first region whose end passes it, so
    the chain covers whatever the signs of its symbolic lengths.)"""
    for dim, size in enumerate(shape):
        if not all(_equal(r[d][0], 0) and _equal(r[d][1], shape[d] - 1)
                   for r in regions for d in range(len(shape)) if d != dim):
            continue
        left, reached = list(regions), sympy.Integer(0)
        while not _equal(reached, size):
            step = next((r for r in left if _equal(r[dim][0], reached)), None)
            if step is None:
                break
            left.remove(step)
            reached = sympy.sympify(step[dim][1]) + 1
        else:
            return True
    return False


@attrs.frozen
class _Plan:
    """What the rewrite does to one buffer of one loop."""

    name: str
    first: ElementWrite  # the sum that becomes a plain write
    resets: tuple  # (state, access node) of the resets whose zeros nothing reads
    zeroing: tuple | None  # (state, map entry, access node) of the zeroing before the loop, if it goes


def _has_jumps(loop: LoopRegion) -> bool:
    return any(isinstance(b, (BreakBlock, ContinueBlock, ReturnBlock)) for b in loop.all_control_flow_blocks())


def _zeroing_before(loop: LoopRegion, name: str) -> tuple | None:
    """The map zeroing all of `name` that runs last before `loop` touches it, with nothing in between
    naming it: (state, entry, access node), or None."""
    region = loop.parent_graph
    order = chain_of(region) if region is not None else None
    if order is None or named_in_code(loop, name):
        return None
    k = order.index(loop)
    for j in range(k - 1, -1, -1):
        edge = region.in_edges(order[j + 1])[0]
        if name in map(str, edge.data.free_symbols) or not edge.data.is_unconditional():
            return None
        block = order[j]
        if not touches(block, name):
            continue
        if not isinstance(block, dace.SDFGState):
            return None
        nodes = accesses(block, name)
        found = list(zeroing_maps(block, name))
        if len(found) != 1 or nodes != [found[0][1]] or block.out_degree(found[0][1]):
            return None
        return block, found[0][0], found[0][1]
    return None


def _first_sum(state: dace.SDFGState, name: str) -> ElementWrite | None:
    nodes = accesses(state, name)
    if len(nodes) != 1 or state.out_degree(nodes[0]) or state.in_degree(nodes[0]) != 1:
        return None
    write = element_write(state, state.in_edges(nodes[0])[0])
    return write if write is not None and write.wcr is not None else None


def _accesses_after(body: list, j: int, state: dace.SDFGState, node: nd.AccessNode, unstable: set[str]):
    """The subsets of the array of `node` that may be accessed after the reset into `node` (in `body[j]`,
    `state`) within the iteration: in its state and in the body's later blocks (None: unknown). Left out:
    the reads its own map makes of the element each iteration resets, before resetting it, and other
    resets (which read nothing)."""
    name = node.data
    [edge] = state.in_edges(node)
    [reset] = state.memlet_tree(edge).leaves()
    tasklet, own = reset.src, reset.data.subset
    head = tasklet
    while state.entry_node(head) is not None:
        head = state.entry_node(head)
    before = nx.ancestors(state.nx, head)
    for other in accesses(state, name):
        if other is node:
            continue
        if state.in_degree(other) or other not in before:
            yield None
            continue
        for e in state.out_edges(other):
            if e.dst is head:
                for leaf in state.memlet_tree(e).leaves():
                    same = leaf.dst is tasklet and leaf.data.subset is not None and own is not None and all(
                        _equal(a, b) for x, y in zip(leaf.data.subset, own) for a, b in zip(x, y))
                    if not same:
                        yield None
            elif e.dst not in before:
                yield None
    for block in body[j + 1:]:
        if not touches(block, name):
            continue
        if not isinstance(block, dace.SDFGState):
            yield None
            continue
        for other in accesses(block, name):
            for e in block.out_edges(other):
                yield _stable(e.data.subset, unstable)
            for e in block.in_edges(other):
                if _zero_region(block, e, unstable) is None:
                    yield _stable(e.data.subset, unstable)


def _stable(subset, unstable: set[str]):
    return None if subset is None or any(_names(x) & unstable for r in subset for x in r) else subset


def _plan(sdfg: dace.SDFG, loop: LoopRegion, body: list, k: int, name: str, on_edges: set[str],
          unstable: set[str]) -> _Plan | None:
    first = _first_sum(body[k], name)
    if first is None or any(touches(b, name) for b in body[:k]):
        return None
    zeroing = _zeroing_before(loop, name)
    if zeroing is None:
        return None
    zeros, resets = [], []
    for j in range(k + 1, len(body)):
        block = body[j]
        if not touches(block, name):
            continue
        if not isinstance(block, dace.SDFGState):
            zeros = []
            continue
        mine, others = [], []
        for node in accesses(block, name):
            for e in block.in_edges(node):
                region = _zero_region(block, e, unstable)
                if region is not None and block.in_degree(node) == 1 and not block.out_degree(node):
                    mine.append((node, region))
                else:
                    others.append(_stable(e.data.subset, unstable))
        zeros = [z for z in zeros if all(_disjoint(z, w) for w in others)]
        zeros += [r for _, r in mine if all(_disjoint(r, w) for w in others)]
        resets += [(j, block, node, region) for node, region in mine]
    if not _cover(zeros, sdfg.arrays[name].shape):
        return None
    if read_later(sdfg, loop, name, on_edges):
        return _Plan(name, first, (), None)
    gone = tuple((block, node) for j, block, node, region in resets
                 if all(_disjoint(region, a) for a in _accesses_after(body, j, block, node, unstable)))
    return _Plan(name, first, gone, zeroing)


def _summed(state: dace.SDFGState, node: nd.AccessNode) -> bool:
    """A cheap first test of `_first_sum`: the node's one edge is a map's write-conflict sum, nothing reads it."""
    if state.in_degree(node) != 1 or state.out_degree(node):
        return False
    edge = state.in_edges(node)[0]
    return isinstance(edge.src, nd.MapExit) and edge.data.wcr is not None


def _plans(sdfg: dace.SDFG) -> Iterator[_Plan]:
    viewed = viewed_arrays(sdfg)
    on_edges = {str(x) for e in sdfg.all_interstate_edges(recursive=True) for x in e.data.free_symbols}
    for loop in sdfg.all_control_flow_regions():
        if not isinstance(loop, LoopRegion):
            continue
        body = chain_of(loop)
        if body is None:
            continue
        candidates = [(k, node.data) for k, state in enumerate(body) if isinstance(state, dace.SDFGState)
                      for node in state.data_nodes() if _summed(state, node)]
        if not candidates or _has_jumps(loop) or not all(e.data.is_unconditional() for e in loop.edges()):
            continue  # (a condition on an edge of the chain ends the iteration where it is false)
        on_loop_edges = {str(x) for e in loop.all_interstate_edges(recursive=True) for x in e.data.free_symbols}
        unstable = _changing(loop)
        for k, name in candidates:
            desc = sdfg.arrays[name]
            if (not desc.transient or isinstance(desc, dace.data.View) or name in viewed
                    or desc.lifetime in KEPT_LIFETIMES or name in on_loop_edges):
                continue
            plan = _plan(sdfg, loop, body, k, name, on_edges, unstable)
            if plan is not None:
                yield plan


def _changing(loop: LoopRegion) -> set[str]:
    """Symbols that may change within one iteration of `loop`: those its interstate edges assign and the
    variables of the loops inside it."""
    return ({k for e in loop.all_interstate_edges(recursive=True) for k in e.data.assignments}
            | {r.loop_variable for r in loop.all_control_flow_regions() if isinstance(r, LoopRegion) and r is not loop})


@register_pass
@attrs.frozen
class OverwriteLoopSums(RewritePass):
    """A gradient buffer a loop's body adds into first and resets after use is overwritten by its first
    sum; its resets and its zeroing before the loop go where nothing reads them (see the module docstring)."""

    name: ClassVar[str] = "overwrite_loop_sums"
    strategy: ClassVar[str] = ONE_AT_A_TIME
    nested: ClassVar[bool] = False  # `read_later` reasons about the top-level SDFG's blocks

    def matches(self, sdfg: dace.SDFG) -> Iterator[_Plan]:
        return _plans(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match: _Plan) -> None:
        for e in match.first.edges:
            e.data.wcr = None
        for state, node in match.resets:
            drop_writes(state, node)
        if match.zeroing is not None:
            state, entry, target = match.zeroing
            scope = state.scope_subgraph(entry, include_entry=True, include_exit=True).nodes()
            state.remove_nodes_from([*scope, target])
