"""`lower_breaks`: rewrite `break` into structured control flow that reverse mode already handles.

DaCe's frontend keeps `break` as a `BreakBlock` (a `continue` is already simplified into a condition).
For a loop whose body breaks, this pure pass:
- replaces each `BreakBlock` by a state whose outgoing edge sets a flag symbol `gf_brk<n> = 1`;
- in every region between the break and the loop body, moves the blocks after the one that may break
  into a `ConditionalBlock` guarded by `gf_brk<n> == 0` (so the rest of the iteration is skipped; the
  engine records, as for any conditional, whether it ran);
- adds `gf_brk<n> == 0` to the loop condition, with the flag cleared on entry. A `for` loop becomes a
  while loop with its initialization before it and its update at the end of its body, because DaCe
  requires the condition of a loop with a loop variable to be a single comparison; the engine records
  its trip count and restores its variable per iteration.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.properties import CodeBlock
from dace.sdfg.state import BreakBlock, ConditionalBlock, ControlFlowRegion, LoopRegion
from returns.result import Success

from gradflow.core.errors import NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass


def _breaks_of(loop: LoopRegion) -> list[BreakBlock]:
    """Break blocks that exit `loop` itself (not an inner loop)."""
    found = []

    def walk(region: ControlFlowRegion) -> None:
        for block in region.nodes():
            if isinstance(block, BreakBlock):
                found.append(block)
            elif isinstance(block, ConditionalBlock):
                for _, branch in block.branches:
                    walk(branch)
            elif isinstance(block, ControlFlowRegion) and not isinstance(block, LoopRegion):
                walk(block)

    walk(loop)
    return found


def _guard_rest(region: ControlFlowRegion, block, flag: str, counter: list[int]) -> None:
    """Move the blocks after `block` in `region` under `if flag == 0`."""
    out = region.out_edges(block)
    if not out:
        return
    if len(out) != 1:
        raise NotDifferentiableError(f"region '{region.label}' branches after '{block.label}'")
    rest, nxt = [], out[0].dst
    while nxt is not None:
        rest.append(nxt)
        succ = region.out_edges(nxt)
        nxt = succ[0].dst if succ else None
    counter[0] += 1
    guard = ConditionalBlock(f"{flag}_guard{counter[0]}", sdfg=region.sdfg)
    body = ControlFlowRegion(f"{flag}_rest{counter[0]}", sdfg=region.sdfg)
    edges = [(e.src, e.dst, e.data) for b in rest for e in region.out_edges(b)]
    entry_data = out[0].data
    region.remove_edge(out[0])
    for b in rest:
        region.remove_node(b)
    for b in rest:
        body.add_node(b, is_start_block=b is rest[0])
    for src, dst, data in edges:
        body.add_edge(src, dst, data)
    region.add_node(guard)
    region.add_edge(block, guard, entry_data)
    guard.add_branch(f"{flag} == 0", body)


def _lower(loop: LoopRegion, flag: str) -> None:
    counter = [0]
    for brk in _breaks_of(loop):
        region = brk.parent_graph
        state = region.add_state(f"{brk.label}_set", is_start_block=region.start_block is brk)
        done = region.add_state(f"{brk.label}_done")
        region.add_edge(state, done, _edge({flag: "1"}))
        for e in region.in_edges(brk):
            region.add_edge(e.src, state, e.data)
        for e in region.out_edges(brk):
            region.add_edge(done, e.dst, e.data)
        region.remove_node(brk)
        # Guard what follows, from the break's region up to the loop body.
        block, region = done, done.parent_graph
        while True:
            _guard_rest(region, block, flag, counter)
            if region is loop:
                break
            owner = region.parent_graph  # a ConditionalBlock (branch) or a plain region
            block = owner if isinstance(owner, ConditionalBlock) else region
            region = block.parent_graph
    parent = loop.parent_graph
    entry = {flag: "0"}
    cond = loop.loop_condition.as_string
    if loop.loop_variable and loop.init_statement is not None:
        var = loop.loop_variable
        init = loop.init_statement.as_string.split("=", 1)[1].strip()
        entry[var] = init
        if loop.update_statement is not None:
            update = loop.update_statement.as_string.split("=", 1)[1].strip()
            last = [b for b in loop.nodes() if loop.out_degree(b) == 0]
            tail = loop.add_state(f"{loop.label}_update")
            for b in last:
                loop.add_edge(b, tail, _edge({}))
            tick = loop.add_state(f"{loop.label}_next")
            loop.add_edge(tail, tick, _edge({var: update}))
        loop.loop_variable = ""
        loop.init_statement = None
        loop.update_statement = None
    loop.loop_condition = CodeBlock(f"({cond}) and ({flag} == 0)")
    parent.add_state_before(loop, f"{loop.label}_enter", is_start_block=parent.start_block is loop, assignments=entry)


def _edge(assignments: dict[str, str]) -> dace.InterstateEdge:
    return dace.InterstateEdge(assignments=assignments)


@register_pass
@attrs.frozen
class LowerBreaks(Pass):
    """Rewrite `break` into a flag, guarded conditionals and a loop condition (see module doc)."""

    name: ClassVar[str] = "lower_breaks"

    def run(self, graph: Graph) -> PassResult:
        if not any(isinstance(b, BreakBlock) for b in graph.sdfg.all_control_flow_blocks()):
            return Success(graph)
        sdfg = graph.editable()
        loops = [b for b in sdfg.all_control_flow_blocks() if isinstance(b, LoopRegion)]
        for n, loop in enumerate(reversed(loops)):  # inner loops first
            if _breaks_of(loop):
                _lower(loop, f"gf_brk{n}")
        sdfg.reset_cfg_list()
        return Success(Graph.adopt(sdfg, graph.meta))
