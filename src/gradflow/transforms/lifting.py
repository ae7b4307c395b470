"""`lift_control_flow`: unstructured control flow becomes `LoopRegion`s and `ConditionalBlock`s.

An SDFG built with DaCe's API (or loaded from an older DaCe) may branch and loop through conditional
interstate edges: an if/else is a block with two conditional out-edges that meet again, a loop is a guard
block with a back edge. Reverse mode walks a tree of structured regions (`structure.py`), so this pure
pass raises such control flow first, with DaCe's own `ControlFlowRaising` (loop lifting by pattern, then
conditionals from the dominator tree) on a private copy. What DaCe cannot raise stays a typed error
naming the block: irreducible control flow (a cycle with two entries), branches whose conditions may all
be false (DaCe makes the gap an implicit exit, a `ReturnBlock`), or a cycle without a condition.

The pass does nothing (and returns its input) when every region is already a chain of blocks.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
import networkx as nx
from dace.sdfg.state import ReturnBlock, UnstructuredControlFlow
from dace.transformation.passes.simplification.control_flow_raising import ControlFlowRaising
from returns.result import Failure, Success

from gradflow.core.errors import NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass


def branching_blocks(sdfg: dace.SDFG) -> list[tuple[str, str]]:
    """(region, block) labels of every block, in `sdfg` and its nested SDFGs, that leaves through more
    than one edge or a conditional one, or that lies on a cycle of blocks."""
    found = []
    for region in sdfg.all_control_flow_regions(recursive=True):
        for block in region.nodes():
            out = region.out_edges(block)
            if len(out) > 1 or any(not e.data.is_unconditional() for e in out):
                found.append((region.label, block.label))
        if region.nodes() and region.has_cycles():
            found.append((region.label, region.start_block.label))
    return found


def irreducible_cycle(region) -> list[str]:
    """Labels of the blocks of a cycle of `region` that is entered at more than one block (none when every
    cycle has a header that dominates it, which is when the cycles are loops DaCe can lift)."""
    graph = region.nx
    start = region.start_block
    dominators = nx.immediate_dominators(graph, start)

    def dominates(a, b) -> bool:
        while True:
            if a is b:
                return True
            parent = dominators.get(b)
            if parent is None or parent is b:
                return False
            b = parent

    forward = nx.DiGraph()
    forward.add_nodes_from(graph.nodes)
    forward.add_edges_from((u, v) for u, v in graph.edges if not dominates(v, u))
    try:
        cycle = nx.find_cycle(forward)
    except nx.NetworkXNoCycle:
        return []
    return sorted({u.label for u, _ in cycle})


def _returns(sdfg: dace.SDFG) -> set[int]:
    return {id(b) for b in sdfg.all_control_flow_blocks(recursive=True) if isinstance(b, ReturnBlock)}


def _irreducible_error(blocks: list[str]) -> NotDifferentiableError:
    return NotDifferentiableError(
        f"the control flow through blocks {', '.join(repr(b) for b in blocks)} is irreducible (a cycle entered "
        "at more than one block, or branches that jump into each other); gradflow differentiates loops and "
        "if/else that DaCe can raise into LoopRegion and ConditionalBlock",
        "restructure the SDFG so that every loop has one entry (a guard block) and every branch rejoins at one "
        "block",
    )


def _leftover(sdfg: dace.SDFG, returns_before: set[int]) -> NotDifferentiableError | None:
    """The error for what raising left unstructured, or None."""
    for block in sdfg.all_control_flow_blocks(recursive=True):
        if isinstance(block, UnstructuredControlFlow):
            return _irreducible_error(sorted(b.label for b in block.nodes()))
        if isinstance(block, ReturnBlock) and id(block) not in returns_before:
            source = block.label.removesuffix("_return")  # DaCe names the exit it adds after the block
            return NotDifferentiableError(
                f"the conditions on the interstate edges leaving block '{source}' may all be false (the program "
                "would stop there); gradflow needs branches that cover every case",
                "make the last branch unconditional or the negation of the others",
            )
    rest = branching_blocks(sdfg)
    if rest:
        region, block = rest[0]
        return NotDifferentiableError(
            f"block '{block}' of region '{region}' still branches through interstate edges after control-flow "
            "raising (DaCe found no loop or if/else pattern there)",
            "give every loop a guard block with a condition edge into the body and its negation out of the loop",
        )
    return None


@register_pass
@attrs.frozen
class LiftControlFlow(Pass):
    """Raise branches and loops written as conditional interstate edges into structured regions."""

    name: ClassVar[str] = "lift_control_flow"

    def run(self, graph: Graph) -> PassResult:
        if not branching_blocks(graph.sdfg):
            return Success(graph)
        for region in graph.sdfg.all_control_flow_regions(recursive=True):
            blocks = irreducible_cycle(region) if region.nodes() and region.has_cycles() else []
            if blocks:
                return Failure(_irreducible_error(blocks))
        sdfg = graph.editable()
        returns_before = _returns(sdfg)
        ControlFlowRaising().apply_pass(sdfg, {})
        error = _leftover(sdfg, returns_before)
        if error is not None:
            return Failure(error)
        sdfg.reset_cfg_list()
        return Success(Graph.adopt(sdfg, graph.meta))
