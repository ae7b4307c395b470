"""The reverse-mode engine: from a normalized forward SDFG to forward + backward in one SDFG.

Input: a private SDFG whose states hold one operation each (see `normalize.py`), with structured
control flow (see `structure.py`). Output, in place on that private copy (the calling pass freezes it):

1. the forward sweep, instrumented to record on the tape (`tape.py`) what the backward sweep needs: the
   part of an array an operation is about to overwrite when an operation reversed later reads the old value
   (here), whatever the control rule of each loop, conditional or symbol assignment records (`control.py`),
   and the final values of the symbols the assignments record;
2. a `ControlFlowRegion` named `gradflow_backward` after the forward sweep that loads the tape pointers,
   copies the arrays the tape restores into working copies (the forward's results stay as they are),
   zeroes the gradient buffers, seeds the gradient of `of`, and reverses the program: a sequence last to
   first, an operation by its rule from the `reverse` table (after restoring what it overwrote), a loop or
   conditional by its rule from the `control` table.

The engine walks the tree and dispatches; it knows no operation or region kinds itself, and imports no rule
table: its caller hands it the tables (`ADTables`) and the function rules call to reverse a sub-program
(`Differentiate`, see `subprograms.py`); checkpoint planning has run before it (`checkpoint_plan.py`).
Invariant of the backward sweep: when an operation is reversed, every working copy holds the value the
array had when the forward sweep ran that operation. The interface (gradient names, forwarded values, rules used) is
returned as frozen facts for the pass to attach.
"""

from __future__ import annotations

import functools
from typing import Sequence, Union

import attrs
import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg.state import ControlFlowRegion, LoopRegion

from gradflow.analysis.activity import OpAccess, activity, is_float
from gradflow.analysis.cost import op_work
from gradflow.analysis.loops import describe_loop, upper_bound, variable_step
from gradflow.autodiff import budget, checkpoint
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import copy_array, copy_region, fill
from gradflow.autodiff.protocols import ControlRule
from gradflow.autodiff.recompute import RecomputePlan, plan_recomputation
from gradflow.autodiff.spec import (
    BACKWARD_LABEL,
    END_LABEL,
    OVERFLOW,
    ADInterface,
    ADSpec,
    ADTables,
    Choice,
    Differentiate,
    ForwardingPlan,
    LoopLimit,
    flag_array,
    set_flag,
)
from gradflow.autodiff.structure import (
    OPERATION,
    AssignItem,
    BranchItem,
    LoopItem,
    Seq,
    block_chain,
    build_tree,
    check_symbols,
    region_items,
    symbols_read,
)
from gradflow.autodiff.tape import Stack, Tape, release
from gradflow.core.errors import NoRuleError, NotDifferentiableError
from gradflow.core.exact_subsets import disjoint
from gradflow.core.rule_table import Rule

#: An item of the control-flow tree that a control rule reverses.
RegionItem = Union[LoopItem, BranchItem, AssignItem]


def _rule_for(tables: ADTables, site: OpSite):
    rule = tables.reverse.lookup(site.op.kind, site)
    if rule is None:
        node = site.members()[0] if site.op.nodes else site.op.label
        raise NoRuleError.build(
            "reverse", f"{site.op.kind} '{node}' ({type(node).__name__})", f"state '{site.state.label}'",
            "expand library nodes (expand_library_nodes pass) or register a reverse rule for this node kind",
        )
    return rule


def _control_rule_for(tables: ADTables, item):
    rule = tables.control.lookup(item.kind, item)
    if rule is None:
        raise NoRuleError.build("control", f"{item.kind} '{item.label}'", "the control-flow tree",
                                "add a control rule for this kind of region to the control table")
    return rule


def _control(tables: ADTables, item) -> ControlRule:
    """The implementation of `item`'s control rule, typed: the engine hands it itself as its `ControlContext`
    (so the type checker holds `Reversal` to that protocol, and the rules to using nothing else)."""
    return _control_rule_for(tables, item).fn


@attrs.define
class Reversal:
    """The state of one reverse-mode build. Control rules see it as a `protocols.ControlContext` (the tape,
    capacities of per-iteration storage, fresh symbol names, the record of what is stored) and nothing
    more; the engine's own steps and the budget planner use the rest."""

    sdfg: dace.SDFG
    spec: ADSpec
    tree: Seq
    sites: list[OpSite]
    loops: dict[int, LoopItem]  # id(LoopRegion) -> its item
    tape: Tape
    tables: ADTables  # the tables of the build
    #: reverse mode of a sub-program (a checkpointed step asks whether its vjp reads forward state)
    differentiate: Differentiate
    pops: dict[int, list[tuple[str, Stack, subsets.Range]]] = attrs.field(factory=dict)  # site -> restores
    needs: list = attrs.field(factory=list)  # site index -> the arrays its reverse reads (`record_overwrites`)
    used_symbols: frozenset[str] = frozenset()  # symbols the backward sweep reads (see `backward_symbols`)
    arguments: frozenset[str] = frozenset()  # the free symbols of the program (given by its caller)
    assigned: frozenset[str] = frozenset()  # symbols assigned on interstate edges of the program
    finals: dict[str, Stack] = attrs.field(factory=dict)  # symbol -> stack of its value at the end
    stores: dict[str, str] = attrs.field(factory=dict)  # tape array -> what it records
    #: the loops the run checks (`LoopLimit`): id -> (loop, count, planned): stopped at a user bound, or
    #: checkpointed for a planned trip count
    bounded: dict[int, tuple[LoopRegion, int, bool]] = attrs.field(factory=dict)
    recorded: dict[int, object] = attrs.field(factory=dict)  # id(region item) -> what its control rule recorded
    active: frozenset[int] = frozenset()  # indices of the operations that write an array carrying a gradient
    tape_free: frozenset[int] = frozenset()  # operations inside loops whose control rule records their state
    guards: dict[str, str] = attrs.field(factory=dict)  # stack -> where it pushes and pops (`first_run_guard`)
    _names: dict[str, int] = attrs.field(factory=dict)

    # ---- for rules -----------------------------------------------------------------------------------

    def fresh(self, stem: str) -> str:
        """A new symbol name `<stem><n>`, unique in this build."""
        n = self._names.get(stem, 0)
        self._names[stem] = n + 1
        return f"{stem}{n}"

    def capacity(self, loops: Sequence[LoopRegion], register: bool = True):
        """Slots needed by a site that runs once per iteration of `loops` (outermost first); None when a
        trip count has no bound before the program runs (the site then gets a growable stack).
        `register=False` only asks (a model pricing storage): a while loop's user bound is then not put into
        force."""
        cap = sympy.Integer(1)
        for k, loop in enumerate(loops):
            bound = self.trip_bound(loop, loops[:k], register)
            if bound is None:
                return None
            cap = cap * bound
        return cap

    def priced_capacity(self, loops: Sequence[LoopRegion]):
        """`capacity` for a model that prices storage: a loop without a bound (its stacks would grow at run
        time) is a `NotDifferentiableError` naming it, since no byte count covers it."""
        bounds = self._asked_bounds(loops)
        for loop, bound in zip(loops, bounds):
            if bound is None:
                step = variable_step(loop)
                if step is not None:
                    raise NotDifferentiableError(
                        f"{describe_loop(loop)} advances by '{step}', not by a constant step, so its trip count has "
                        "no bound before the program runs and the bytes stored inside it cannot be priced",
                        f"count the iterations instead (`for j in range((stop - start + {step} - 1) // {step})`, "
                        f"the variable `start + j * {step}`), or forward with STORE_ALL or RECOMPUTE_ALL, whose "
                        "stacks grow as the loop runs")
                if loop.loop_variable:  # a user bound caps while loops only: a `for` cannot be stopped early
                    hint = ("pass its count as an argument (`T: dace.int64`, `for i in range(T)`: value_and_grad "
                            "prices it at the call; grad takes Forwarding.budget(..., sizes={'T': ...})), or forward "
                            "with STORE_ALL or RECOMPUTE_ALL, whose stacks grow as the loop runs")
                else:
                    hint = (f"give a bound: gradflow.Forwarding.budget(..., loop_bounds={{'{loop.label}': "
                            "<max iterations>}) (a run past it is reported, not silently wrong)")
                raise NotDifferentiableError(
                    f"{describe_loop(loop)} has no trip-count bound before the program runs (its count depends "
                    "on data or on a value the program computes), so the bytes stored inside it cannot be priced",
                    hint)
        return sympy.Mul(sympy.Integer(1), *bounds)

    def trips(self, loops: Sequence[LoopRegion], unbounded=None):
        """How often a site inside `loops` runs, for reports: `capacity`, with `unbounded` (default: a symbol
        `trips_<label>`) for each loop without a bound."""
        counts = []
        for loop, bound in zip(loops, self._asked_bounds(loops)):
            if bound is None:
                bound = unbounded if unbounded is not None else sympy.Symbol(f"trips_{loop.label}", positive=True)
            counts.append(bound)
        return sympy.Mul(sympy.Integer(1), *counts)

    def _asked_bounds(self, loops: Sequence[LoopRegion]) -> list:
        """`trip_bound` of each of `loops` (outermost first) inside the ones before it, without registering
        a user bound (None where there is no bound)."""
        return [self.trip_bound(loop, loops[:k], register=False) for k, loop in enumerate(loops)]

    def trip_bound(self, loop: LoopRegion, outer: Sequence[LoopRegion], register: bool = True):
        """An upper bound of `loop`'s trip count valid for every iteration of `outer`, in the program's
        arguments; a while loop takes the user's bound if there is one (and is then stopped there, see
        `user_bound`, unless `register=False`); None when there is none."""
        item = self.loops[id(loop)]
        counted = item.counted or item.bounded_by
        if counted is not None:
            numerator, divisor = counted.trip_count()
            bound = upper_bound(numerator, self._intervals(outer))
            if bound is not None and {str(s) for s in bound.free_symbols} <= self.arguments:
                # a loop that does not run (`range(2, T)` with T < 2) has a negative numerator: 0 trips, not a
                # negative stack size (an allocation of negative length aborted the program; fuzz seed 21001)
                bound = bound if _nonnegative(bound) else sympy.Max(0, bound)
                return bound if divisor == 1 else symbolic.int_floor(bound, divisor)
        user = self.spec.forwarding.bound_of(loop.label)
        if user is not None and item.counted is None and not loop.loop_variable:
            if register:
                self.bounded[id(loop)] = (loop, user, False)
            return user
        return None

    def note_store(self, array: str, what: str) -> None:
        self.stores[array] = what

    def keep_final(self, symbol: str, dtype) -> None:
        """Save `symbol`'s value at the end of the forward sweep for the backward sweep to start from."""
        if symbol not in self.finals:
            self.finals[symbol] = self.tape.new_stack(f"{symbol}_final", 1, (), dtype)
            self.stores[self.finals[symbol].array] = f"<symbol {symbol}>"

    def worst_case(self, expr, loops: Sequence[LoopRegion]):
        """`expr` at its largest over the values the variables of `loops` take (e.g. the work of a map whose
        range depends on the loop variable); `expr` itself where that cannot be bounded."""
        bound = upper_bound(symbolic.pystr_to_symbolic(str(expr)), self._intervals(loops))
        return expr if bound is None else bound

    def user_bound(self, loop: LoopRegion) -> int | None:
        """The user's bound when storage inside `loop` needed one (the loop must then stop there)."""
        entry = self.bounded.get(id(loop))
        return None if entry is None or entry[2] else entry[1]

    def plan_trips(self, loop: LoopRegion, trips: int) -> int:
        """Register `loop` as one whose schedule holds for `trips` trips only; the number its run sets
        `gradflow_overflow` to when it makes another count."""
        self.bounded[id(loop)] = (loop, trips, True)
        return self.overflow_number(loop)

    def overflow_number(self, loop: LoopRegion) -> int:
        """The 1-based number `loop` sets `gradflow_overflow` to when it reaches its bound (its position in
        `ADInterface.bounded_loops` of the outermost program)."""
        return self.spec.overflow_base + list(self.bounded).index(id(loop)) + 1

    def _intervals(self, loops: Sequence[LoopRegion]) -> dict:
        """Value ranges of the variables of `loops` (counted loops, and loops bounded by a `for` header)."""
        forms = [self.loops[id(loop)].counted or self.loops[id(loop)].bounded_by for loop in loops]
        return {form.var: form.interval() for form in forms if form is not None}

    def item_shape(self, site: OpSite, array: str, sub: subsets.Range) -> tuple:
        """The shape of one slot for `sub`: its size, where that depends on a loop variable or a symbol set at
        run time the array's whole extent."""
        loop_vars = {loop.loop_variable for loop in site.loops} | set(self.assigned)
        shape = []
        for d, size in enumerate(sub.size(for_codegen=True)):  # a strided extent as an integer ceiling
            size = symbolic.pystr_to_symbolic(str(size))
            free = {str(s) for s in getattr(size, "free_symbols", ())}
            shape.append(self.sdfg.arrays[array].shape[d] if free & loop_vars else size)
        return tuple(shape)

    # ---- forward instrumentation ---------------------------------------------------------------------

    def overwrite_sites(self, accesses: list[OpAccess]) -> list[tuple[OpSite, str]]:
        """(operation, array) where the operation overwrites part of the array and its old value may be
        needed later: all but the first definition of a temporary outside loops (garbage nobody reads)."""
        found = []
        for p in self.sites:
            if p.index in self.tape_free:  # a checkpointed loop's snapshots stand in for its stacks
                continue
            for array in sorted(accesses[p.index].writes):
                desc = self.sdfg.arrays[array]
                if desc.transient and not p.loops and array not in accesses[p.index].reads and not any(
                    array in accesses[q.index].reads | accesses[q.index].writes
                    for q in self.sites if q.index < p.index
                ):
                    continue
                found.append((p, array))
        return found

    def stack_bytes(self, site: OpSite, array: str, register: bool = True):
        """Bytes of the stack that saves what `site` overwrites of `array` (symbolic)."""
        item = self.item_shape(site, array, site.written_subset(array))
        elements = self.capacity(site.loops, register) if register else self.priced_capacity(site.loops)
        for extent in item:
            elements = elements * extent
        return elements * self.sdfg.arrays[array].dtype.bytes

    def record_overwrites(self, needs: list[frozenset[str]], accesses: list[OpAccess],
                          recomputed: frozenset[str]) -> None:
        """Push what an operation overwrites when an operation reversed after it reads the old value."""
        self.needs = list(needs)
        for p, array in self.overwrite_sites(accesses):
            if array in recomputed or p.index in self.tape_free:  # (a checkpointed loop stores snapshots)
                continue
            if not any(array in needs[q.index] and self.may_read_overwritten(q, p, array) for q in self.sites):
                continue
            desc = self.sdfg.arrays[array]
            sub = p.written_subset(array)
            stack = self.tape.new_stack(array, self.capacity(p.loops), self.item_shape(p, array, sub), desc.dtype)
            guard = self.first_run_guard(p, array, accesses)
            if guard is not None:
                self.guards[stack.array] = guard
            self.tape.push_subset(p.state.parent_graph, p.state, stack, array, sub, guard)
            self.pops.setdefault(p.index, []).append((array, stack, sub))
            self.stores[stack.array] = array

    def first_run_guard(self, p: OpSite, array: str, accesses: list[OpAccess]) -> str | None:
        """`var != start` when what `p` overwrites of `array` in the first iteration of its loop was never
        written, so that iteration's push (and the pop after its reverse) can be left out; else None.

        The proof, from the program's own sites: `array` is a temporary; every operation that writes it lies
        in p's loop, the only loop around p (a loop around that one would enter it again with values of its
        last run); none before p in the body writes an element p writes (so p's first run overwrites
        elements never written); the loop is counted and its reversal sets the variable to each forward
        value (so the guard holds in exactly the reversed iterations whose push happened), from a start the
        program never reassigns. The restore left out would put back, after p's first reverse, the garbage
        the temporary held before the loop: what is reversed after that ran before p's first run, when no
        element p writes had been written, so no value that matters is lost. A loop of one trip then keeps
        no copy of its temporaries (GradBench ode at s = 1: the stages k1, k2, k3 were pushed and popped for
        nothing). Single elements are left alone: there the branch, taken in every iteration, costs what
        the one copy it saves does."""
        if len(p.loops) != 1 or not self.sdfg.arrays[array].transient:
            return None
        written = p.written_subset(array)
        if symbolic.pystr_to_symbolic(str(written.num_elements())) == 1:
            return None  # one element: the branch each iteration would cost what the one copy saved does
        loop = p.loops[0]
        item = self.loops[id(loop)]
        form = item.counted
        if form is None or form.var not in _control(self.tables, item).restores(item):
            return None
        if not {str(s) for s in form.start.free_symbols} <= self.arguments - self.assigned:
            return None
        for q in self.sites:
            if q is p or array not in accesses[q.index].writes:
                continue
            if not any(outer is loop for outer in q.loops):
                return None
            if q.index < p.index and not disjoint(q.written_subset(array), written):
                return None
        return f"{form.var} != ({symbolic.symstr(form.start)})"

    def may_read_overwritten(self, q: OpSite, p: OpSite, array: str) -> bool:
        """Can operation q read, before p runs, what p overwrites of `array` (so that q's reverse, which
        runs after p's, needs the old value restored)?"""
        return may_precede(q, p) and not self._reads_other_iterations(q, p, array)

    def _reads_other_iterations(self, q: OpSite, p: OpSite, array: str) -> bool:
        """q never reads what p overwrites of `array` before p does: q follows p in the body of the one
        counted loop around both, and in some dimension both touch exactly the element `var + c` of that
        loop's variable (the same c), so q reads, in each iteration, only what p wrote in that iteration
        (`P[i, j] = exp(..)` then `P[i, j] /= s` in `for i`: the old row i is never read)."""
        return q.index > p.index and self._same_element_per_iteration(q, p, q.read_subset(array),
                                                                       p.written_subset(array))

    def _same_element_per_iteration(self, q: OpSite, p: OpSite, touched, written) -> bool:
        """`touched` (by q) and `written` (by p) are, in some dimension, exactly the element `var + c` of the
        variable of the one counted loop around both (the same c): in each iteration q touches only what p
        writes in that iteration."""
        common = [loop for loop in p.loops if any(loop is other for other in q.loops)]
        if len(common) != 1 or touched is None or len(touched) != len(written):
            return False
        form = self.loops[id(common[0])].counted
        if form is None:
            return False
        var = symbolic.pystr_to_symbolic(form.var)
        for w_range, r_range in zip(written, touched):
            w, r = _element_offset(w_range, var, (var,)), _element_offset(r_range, var, (var,))
            if w is not None and r is not None and sympy.simplify(r - w) == 0:
                return True
        return False

    def keeps_result(self, q: OpSite, array: str, recomputed: frozenset[str]) -> bool:
        """Does the backward sweep's value of `array` (`ReverseContext.value_of`) hold, when q is reversed,
        what q wrote into it? Decided once the tape is planned: every operation that may overwrite it
        after q (in program order, or in a later iteration of a loop around both) has its overwrite
        popped before q's reverse, and nothing pops it at q itself. The reverse of `P[i, j] = exp(x - m)`
        then reads `P` instead of calling `exp` again (lp_softmax: P's row is restored for the division
        after it anyway). Under a byte budget, only where the backward keeps the array anyway."""
        def popped(site: OpSite) -> bool:
            return any(a == array for a, _, _ in self.pops.get(site.index, ()))

        if array in recomputed or q.index in self.tape_free or popped(q) or not self._own_elements(q, array):
            return False
        if (self.spec.forwarding.max_bytes is not None and self.sdfg.arrays[array].transient
                and not any(array in needed for needed in self.needs)):
            # under a byte budget, reading the result back would keep a temporary alive for the backward
            # that no reverse needs, which the plan did not count (fuzz seed 31415: 240 bytes over a budget)
            return False
        mine = q.written_subset(array)
        for p in self.sites:
            if p is q or array not in p.written_arrays() or not may_precede(q, p):
                continue
            if p.index in self.tape_free:
                return False
            if not popped(p) and not (p.index < q.index and self._same_element_per_iteration(
                    q, p, mine, p.written_subset(array))):
                return False
        return True

    def _own_elements(self, q: OpSite, array: str) -> bool:
        """No two runs of q write the same element of `array`: for each loop around q, some dimension of
        what it writes is one element `var + c` of that loop's counted variable, with c free of every
        loop variable around q (and a dimension of its own per loop)."""
        if not q.loops:
            return True
        counted = [self.loops[id(loop)].counted for loop in q.loops]
        forms = [form for form in counted if form is not None]
        if len(forms) != len(counted):
            return False
        variables = [symbolic.pystr_to_symbolic(form.var) for form in forms]
        used: set[int] = set()
        written = q.written_subset(array)
        for var in variables:
            d = next((d for d, r in enumerate(written) if d not in used
                      and _element_offset(r, var, variables) is not None), None)
            if d is None:
                return False
            used.add(d)
        return True

    def record_regions(self, seq: Seq, loops: tuple, tables: ADTables, ctx: ReverseContext) -> None:
        """Let each region's control rule instrument the forward sweep, inner regions first."""
        for item in seq.items:
            if item.kind == OPERATION:
                continue
            for child in item.children:
                self.record_regions(child, loops + item.encloses, tables, ctx)
            rule = _control_rule_for(tables, item)
            ctx.note_rule(rule.name)
            implementation: ControlRule = rule.fn  # typed, as `_control` returns it
            self.recorded[id(item)] = implementation.record(item, self, loops)

    def control_tape_bytes(self, seq: Seq | None = None, loops: tuple = ()):
        """Bytes of the stacks the control rules will create (known before anything is recorded)."""
        total = 0
        for item in (seq or self.tree).items:
            if item.kind == OPERATION:
                continue
            total += _control(self.tables, item).tape_bytes(item, self, loops)
            for child in item.children:
                total += self.control_tape_bytes(child, loops + item.encloses)
        return total

    # ---- backward sweep ------------------------------------------------------------------------------

    def reverse(self, seq: Seq, ctx: ReverseContext, rules: list, recompute: RecomputePlan) -> None:
        def body(child: Seq) -> None:
            self.reverse(child, ctx, rules, recompute)

        for item in reversed(seq.items):
            if item.kind == OPERATION:
                site = item.site
                before, after = self._pops_around(site, recompute)
                for array, stack, sub in before:
                    self.tape.pop_subset(ctx, stack, ctx.values[array], sub, self.guards.get(stack.array))
                if site.index in self.active:
                    previous = recompute.emit_before(site, ctx)
                    rules[site.index].fn.reverse(site, ctx)
                    recompute.restore(ctx, previous)
                for array, stack, sub in after:
                    self.tape.pop_subset(ctx, stack, ctx.values[array], sub, self.guards.get(stack.array))
            else:
                _control(ctx.tables, item).reverse(item, self.recorded[id(item)], self, ctx, body)

    def _pops_around(self, site: OpSite, recompute: RecomputePlan) -> tuple[list, list]:
        """The restores of what `site` overwrote, split into those before its reverse and those after it.
        A restore goes after when the reverse reads nothing of that array's values and reruns nothing: the
        reverse may then read what `site` wrote (`y = tan(u)` reads y for 1 + y^2; restored first, y held
        the value from before `site`, a wrong gradient), and the operations reversed later still find the
        old value."""
        pops = self.pops.get(site.index, [])
        if recompute.before.get(site.index) or site.index >= len(self.needs):
            return pops, []
        needed = self.needs[site.index]
        return [p for p in pops if p[0] in needed], [p for p in pops if p[0] not in needed]


def _element_offset(r, var, variables) -> sympy.Expr | None:
    """c where the range `r` is the one element `var + c` with c free of every symbol in `variables`,
    else None."""
    begin, end = symbolic.pystr_to_symbolic(str(r[0])), symbolic.pystr_to_symbolic(str(r[1]))
    if begin != end or var not in getattr(begin, "free_symbols", ()):
        return None
    offset = sympy.simplify(begin - var)
    return None if any(v in getattr(offset, "free_symbols", ()) for v in variables) else offset


def may_precede(q: OpSite, p: OpSite) -> bool:
    """Can operation q run before (or be) operation p in some execution?"""
    return q.index <= p.index or bool(set(map(id, q.loops)) & set(map(id, p.loops)))


@attrs.define
class Survey:
    """What the engine knows about a program before it plans storage: its structure, the rules of its
    operations, what is active and what each reverse needs."""

    tree: Seq
    sites: list[OpSite]
    regions: list[RegionItem]
    rules: list[Rule]
    accesses: list[OpAccess]
    active: set[int]
    buffers: dict[str, str]
    grads: dict[str, str]
    cotangents: dict[str, str]
    region: ControlFlowRegion
    ctx: ReverseContext
    needs: list
    rev: Reversal
    #: per operation, the arrays it wrote that its reverse reads back (`ReverseContext.results_read`)
    results: list = attrs.field(factory=list)

    def choose(self, max_bytes: int) -> Choice:
        """The budget planner's choice for this program (`BudgetError` when nothing fits)."""
        # The budget prices the control tape before the plan exists: every symbol of every operation is
        # taken as read by the backward sweep (a superset of what it reads, so the price is an upper bound).
        self.rev.used_symbols = backward_symbols(self.sites, {s.index for s in self.sites}, {}, None, self.regions)
        return budget.choose(self.rev, self.needs, self.accesses, max_bytes, dict(self.rev.spec.forwarding.sizes),
                             self.results)


def build_reverse(sdfg: dace.SDFG, spec: ADSpec, tables: ADTables, differentiate: Differentiate) -> ADInterface:
    """Reverse mode of `sdfg` in place (module doc); `differentiate` is what rules call to reverse a
    sub-program (see `autodiff/subprograms.py`)."""
    front = survey(sdfg, spec, tables, differentiate)
    tree, sites, regions, rules, accesses = front.tree, front.sites, front.regions, front.rules, front.accesses
    active, buffers, grads, cotangents = front.active, front.buffers, front.grads, front.cotangents
    region, ctx = front.region, front.ctx
    needs, rev = front.needs, front.rev
    choice = None
    if spec.forwarding.max_bytes is not None:
        sizes = dict(spec.forwarding.sizes)
        snapshots = sum(checkpoint.snapshot_bytes(item, rev, sizes, spec.forwarding.snapshots)
                        for item in regions if checkpoint.is_outlined(item)) if spec.forwarding.snapshots else 0
        try:
            choice = front.choose(spec.forwarding.max_bytes - snapshots)
        except budget.BudgetError as err:
            if not snapshots:
                raise
            least = err.minimum + snapshots
            raise budget.BudgetError(
                f"no plan keeps at most {spec.forwarding.max_bytes} bytes with {spec.forwarding.snapshots} "
                f"snapshot(s) of the checkpointed loops ({snapshots} bytes); the least is {least}",
                "raise the budget or take fewer snapshots", least) from None
        choice = attrs.evolve(choice, predicted_bytes=choice.predicted_bytes + snapshots,
                              minimum_bytes=choice.minimum_bytes + snapshots)
    recompute = plan_recomputation(sdfg, sites, needs, accesses, spec.forwarding,
                                   choice.recompute if choice is not None else None, front.results)
    rev.record_overwrites(needs, accesses, recompute.arrays)
    ctx.keeps_result = functools.partial(rev.keeps_result, recomputed=frozenset(recompute.arrays))
    rev.used_symbols = backward_symbols(sites, active, rev.pops, recompute, regions)
    rev.record_regions(tree, (), tables, ctx)

    ctx.overflow_base = spec.overflow_base + len(rev.bounded)

    last = block_chain(sdfg)[-1] if sdfg.nodes() else None
    for symbol, stack in rev.finals.items():
        last = rev.tape.push_symbol(sdfg, last, stack, symbol)
    unset = {s: "0" for s, stack in rev.finals.items()
             if s not in rev.arguments and sdfg.arrays[stack.array].dtype not in (dace.float32, dace.float64)}
    saved = rev.tape.bracket(sdfg, last, unset) if last is not None else None
    last = saved or last
    sdfg.add_node(region)
    if last is not None:
        sdfg.add_edge(last, region, dace.InterstateEdge())
    else:
        sdfg.start_block = sdfg.node_id(region)
    release(sdfg.add_state_after(region, END_LABEL), rev.tape.records())

    # Working copies of the arrays the tape restores, so the forward's results are left as they are.
    restored = sorted({array for entries in rev.pops.values() for array, _, _ in entries})
    init = ctx.new_state("init_gradients", rev.tape.load_pointers())
    for array in restored:
        desc = sdfg.arrays[array]
        ctx.values[array], _ = sdfg.add_array(f"gradflow_work_{array}", desc.shape, desc.dtype, transient=True,
                                              find_new_name=True)
        copy_array(init, array, ctx.values[array])
    recompute.allocate(ctx)
    for array, buffer in buffers.items():
        if array in spec.of:
            if spec.mode == "vjp":
                seeded = dict(spec.seed_regions).get(array)
                if seeded is None:
                    copy_array(init, cotangents[array], buffer)
                else:
                    copy_region(init, cotangents[array], buffer, seeded)
            else:
                fill(init, buffer, "1")
        elif not (spec.accumulate and array in spec.wrt):
            fill(init, buffer, "0")
    for symbol, stack in reversed(rev.finals.items()):
        rev.tape.pop_symbol(ctx, stack, symbol)
    rev.reverse(tree, ctx, rules, recompute)
    _check_restored(region, rev)
    bounded = tuple(LoopLimit(loop.label, count, planned) for loop, count, planned in rev.bounded.values())
    bounded += tuple(ctx.inner_bounded)
    if spec.outermost and spec.overflow_base:  # the numbers the program's own earlier build writes
        bounded = tuple(LoopLimit("", 0, inherited=True) for _ in range(spec.overflow_base)) + bounded
    if bounded:  # loops here or in nested SDFGs report a breached limit in gradflow_overflow
        flag_array(sdfg)  # (the nested rule adds it when only nested loops are bounded)
        if spec.outermost:
            set_flag(sdfg.add_state_before(sdfg.start_block, "gradflow_overflow_clear", is_start_block=True),
                     OVERFLOW, "0")
    sdfg.reset_cfg_list()
    reruns = tuple((array, sites[p].state.label, rev.worst_case(op_work(q), q.loops) * rev.trips(sites[p].loops))
                   for p, plan in sorted(recompute.before.items()) for array, q in plan)
    plan = ForwardingPlan(spec.forwarding.name, (), reruns, choice, tuple(sorted(recompute.declined)))
    return ADInterface(spec, grads, cotangents, buffers, rev.stores, tuple(sorted(recompute.arrays)), bounded,
                       rules_used=tuple(ctx.rules_used), forwarding_plan=plan, heaps=rev.tape.records())


def survey(sdfg: dace.SDFG, spec: ADSpec, tables: ADTables, differentiate: Differentiate) -> Survey:
    """Structure, rules, activity and needs of `sdfg` (adds the gradient buffers and the backward region's
    context, in place: the caller owns `sdfg`)."""
    tree, sites = build_tree(sdfg)
    regions = region_items(tree)
    loops = {id(loop): item for item in regions for loop in item.encloses}
    rules = [_rule_for(tables, site) for site in sites]
    accesses = [OpAccess(site.read_arrays(), site.written_arrays()) for site in sites]
    # a read only through a stop passes no derivative: it neither varies an array nor makes one useful
    flows = [OpAccess(site.differentiable_reads(), site.written_arrays()) for site in sites]
    act = activity(sdfg.arrays, flows, spec.wrt, spec.of)
    active = {s.index for s in sites if accesses[s.index].writes & act.carrying}
    restores = {id(loop): _control(tables, item).restores(item)
                for item in regions for loop in item.encloses}
    check_symbols(sdfg, sites, active, restores, loops.values(), act.varied)

    buffers: dict[str, str] = {}
    grads: dict[str, str] = {}
    for name in sorted(act.carrying):
        desc = sdfg.arrays[name]
        if not is_float(desc):
            continue
        if name in spec.wrt:
            buffers[name] = grads[name] = spec.prefix + name
            sdfg.add_array(buffers[name], desc.shape, desc.dtype, transient=False)
        else:
            buffers[name], _ = sdfg.add_array(f"gradflow_g_{name}", desc.shape, desc.dtype, transient=True,
                                              find_new_name=True)
    cotangents: dict[str, str] = {}
    if spec.mode == "vjp":
        for name in spec.of:
            desc = sdfg.arrays[name]
            cotangents[name] = spec.prefix + name
            sdfg.add_array(cotangents[name], desc.shape, desc.dtype, transient=False)

    region = ControlFlowRegion(BACKWARD_LABEL, sdfg=sdfg)
    ctx = ReverseContext(sdfg, region, act, buffers, tables, spec, differentiate)
    for site, rule in zip(sites, rules):
        if site.index in active:
            ctx.note_rule(rule.name)
    # An inactive operation (it writes no array that carries a gradient) has nothing to reverse: its rule is
    # not asked, so one the rules could not differentiate (e.g. an index read from data) does not block AD.
    needs = [frozenset(rule.fn.needs(site, ctx)) if site.index in active else frozenset()
             for site, rule in zip(sites, rules)]
    rev = Reversal(sdfg, spec, tree, sites, loops, Tape(sdfg), tables=tables, differentiate=differentiate,
                   active=frozenset(active))
    rev.arguments = frozenset(map(str, sdfg.free_symbols))
    rev.assigned = frozenset(k for e in sdfg.all_interstate_edges() for k in e.data.assignments)
    rev.tape_free = frozenset(s.index for s in sites if any(
        _control(tables, loops[id(loop)]).tape_free for loop in s.loops))
    results = [ctx.results_read(site.state) if site.index in active else frozenset() for site in sites]
    return Survey(tree, sites, regions, rules, accesses, active, buffers, grads, cotangents, region, ctx, needs, rev,
                  results)


def _nonnegative(expr) -> bool:
    """`expr` is provably >= 0 for any non-negative values of its symbols (sizes, trip counts)."""
    if expr.is_number:
        return bool(expr >= 0)
    plain = {s: sympy.Symbol(f"__nn_{s}", integer=True, nonnegative=True) for s in expr.free_symbols}
    return bool(expr.xreplace(plain).is_nonnegative)


def backward_symbols(sites: list[OpSite], active: set[int], pops: dict, recompute: RecomputePlan | None,
                     regions: list) -> frozenset[str]:
    """Symbols the backward sweep reads: those of the operations it reverses (active ones), restores from
    the tape (their subsets) or reruns, and the bounds of the counted loops it reverses in closed form."""
    rerun = {q.index for plan in recompute.before.values() for _, q in plan} if recompute is not None else set()
    names = set()
    for site in sites:
        if site.index in active or site.index in pops or site.index in rerun:
            names |= {str(x) for x in site.state.free_symbols}
    for item in regions:
        counted = getattr(item, "counted", None)
        if counted is not None:
            names |= {str(x) for x in (counted.start.free_symbols | counted.stop.free_symbols)}
    return frozenset(names)


def _check_restored(region: ControlFlowRegion, rev: Reversal) -> None:
    """Every symbol the program assigns on interstate edges and the backward sweep reads is set from the
    tape there (a guard: were one missed, its value at the end of the forward sweep would be used)."""
    missed = sorted((symbols_read(region) & rev.assigned) - rev.tape.popped)
    if missed:
        raise NotDifferentiableError(
            f"the backward sweep reads symbol(s) {', '.join(missed)}, assigned on interstate edges of the program, "
            "without restoring them (gradflow does not record where they are assigned)",
            "please report this program; as a workaround compute the value into an array instead",
        )
