"""The control-flow tree that reverse mode walks: sequences of operations, loops, branches and symbol
assignments.

DaCe 2.0 SDFGs are structured: a region is a chain of blocks, and a block is a state, a `LoopRegion`,
a `ConditionalBlock` (if/elif/else over sub-regions) or a plain nested region (`lift_control_flow` raises
SDFGs that branch through conditional interstate edges into this form first). `build_tree` reads that
structure once into a tree and numbers every operation in program order (`OpSite.index`); everything
the engine decides later (activity, what to record, how to reverse) works on the tree. An interstate edge
of a chain that assigns symbols is an item of its own (`AssignItem`), between the items of the blocks it
joins: the backward sweep restores the symbols' old values where it crosses it.

Control flow that is still unstructured, `break`/`continue`/`return` blocks, loop variables read outside
their loop, and values that reach the differentiated code through symbols are rejected here, with the
block named.
"""

from __future__ import annotations

import attrs
import dace
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion, SDFGState

from gradflow.analysis.loops import CountedLoop, assigned_symbols, counted_loop, counter_bound
from gradflow.analysis.ops import decompose
from gradflow.analysis.symbols import assigned_types, data_symbols
from gradflow.autodiff.context import OpSite
from gradflow.core.errors import NotDifferentiableError

#: `kind` of an operation item; region items are keyed by their kind in the `control` rule table.
OPERATION, LOOP, CONDITIONAL, ASSIGNMENT = "operation", "loop", "conditional", "assignment"


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
    # of each iteration, as `lower_breaks` leaves it), and a counted loop bounding the trip count by a
    # counter in the condition (`analysis.loops.counter_bound`).
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
class AssignItem:
    """Symbols assigned on the interstate edge that leaves `state`, an empty state of its own (so what the
    forward sweep records before the assignment has a fixed place, whatever is inserted around it)."""

    state: SDFGState
    symbols: tuple[str, ...]
    types: tuple  # DaCe type of each symbol
    depth: int
    kind = ASSIGNMENT
    children = ()
    encloses = ()

    @property
    def label(self) -> str:
        return self.state.label


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


def _isolate(region: ControlFlowRegion, edge) -> SDFGState:
    """Give the assigning `edge` an empty state of its own as source; returns that state."""
    own = region.add_state(f"assign_{edge.src.label}")
    region.remove_edge(edge)
    region.add_edge(edge.src, own, dace.InterstateEdge())
    region.add_edge(own, edge.dst, edge.data)
    return own


def build_tree(sdfg: dace.SDFG) -> tuple[Seq, list[OpSite]]:
    """The control-flow tree of `sdfg` and its operations in program order.

    Edits `sdfg` in one way (the engine calls it on its private copy): every interstate edge of a chain
    that assigns symbols gets an empty state of its own as source (`AssignItem.state`)."""
    sites: list[OpSite] = []
    types = assigned_types(sdfg)

    def walk(region: ControlFlowRegion, loops: tuple) -> Seq:
        items: list[OpItem | LoopItem | BranchItem | AssignItem] = []
        isolated = set()
        for block in block_chain(region)[:-1]:
            edge = region.out_edges(block)[0]
            if edge.data.assignments:
                isolated.add(id(_isolate(region, edge)))
        for block in block_chain(region):
            if id(block) in isolated:
                names = tuple(region.out_edges(block)[0].data.assignments)
                items.append(AssignItem(block, names, tuple(types.get(n, dace.int64) for n in names), len(loops)))
                continue
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
                counted = counted_loop(block, assigned_symbols(block))
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
                items.append(LoopItem(block, None, body, len(loops), tuple(sorted(updates)), counter_bound(block)))
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
                  loops, varied: frozenset[str]) -> None:
    """Reject what the backward sweep cannot restore or differentiate through symbols:

    - a loop variable read by an active operation outside the loops whose control rule sets it in every
      reversed iteration (`restores`: `id(LoopRegion)` -> symbols; a counted loop's variable, a recorded
      loop's variable); `loops`: the `LoopItem`s;
    - a floating-point symbol assigned (directly or through other symbols) from an array that depends on
      `wrt` (`varied`) and read by an operation: the value would reach the result without a gradient.
    Symbols assigned on interstate edges are otherwise restored by the `assignment` control rule."""
    loop_vars = {item.loop.loop_variable: item.loop.label for item in loops if item.loop.loop_variable}
    for site in sites:
        if site.index not in active:
            continue
        exempt = set().union(*(restores.get(id(loop), frozenset()) for loop in site.loops))
        unexempt = {str(s) for s in site.state.free_symbols} - exempt
        unrestored = sorted(unexempt & set(loop_vars))
        if unrestored:
            var = unrestored[0]
            raise NotDifferentiableError(
                f"state '{site.state.label}' reads the variable '{var}' of loop '{loop_vars[var]}' outside that "
                "loop (its value after the loop); the backward sweep does not restore it there",
                "copy the value into an array (a tasklet) inside the loop",
            )
    refuse_data_symbol_reads(sdfg, sites, varied)


def refuse_data_symbol_reads(sdfg: dace.SDFG, sites: list[OpSite], varied: frozenset[str]) -> None:
    """An operation that reads a floating-point symbol computed from a varied array is refused (both modes:
    the symbol's value is a constant to the code, so its derivative would be lost, a silent 0)."""
    carriers = data_symbols(sdfg, varied)
    for site in sites:
        used = sorted({str(s) for s in site.state.free_symbols} & set(carriers))
        if used:
            raise NotDifferentiableError(
                f"state '{site.state.label}' reads symbol '{used[0]}', which holds a floating-point value computed "
                f"from '{carriers[used[0]]}' (an array that depends on the differentiated inputs); gradflow does not "
                "differentiate through symbols",
                "keep the value in an array instead of an interstate assignment; DaCe's frontend also makes a "
                "scalar variable that a condition reads a symbol: write it into a one-element array "
                f"(`{used[0]} = np.zeros(1); {used[0]}[0] = ...`)",
            )


def symbols_read(region: ControlFlowRegion) -> set[str]:
    """Symbols read anywhere in `region`: by its states, interstate edges, loop headers and branch
    conditions."""
    read = set()
    for block in region.all_control_flow_blocks():
        if isinstance(block, SDFGState):
            read |= {str(x) for x in block.free_symbols}
        elif isinstance(block, LoopRegion):
            for code in (block.loop_condition, block.init_statement, block.update_statement):
                if code is not None:
                    read |= set(code.get_free_symbols())
        elif isinstance(block, ConditionalBlock):
            read |= {s for cond, _ in block.branches if cond is not None for s in cond.get_free_symbols()}
    for edge in region.all_interstate_edges():
        read |= set(map(str, edge.data.read_symbols()))
    return read
