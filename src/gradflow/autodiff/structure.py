"""The control-flow tree that reverse mode walks: sequences of operations, loops and branches.

DaCe 2.0 SDFGs are structured: a region is a chain of blocks, and a block is a state, a `LoopRegion`,
a `ConditionalBlock` (if/elif/else over sub-regions) or a plain nested region. `build_tree` reads that
structure once into a tree and numbers every operation in program order (`OpSite.index`); everything
the engine decides later (activity, what to record, how to reverse) works on the tree.

Unstructured control flow (a region whose blocks branch through conditional interstate edges),
`break`/`continue`/`return` blocks, and symbols assigned on interstate edges that the differentiated
code itself uses are rejected here, with the block named.
"""

from __future__ import annotations

import attrs
import dace
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion, SDFGState

from gradflow.analysis.loops import CountedLoop, counted_loop, guarded_counted_loop
from gradflow.analysis.ops import decompose
from gradflow.autodiff.context import OpSite
from gradflow.core.errors import NotDifferentiableError


#: `kind` of an operation item; region items are keyed by their kind in the `control` rule table.
OPERATION, LOOP, CONDITIONAL = "operation", "loop", "conditional"


@attrs.frozen(eq=False)
class OpItem:
    site: OpSite
    kind = OPERATION


@attrs.frozen(eq=False)
class LoopItem:
    """A `LoopRegion`. `counted` is its closed form when it is a counted `for` loop (analysis/loops.py)."""

    loop: LoopRegion
    counted: CountedLoop | None  # None: reversed by recording its trip count
    body: "Seq"
    depth: int  # number of loops around this one
    # Non-counted loops only: symbols the body assigns on its last edge (a loop variable updated at the end
    # of each iteration; they hold one value per iteration), and a counted loop bounding the trip count.
    iteration_symbols: tuple[str, ...] = ()
    bounded_by: CountedLoop | None = None
    kind = LOOP

    @property
    def children(self) -> tuple["Seq", ...]:
        return (self.body,)

    @property
    def encloses(self) -> tuple[LoopRegion, ...]:
        """Loops its children run inside (beyond the ones around the item itself)."""
        return (self.loop,)

    @property
    def label(self) -> str:
        return self.loop.label


@attrs.frozen(eq=False)
class BranchItem:
    block: ConditionalBlock
    branches: tuple["Seq", ...]  # in the order of `block.branches`
    has_else: bool
    depth: int
    kind = CONDITIONAL
    encloses = ()

    @property
    def children(self) -> tuple["Seq", ...]:
        return self.branches

    @property
    def label(self) -> str:
        return self.block.label


@attrs.frozen(eq=False)
class Seq:
    items: tuple


def block_chain(region: ControlFlowRegion) -> list:
    """The blocks of `region` in execution order, or a clear error when the region branches."""
    blocks, seen = [], set()
    block = region.start_block if region.nodes() else None
    while block is not None:
        if block in seen:
            raise NotDifferentiableError(f"region '{region.label}' has a cycle of blocks at '{block.label}'")
        seen.add(block)
        blocks.append(block)
        out = region.out_edges(block)
        if len(out) > 1 or (out and not out[0].data.is_unconditional()):
            raise NotDifferentiableError(
                f"block '{block.label}' of region '{region.label}' branches through interstate edges; gradflow "
                "differentiates structured control flow (LoopRegion, ConditionalBlock)",
                "build the SDFG with DaCe's structured control flow (the default of the Python frontend)",
            )
        block = out[0].dst if out else None
    if len(blocks) != len(region.nodes()):
        raise NotDifferentiableError(f"region '{region.label}' has blocks unreachable from its start block")
    return blocks


def _assigned_symbols(region: ControlFlowRegion) -> frozenset[str]:
    names = set()
    for edge in region.all_interstate_edges():
        names |= set(edge.data.assignments)
    for block in region.all_control_flow_blocks():
        if isinstance(block, LoopRegion) and block.loop_variable:
            names.add(block.loop_variable)
    return frozenset(names)


def build_tree(sdfg: dace.SDFG) -> tuple[Seq, list[OpSite]]:
    """The control-flow tree of `sdfg` and its operations in program order."""
    sites: list[OpSite] = []

    def walk(region: ControlFlowRegion, loops: tuple) -> Seq:
        items = []
        for block in block_chain(region):
            if isinstance(block, SDFGState):
                ops = decompose(block)
                if len(ops) > 1:
                    raise NotDifferentiableError(
                        f"state '{block.label}' holds {len(ops)} operations; run split_operations first"
                    )
                for op in ops:
                    site = OpSite(len(sites), block, op, loops)
                    sites.append(site)
                    items.append(OpItem(site))
            elif isinstance(block, LoopRegion):
                counted = counted_loop(block, _assigned_symbols(block))
                body = walk(block, loops + (block,))
                if counted is not None:
                    items.append(LoopItem(block, counted, body, len(loops)))
                    continue
                updates = {}
                for e in block.edges():
                    tail = e.dst
                    if (e.data.assignments and block.out_degree(tail) == 0 and isinstance(tail, SDFGState)
                            and not decompose(tail)):
                        updates.update(e.data.assignments)
                entry = {}
                for e in region.in_edges(block):
                    entry.update(e.data.assignments)
                items.append(LoopItem(block, None, body, len(loops), tuple(sorted(updates)),
                                      guarded_counted_loop(block, entry, updates)))
            elif isinstance(block, ConditionalBlock):
                branches = tuple(walk(r, loops) for _, r in block.branches)
                has_else = any(c is None for c, _ in block.branches)
                items.append(BranchItem(block, branches, has_else, len(loops)))
            elif type(block) is ControlFlowRegion:
                items.extend(walk(block, loops).items)
            else:
                raise NotDifferentiableError(
                    f"block '{block.label}' ({type(block).__name__}) is not differentiated: gradflow reverses "
                    "states, LoopRegions and ConditionalBlocks (no break, continue or return yet)",
                    "rewrite the loop with a condition instead of break/continue",
                )
        return Seq(tuple(items))

    tree = walk(sdfg, ())
    return tree, sites


def region_items(seq: Seq) -> list:
    """Every region item (loops, conditionals) of the tree, outermost first."""
    out = []
    for item in seq.items:
        if item.kind != OPERATION:
            out.append(item)
            for child in item.children:
                out.extend(region_items(child))
    return out


def check_symbols(sdfg: dace.SDFG, sites: list[OpSite], active: set[int], restores: dict[int, frozenset[str]],
                  loops) -> None:
    """Reject symbols that an active operation reads but the backward sweep does not restore: symbols
    assigned on interstate edges, and loop variables. `restores` maps `id(LoopRegion)` to the symbols the
    control rule of that loop sets in each reversed iteration (a counted loop's variable, the pushed
    per-iteration symbols of a recorded loop); they are exempt inside that loop. `loops`: the `LoopItem`s."""
    loop_vars = {item.loop.loop_variable: item.loop.label for item in loops if item.loop.loop_variable}
    assigned = set(loop_vars)
    for edge in sdfg.all_interstate_edges():
        assigned |= set(edge.data.assignments)
    for site in sites:
        if site.index not in active:
            continue
        exempt = set().union(*(restores.get(id(loop), frozenset()) for loop in site.loops))
        used = ({str(s) for s in site.state.free_symbols} & assigned) - exempt
        unrestored = sorted(used & set(loop_vars))
        if unrestored:
            var = unrestored[0]
            raise NotDifferentiableError(
                f"loop '{loop_vars[var]}' is not a counted for-loop (its step is not a constant or its bounds "
                f"change inside it), and state '{site.state.label}' reads its variable '{var}'; the backward "
                "sweep does not restore it yet",
            )
        if used:
            raise NotDifferentiableError(
                f"state '{site.state.label}' reads symbol(s) {', '.join(sorted(used))} assigned on an interstate "
                "edge; the backward sweep does not restore such symbols yet",
                "compute the value into an array (a tasklet) instead of an interstate assignment",
            )
