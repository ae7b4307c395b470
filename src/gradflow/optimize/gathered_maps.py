"""`gather_element_maps`: in a straight run of blocks, the states of maps over a symbolic extent move
next to each other, the blocks between them that need not run there moving before or after the maps, so
that `tile_element_chains` (the next pass) finds one chain where it found several.

Why: a reversed loop body interleaves its adjoint maps with what restores the forward's values for the
iteration before (tape pops, guarded by the iteration they restore, `if _ != 0`), the stack pointer
decrements on the edges before them, and the adjoints of single elements (`dy[0] = x[0]`, a sum into
`grad_x[0]`). Each of these ended a chain: GradBench's ode backward tiled 4 of its 7 maps over the vector,
its forward 3 of 6.

The proof (`analysis.effects`). A loop's body qualifies when its blocks form one path of unconditional
edges (a program's top level, run once, is left alone: its straight runs of a model's backward are hundreds
of blocks long, and each pair of blocks is compared).
Its *items* are its blocks and the assignment sets of its edges, in program order. Item `i` must stay
before a later item `j` when they do not commute (an opaque block commutes with nothing); the new order
keeps every such pair, so every block reads what it read before and every symbol has the value it had
(an assignment moves only past blocks that neither read nor assign its symbols). The new order: first the
small items (everything but a map state) that no map state must precede and some map state needs, then the
map states with the items no partition can take (those after one map state and before another), then the
items no map state needs; each part in program order. Every item's predecessors in the dependence order
lie in its own part or an earlier one, so this is a topological order of it. Assignments that end up next
to each other share one edge where neither reads or assigns what the other assigns; otherwise, and at either
end of the body, an empty state holds them apart. A region is rewritten only where its
map states form fewer runs (states joined by an edge without assignments) than before.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.analysis.access import chain_of
from gradflow.analysis.effects import Effects, assignment_effects, commute, effects
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass


@attrs.frozen(eq=False)
class _Item:
    """A block of the run, or the assignments of the edge into `block`'s place (`assignments` not None)."""

    block: object
    assignments: dict | None
    effects: Effects | None
    big: bool


def _is_big(block) -> bool:
    """A state with a top-level map over a symbolic extent."""
    if not isinstance(block, dace.SDFGState):
        return False
    for node in block.nodes():
        if isinstance(node, nd.MapEntry) and block.entry_node(node) is None:
            if not dace.symbolic.simplify(node.map.range.num_elements()).is_number:
                return True
    return False


def _path(region: ControlFlowRegion) -> list | None:
    """The blocks of `region` in order when they form one path of unconditional edges (`chain_of`)."""
    if isinstance(region, ConditionalBlock) or region.number_of_nodes() < 2:
        return None
    order = chain_of(region)
    return order if order is not None and all(e.data.is_unconditional() for e in region.edges()) else None


def _items(region: ControlFlowRegion, blocks: list) -> list[_Item]:
    items = []
    for k, block in enumerate(blocks):
        if k:
            edge = region.edges_between(blocks[k - 1], block)[0]
            if edge.data.assignments:
                items.append(_Item(None, dict(edge.data.assignments), assignment_effects(region.sdfg, edge.data),
                                   False))
        items.append(_Item(block, None, effects(block), _is_big(block)))
    return items


def _runs(items: list[_Item]) -> int:
    """Maximal runs of consecutive map states."""
    return sum(1 for k, item in enumerate(items) if item.big and (k == 0 or not items[k - 1].big))


def gathered(items: list[_Item]) -> list[_Item]:
    """The items in the order of the module doc."""
    n = len(items)
    after = [[j for j in range(i + 1, n) if not commute(items[i].effects, items[j].effects)] for i in range(n)]
    before: list[list[int]] = [[] for _ in range(n)]
    for i, later in enumerate(after):
        for j in later:
            before[j].append(i)
    follows_big = [False] * n
    for j in range(n):
        follows_big[j] = any(items[i].big or follows_big[i] for i in before[j])
    needed = [False] * n
    for i in reversed(range(n)):
        needed[i] = any(items[j].big or needed[j] for j in after[i])
    first = [items[k] for k in range(n) if not items[k].big and not follows_big[k] and needed[k]]
    last = [items[k] for k in range(n) if not items[k].big and not needed[k]]
    placed = {id(item) for item in first + last}
    return first + [item for item in items if id(item) not in placed] + last


def plans(sdfg: dace.SDFG) -> list[tuple[ControlFlowRegion, list[_Item]]]:
    """(region, its items in the new order) wherever the order gathers map states (read only)."""
    found = []
    for region in sdfg.all_control_flow_regions():
        if not isinstance(region, LoopRegion):
            continue  # a body that runs once per iteration (a program's straight top level is left as it is)
        blocks = _path(region)
        if blocks is None or sum(_is_big(b) for b in blocks) < 2:
            continue
        items = _items(region, blocks)
        order = gathered(items)
        if _runs(order) < _runs(items):
            found.append((region, order))
    return found


def _independent(first: Effects | None, second: Effects | None) -> bool:
    """Two assignment sets that may share one edge: neither assigns what the other reads or assigns."""
    return (first is not None and second is not None and not first.writes & (second.reads | second.writes)
            and not second.writes & first.reads)


def _relink(region: ControlFlowRegion, order: list[_Item]) -> None:
    for edge in list(region.edges()):
        region.remove_edge(edge)
    previous, pending, first = None, None, None
    joined: Effects | None = None  # the effects of the assignments pending, together
    for item in order:
        if item.assignments is None:
            if previous is not None:
                region.add_edge(previous, item.block, dace.InterstateEdge(assignments=pending or {}))
            first = first or item.block
            previous, pending = item.block, None
            continue
        if pending is not None and _independent(joined, item.effects):
            assert joined is not None and item.effects is not None
            pending = {**pending, **item.assignments}
            joined = Effects((), joined.reads | item.effects.reads, joined.writes | item.effects.writes)
            continue
        if previous is None or pending is not None:
            empty = region.add_state(f"gathered_{region.label}_{region.number_of_nodes()}")
            if previous is not None:
                region.add_edge(previous, empty, dace.InterstateEdge(assignments=pending or {}))
            first = first or empty
            previous = empty
        pending, joined = item.assignments, item.effects
    if pending is not None:
        empty = region.add_state(f"gathered_{region.label}_{region.number_of_nodes()}")
        region.add_edge(previous, empty, dace.InterstateEdge(assignments=pending))
    region.start_block = region.node_id(first)


@register_pass
@attrs.frozen
class GatherElementMaps(RewritePass):
    """Map states of a straight run move next to each other where they commute with what lies between
    (module doc)."""

    name: ClassVar[str] = "gather_element_maps"
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> list[tuple[ControlFlowRegion, list[_Item]]]:
        return plans(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match: tuple[ControlFlowRegion, list[_Item]]) -> None:
        _relink(*match)
