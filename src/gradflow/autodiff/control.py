"""Control-flow reversal rules: the `control` table, keyed by item kind ("loop", "conditional",
"assignment").

A `ControlRule` says, for one kind of item of the control-flow tree (`structure.py`), given the build's
`ControlContext` `rev` (`protocols.py`: all a rule may use of it):
- `restores(item)`: the loop variables its reversal sets in every reversed iteration (so operations
  inside may read them; `check_symbols` rejects reads of a loop variable elsewhere);
- `tape_bytes(item, rev, loops)`: the bytes of the stacks `record` will create (the budget planner
  counts them; they do not depend on what is stored or recomputed);
- `record(item, rev, loops)`: how it instruments the forward sweep (what it pushes on the tape; `loops` are
  the loops around the item), returning whatever its `reverse` needs;
- `reverse(item, recorded, rev, ctx, body)`: the backward blocks it appends to `ctx`, calling `body(seq)`
  to reverse each child sequence inside the region it built.

Built-in rules:
- `CountedLoop` (a `for` loop with a constant step and bounds fixed during the loop): nothing recorded;
  reversed as a loop over the same values in reverse order, from the closed form of its last value;
- `RecordedLoop` (any other loop: while, do-while, a lowered `break`, a `for` loop with a symbolic step):
  its trip count and (when the backward sweep reads it) its loop variable per iteration are pushed;
  reversed as a loop over the recorded trip count that pops them. When storage inside it needed the
  user's bound, the loop is stopped there and sets `gradflow_overflow`;
- `RecordedBranch` (a `ConditionalBlock`): the index of the branch taken is pushed; reversed as a
  conditional on it;
- `RecordedAssignment` (symbols assigned on an interstate edge): the old values of those the backward
  sweep reads are pushed before the edge and popped where the backward sweep crosses it, so every
  symbol holds, wherever an operation is reversed, the value it had when the operation ran.
"""

from __future__ import annotations

import attrs
import dace
from dace import symbolic
from dace.properties import CodeBlock
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.autodiff.context import ReverseContext
from gradflow.autodiff.emit import copy_array
from gradflow.autodiff.protocols import Body, ControlContext, control_rule
from gradflow.autodiff.spec import flag_branch
from gradflow.autodiff.tape import Stack


def _ensure_start(region: ControlFlowRegion) -> None:
    if not region.nodes():
        region.add_state(f"{region.label}_empty", is_start_block=True)


def _is_counted(item) -> bool:
    return item.counted is not None


@control_rule("loop", priority=10, applies=_is_counted)
class CountedLoop:
    """`for (i = a; i <cmp> b; i += s)`: reversed in closed form, nothing recorded."""

    tape_free = False

    def restores(self, item) -> frozenset[str]:
        return frozenset({item.counted.var})

    def tape_bytes(self, item, rev: ControlContext, loops: tuple):
        return 0

    def record(self, item, rev: ControlContext, loops: tuple) -> None:
        return None

    def reverse(self, item, recorded: None, rev: ControlContext, ctx: ReverseContext, body: Body) -> None:
        c = item.counted
        first = "<=" if c.step < 0 else ">="
        cond = f"{c.var} {first} {symbolic.symstr(c.start)}"
        loop = LoopRegion(f"reverse_{item.label}", cond, c.var, f"{c.var} = {c.last_value()}",
                          f"{c.var} = {c.var} - ({c.step})", sdfg=ctx.sdfg)
        ctx.add_block(loop)
        with ctx.inside(loop):
            body(item.body)


@attrs.frozen
class RecordedTrips:
    trips: Stack  # one trip count per execution of the loop
    counter: str  # the forward symbol counting iterations
    index: str  # the reversed loop's variable
    iteration: tuple[tuple[Stack, str], ...]  # per-iteration symbols and their stacks


@control_rule("loop")
class RecordedLoop:
    """Any loop that is not counted: its trip count (and its variable per iteration) recorded on the tape."""

    tape_free = False

    def restores(self, item) -> frozenset[str]:
        return frozenset({item.loop.loop_variable} if item.loop.loop_variable else ())

    def tape_bytes(self, item, rev: ControlContext, loops: tuple):
        var = item.loop.loop_variable
        per_iteration = rev.priced_capacity(loops + (item.loop,)) if var and var in rev.used_symbols else 0
        return 8 * (rev.priced_capacity(loops) + per_iteration) + 8 * (2 if per_iteration else 1)

    def record(self, item, rev: ControlContext, loops: tuple) -> RecordedTrips:
        loop = item.loop
        inside = loops + (loop,)
        counter, index = rev.fresh("gf_n"), rev.fresh("gf_k")
        region = loop.parent_graph
        region.add_state_before(loop, f"count_{loop.label}", is_start_block=region.start_block is loop,
                                assignments={counter: "0"})
        _ensure_start(loop)
        tick = loop.add_state_before(loop.start_block, f"tick_{loop.label}", is_start_block=True,
                                     assignments={counter: f"{counter} + 1"})
        iteration = []
        var = loop.loop_variable
        if var and var in rev.used_symbols:
            stack = rev.tape.new_stack(f"{var}_{loop.label}", rev.capacity(inside), (), dace.int64)
            rev.tape.push_symbol(loop, tick, stack, var)
            iteration.append((stack, var))
            rev.note_store(stack.array, f"<symbol {var}>")
        trips = rev.tape.new_stack(f"trips_{loop.label}", rev.capacity(loops), (), dace.int64)
        rev.tape.push_symbol(region, loop, trips, counter)
        rev.note_store(trips.array, "<trip count>")
        bound = rev.user_bound(loop)
        if bound is not None:
            _stop_at_bound(loop, counter, bound, rev.overflow_number(loop), rev)
        return RecordedTrips(trips, counter, index, tuple(iteration))

    def reverse(self, item, recorded: RecordedTrips, rev: ControlContext, ctx: ReverseContext, body: Body) -> None:
        rev.tape.pop_symbol(ctx, recorded.trips, recorded.counter)
        k = recorded.index
        loop = LoopRegion(f"reverse_{item.label}", f"{k} >= 0", k, f"{k} = {recorded.counter} - 1",
                          f"{k} = {k} - 1", sdfg=ctx.sdfg)
        ctx.add_block(loop)
        with ctx.inside(loop):
            for stack, sym in recorded.iteration:
                rev.tape.pop_symbol(ctx, stack, sym)
            body(item.body)


def _stop_at_bound(loop: LoopRegion, counter: str, bound: int, number: int, rev: ControlContext) -> None:
    """Stop the while loop after `bound` iterations and set `gradflow_overflow` to `number` if it would have
    gone on (see `forwarding.py`)."""
    cond = loop.loop_condition.as_string
    loop.loop_condition = CodeBlock(f"({cond}) and ({counter} < {bound})")
    region = loop.parent_graph
    check = flag_branch(rev.sdfg, f"overflow_{loop.label}", f"({cond}) and ({counter} >= {bound})", number)
    region.add_node(check)
    for e in list(region.out_edges(loop)):
        region.remove_edge(e)
        region.add_edge(check, e.dst, e.data)
    region.add_edge(loop, check, dace.InterstateEdge())


@attrs.frozen
class RecordedChoice:
    taken: Stack  # the index of the branch taken, per execution of the conditional
    symbol: str


@control_rule("conditional")
class RecordedBranch:
    """A conditional: the branch taken recorded on the tape, reversed as a conditional on it."""

    tape_free = False

    def restores(self, item) -> frozenset[str]:
        return frozenset()

    def tape_bytes(self, item, rev: ControlContext, loops: tuple):
        return 8 * rev.priced_capacity(loops) + 8

    def record(self, item, rev: ControlContext, loops: tuple) -> RecordedChoice:
        block = item.block
        taken = rev.fresh("gf_b")
        region = block.parent_graph
        region.add_state_before(block, f"branch_{block.label}", is_start_block=region.start_block is block,
                                assignments={taken: "-1"})
        for j, (_, branch) in enumerate(block.branches):
            _ensure_start(branch)
            branch.add_state_before(branch.start_block, f"took_{block.label}_{j}", is_start_block=True,
                                    assignments={taken: str(j)})
        stack = rev.tape.new_stack(f"branch_{block.label}", rev.capacity(loops), (), dace.int64)
        rev.tape.push_symbol(region, block, stack, taken)
        rev.note_store(stack.array, "<branch taken>")
        return RecordedChoice(stack, taken)

    def reverse(self, item, recorded: RecordedChoice, rev: ControlContext, ctx: ReverseContext, body: Body) -> None:
        rev.tape.pop_symbol(ctx, recorded.taken, recorded.symbol)
        block = ConditionalBlock(f"reverse_{item.label}", sdfg=ctx.sdfg)
        ctx.add_block(block)
        before = dict(ctx.values)
        after = []
        for j, child in enumerate(item.branches):
            region = ControlFlowRegion(f"reverse_{item.label}_{j}", sdfg=ctx.sdfg)
            block.add_branch(f"{recorded.symbol} == {j}", region)
            ctx.values = dict(before)
            with ctx.inside(region):
                body(child)
            after.append((region, ctx.values))
        if all(condition is not None for condition, _ in item.block.branches):  # none taken: the `else` left out
            after.append((None, before))
        ctx.values = _join_values(ctx, block, before, after)


def _join_values(ctx: ReverseContext, block: ConditionalBlock, before: dict[str, str], after: list) -> dict[str, str]:
    """Where each array's value is read once the reversed branches rejoin. A branch may have moved it (a
    checkpointed loop inside leaves the value before the loop in a working copy); the code reversed after the
    conditional reads one array whichever branch ran, so every other branch copies its value there. (Without
    the copy, a branch not taken left that array unset: uninitialised reads, wrong gradients.)"""
    joined = dict(before)
    none_taken = None  # the branch left out, made once: an `else` that only copies (one per array would
    # give the block several branches without a condition, which DaCe's code generator rejects)
    for array in sorted({a for _, values in after for a in values}):
        where = {values.get(array, array) for _, values in after}
        if len(where) == 1:
            joined[array] = where.pop()
            continue
        target = next(values.get(array, array) for _, values in after
                      if values.get(array, array) != before.get(array, array))
        for region, values in after:
            if values.get(array, array) != target:
                if region is None:
                    if none_taken is None:
                        none_taken = ControlFlowRegion(f"{block.label}_none", sdfg=ctx.sdfg)
                        block.add_branch(None, none_taken)
                    region = none_taken
                with ctx.inside(region):
                    copy_array(ctx.new_state(f"join_{region.label}_{array}"), values.get(array, array), target)
        joined[array] = target
    return joined


@attrs.frozen
class RecordedSymbols:
    saved: tuple[tuple[Stack, str], ...]  # the stack of each recorded symbol's old values


@control_rule("assignment")
class RecordedAssignment:
    """Symbols assigned on an interstate edge: old values pushed before it, popped where the backward
    sweep crosses it (a symbol that nothing reversed reads is not recorded). Their values at the end of
    the forward sweep are kept too (`Reversal.keep_final`), for the backward sweep to start from."""

    tape_free = False

    def restores(self, item) -> frozenset[str]:
        return frozenset()

    def tape_bytes(self, item, rev: ControlContext, loops: tuple):
        used = sum(1 for sym in item.symbols if sym in rev.used_symbols)
        return used * (8 * rev.priced_capacity(loops) + 8 + 16)  # the stack, its top slot, the final value

    def record(self, item, rev: ControlContext, loops: tuple) -> RecordedSymbols:
        region = item.state.parent_graph
        saved = []
        for sym, dtype in zip(item.symbols, item.types):
            if sym not in rev.used_symbols:
                continue
            stack = rev.tape.new_stack(f"{sym}_{item.label}", rev.capacity(loops), (), dtype)
            rev.tape.push_symbol_before(region, item.state, stack, sym)
            rev.note_store(stack.array, f"<symbol {sym}>")
            rev.keep_final(sym, dtype)
            saved.append((stack, sym))
        return RecordedSymbols(tuple(saved))

    def reverse(self, item, recorded: RecordedSymbols, rev: ControlContext, ctx: ReverseContext, body: Body) -> None:
        for stack, sym in reversed(recorded.saved):
            rev.tape.pop_symbol(ctx, stack, sym)
