"""The reverse-mode engine: from a normalized forward SDFG to forward + backward in one SDFG.

Input: a private SDFG whose states hold one operation each (see `normalize.py`), with structured
control flow (see `structure.py`). Output, in place on that private copy (the calling pass freezes it):

1. the forward sweep, instrumented to record on the tape (`tape.py`) what the backward sweep needs:
   the part of an array an operation is about to overwrite when an operation reversed later reads the
   old value; the trip count of each loop that is not a counted `for`; the branch each conditional took;
2. a `ControlFlowRegion` named `gradflow_backward` after the forward sweep that loads the tape
   pointers, copies the arrays the tape restores into working copies (the forward's results stay as
   they are), zeroes the gradient buffers, seeds the gradient of `of`, and then reverses the program:
   a sequence last to first, a counted loop as a loop over the same values in reverse order, another
   loop as a loop over its recorded trip count, a conditional as a conditional on the recorded branch,
   and an operation by its rule from the reverse-rule table, after restoring what it overwrote.

Invariant of the backward sweep: when an operation is reversed, every working copy holds the value the
array had when the forward sweep ran that operation. The interface (gradient names, forwarded values)
is returned as frozen facts for the pass to attach.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import dace
import sympy
from dace import subsets, symbolic
from dace.properties import CodeBlock
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.analysis.activity import OpAccess, activity, is_float
from gradflow.analysis.loops import upper_bound
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import copy_array, fill
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.autodiff.recompute import RecomputePlan, plan_recomputation
from gradflow.autodiff.rules import REVERSE_RULES, load_builtin_rules
from gradflow.autodiff.structure import BranchItem, LoopItem, OpItem, Seq, block_chain, build_tree, check_symbols
from gradflow.autodiff.tape import Stack, Tape
from gradflow.core.errors import NoRuleError, NotDifferentiableError

BACKWARD_LABEL = "gradflow_backward"
OVERFLOW = "gradflow_overflow"


@attrs.frozen
class ADSpec:
    wrt: tuple[str, ...]
    of: tuple[str, ...]
    mode: str = "grad"  # "grad": seed 1.0; "vjp": seed from a cotangent argument
    prefix: str = "grad_"
    forwarding: Forwarding = STORE_ALL
    accumulate: bool = False  # vjp mode: add into the `wrt` gradients (in/out) instead of overwriting them


@attrs.frozen
class ADInterface:
    """Frozen facts about a differentiated SDFG, attached to the Graph as `meta["ad"]`."""

    spec: ADSpec
    grads: dict[str, str]  # wrt -> gradient output array
    cotangents: dict[str, str]  # of -> cotangent input array (vjp mode)
    buffers: dict[str, str]  # forward array -> gradient buffer (internal and outputs)
    stores: dict[str, str]  # tape array -> forward array (or "<control>") it records
    recomputed: tuple[str, ...] = ()  # arrays the backward sweep recomputes instead of storing
    bounded_loops: tuple[tuple[str, int], ...] = ()  # (label, user bound) of guarded while loops
    backward_label: str = BACKWARD_LABEL


def _rule_for(site: OpSite):
    rule = REVERSE_RULES.table.lookup(site.op.kind, site)
    if rule is None:
        node = site.members()[0] if site.op.nodes else site.op.label
        raise NoRuleError.build(
            "reverse", f"{site.op.kind} '{node}' ({type(node).__name__})", f"state '{site.state.label}'",
            "expand library nodes (expand_library_nodes pass) or register a reverse rule for this node kind",
        )
    return rule.fn


@attrs.define
class _Builder:
    sdfg: dace.SDFG
    spec: ADSpec
    tree: Seq
    sites: list[OpSite]
    loops: dict[int, LoopItem]  # id(LoopRegion) -> item
    tape: Tape
    pops: dict[int, list[tuple[str, Stack, subsets.Range]]] = attrs.field(factory=dict)  # site -> restores
    control: dict[int, tuple[Stack, str]] = attrs.field(factory=dict)  # id(item) -> (stack, symbol)
    iteration: dict[int, list[tuple[Stack, str]]] = attrs.field(factory=dict)  # id(item) -> per-iteration symbols
    used_symbols: frozenset[str] = frozenset()  # symbols active operations read
    stores: dict[str, str] = attrs.field(factory=dict)
    bounded: dict[int, tuple[LoopRegion, int]] = attrs.field(factory=dict)  # while loops with a user bound

    # ---- capacities ----------------------------------------------------------------------------------

    def _intervals(self, loops: Sequence[LoopRegion]) -> dict:
        """Value ranges of the variables of `loops` (counted loops, and loops bounded by a `for` header)."""
        forms = [self.loops[id(loop)].counted or self.loops[id(loop)].bounded_by for loop in loops]
        return {form.var: form.interval() for form in forms if form is not None}

    def trip_bound(self, loop: LoopRegion, outer: Sequence[LoopRegion]):
        item = self.loops[id(loop)]
        counted = item.counted or item.bounded_by
        if counted is not None:
            numerator, divisor = counted.trip_count()
            bound = upper_bound(numerator, self._intervals(outer))
            if bound is not None:
                return bound if divisor == 1 else symbolic.int_floor(bound, divisor)
        user = self.spec.forwarding.bound_of(loop.label)
        if user is not None and item.counted is None and not loop.loop_variable:
            self.bounded[id(loop)] = (loop, user)
            return user
        raise NotDifferentiableError(
            f"loop '{loop.label}' has a trip count gradflow cannot bound at compile time, and values "
            "overwritten inside it must be stored per iteration",
            f"for a while loop give a bound: forwarding=gradflow.Forwarding(loop_bounds={{'{loop.label}': <max "
            "iterations>}) (or the key '*'); or recompute the overwritten arrays",
        )

    def capacity(self, loops: Sequence[LoopRegion]):
        cap = sympy.Integer(1)
        for k, loop in enumerate(loops):
            cap = cap * self.trip_bound(loop, loops[:k])
        return cap

    def item_shape(self, site: OpSite, array: str, sub: subsets.Range) -> tuple:
        loop_vars = {l.loop_variable for l in site.loops}
        shape = []
        for d, size in enumerate(sub.size()):
            size = symbolic.pystr_to_symbolic(str(size))
            free = {str(s) for s in getattr(size, "free_symbols", ())}
            shape.append(self.sdfg.arrays[array].shape[d] if free & loop_vars else size)
        return tuple(shape)

    # ---- forward instrumentation ---------------------------------------------------------------------

    def record_overwrites(self, needs: list[frozenset[str]], accesses: list[OpAccess],
                          recomputed: frozenset[str]) -> None:
        """Push what an operation overwrites when an operation reversed after it reads the old value."""
        for p in self.sites:
            for array in sorted(accesses[p.index].writes):
                if array in recomputed:
                    continue
                if not any(array in needs[q.index] and _may_precede(q, p) for q in self.sites):
                    continue
                desc = self.sdfg.arrays[array]
                if desc.transient and not p.loops and array not in accesses[p.index].reads and not any(
                    array in accesses[q.index].reads | accesses[q.index].writes
                    for q in self.sites if q.index < p.index
                ):
                    continue  # first definition of a temporary: its old value is garbage nobody reads
                sub = p.written_subset(array)
                stack = self.tape.new_stack(array, self.capacity(p.loops), self.item_shape(p, array, sub), desc.dtype)
                self.tape.push_subset(p.state.parent_graph, p.state, stack, array, sub)
                self.pops.setdefault(p.index, []).append((array, stack, sub))
                self.stores[stack.array] = array

    def record_control(self, seq: Seq, loops: tuple) -> None:
        """Count the iterations of non-counted loops and note the branch each conditional took."""
        for item in seq.items:
            if isinstance(item, LoopItem):
                self.record_control(item.body, loops + (item.loop,))
                if item.counted is not None:
                    continue
                counter = f"gf_n{len(self.control)}"
                region = item.loop.parent_graph
                region.add_state_before(item.loop, f"count_{item.loop.label}", is_start_block=region.start_block is item.loop,
                                        assignments={counter: "0"})
                _ensure_start(item.loop)
                tick = item.loop.add_state_before(item.loop.start_block, f"tick_{item.loop.label}",
                                                  is_start_block=True, assignments={counter: f"{counter} + 1"})
                for sym in item.iteration_symbols:
                    if sym in self.used_symbols:
                        stack = self.tape.new_stack(f"{sym}_{item.loop.label}", self.capacity(loops + (item.loop,)),
                                                    (), dace.int64)
                        self.tape.push_symbol(item.loop, tick, stack, sym)
                        self.iteration.setdefault(id(item), []).append((stack, sym))
                        self.stores[stack.array] = f"<symbol {sym}>"
                stack = self.tape.new_stack(f"trips_{item.loop.label}", self.capacity(loops), (), dace.int64)
                self.tape.push_symbol(region, item.loop, stack, counter)
                self.control[id(item)] = (stack, counter)
                self.stores[stack.array] = "<trip count>"
            elif isinstance(item, BranchItem):
                for body in item.branches:
                    self.record_control(body, loops)
                taken = f"gf_b{len(self.control)}"
                region = item.block.parent_graph
                region.add_state_before(item.block, f"branch_{item.block.label}",
                                        is_start_block=region.start_block is item.block, assignments={taken: "-1"})
                for j, (_, branch) in enumerate(item.block.branches):
                    _ensure_start(branch)
                    branch.add_state_before(branch.start_block, f"took_{item.block.label}_{j}", is_start_block=True,
                                            assignments={taken: str(j)})
                stack = self.tape.new_stack(f"branch_{item.block.label}", self.capacity(loops), (), dace.int64)
                self.tape.push_symbol(region, item.block, stack, taken)
                self.control[id(item)] = (stack, taken)
                self.stores[stack.array] = "<branch taken>"

    def guard_bounded_loops(self) -> tuple[tuple[str, int], ...]:
        """Stop each user-bounded while loop at its bound and flag the overflow (see `forwarding.py`)."""
        if not self.bounded:
            return ()
        self.sdfg.add_array(OVERFLOW, (1,), dace.int64, transient=False)
        labels = []
        for number, (loop, bound) in enumerate(self.bounded.values(), start=1):
            item = self.loops[id(loop)]
            counter = self.control[id(item)][1]
            cond = loop.loop_condition.as_string
            loop.loop_condition = CodeBlock(f"({cond}) and ({counter} < {bound})")
            region = loop.parent_graph
            check = ConditionalBlock(f"overflow_{loop.label}", sdfg=self.sdfg)
            region.add_node(check)
            for e in list(region.out_edges(loop)):
                region.remove_edge(e)
                region.add_edge(check, e.dst, e.data)
            region.add_edge(loop, check, dace.InterstateEdge())
            hit = ControlFlowRegion(f"overflow_{loop.label}_hit", sdfg=self.sdfg)
            check.add_branch(f"({cond}) and ({counter} >= {bound})", hit)
            _set_flag(hit.add_state("set_overflow", is_start_block=True), str(number))
            labels.append((loop.label, bound))
        return tuple(labels)

    # ---- backward sweep ------------------------------------------------------------------------------

    def reverse(self, seq: Seq, ctx: ReverseContext, rules: list, recompute: RecomputePlan) -> None:
        for item in reversed(seq.items):
            if isinstance(item, OpItem):
                site = item.site
                for array, stack, sub in self.pops.get(site.index, ()):
                    self.tape.pop_subset(ctx, stack, ctx.values[array], sub)
                previous = recompute.emit_before(site, ctx)
                rules[site.index].reverse(site, ctx)
                recompute.restore(ctx, previous)
            elif isinstance(item, LoopItem):
                loop = item.loop
                if item.counted is not None:
                    c = item.counted
                    first = "<=" if c.step < 0 else ">="
                    cond = f"{c.var} {first} {symbolic.symstr(c.start)}"
                    rev = LoopRegion(f"reverse_{loop.label}", cond, c.var, f"{c.var} = {c.last_value()}",
                                     f"{c.var} = {c.var} - ({c.step})", sdfg=self.sdfg)
                else:
                    stack, counter = self.control[id(item)]
                    self.tape.pop_symbol(ctx, stack, counter)
                    k = f"gf_k{counter[4:]}"
                    rev = LoopRegion(f"reverse_{loop.label}", f"{k} >= 0", k, f"{k} = {counter} - 1",
                                     f"{k} = {k} - 1", sdfg=self.sdfg)
                ctx.add_block(rev)
                with ctx.inside(rev):
                    for stack, sym in self.iteration.get(id(item), ()):
                        self.tape.pop_symbol(ctx, stack, sym)
                    self.reverse(item.body, ctx, rules, recompute)
            elif isinstance(item, BranchItem):
                stack, taken = self.control[id(item)]
                self.tape.pop_symbol(ctx, stack, taken)
                block = ConditionalBlock(f"reverse_{item.block.label}", sdfg=self.sdfg)
                ctx.add_block(block)
                for j, body in enumerate(item.branches):
                    region = ControlFlowRegion(f"reverse_{item.block.label}_{j}", sdfg=self.sdfg)
                    block.add_branch(f"{taken} == {j}", region)
                    with ctx.inside(region):
                        self.reverse(body, ctx, rules, recompute)


def _set_flag(state, value: str) -> None:
    tasklet = state.add_tasklet("set_overflow", set(), {"__o"}, f"__o = {value}")
    state.add_edge(tasklet, "__o", state.add_write(OVERFLOW), None, dace.Memlet(f"{OVERFLOW}[0]"))


def _ensure_start(region: ControlFlowRegion) -> None:
    if not region.nodes():
        region.add_state(f"{region.label}_empty", is_start_block=True)


def _may_precede(q: OpSite, p: OpSite) -> bool:
    """Can operation q run before (or be) operation p in some execution?"""
    return q.index <= p.index or bool(set(map(id, q.loops)) & set(map(id, p.loops)))


def _loop_items(seq: Seq, out: dict[int, LoopItem]) -> dict[int, LoopItem]:
    for item in seq.items:
        if isinstance(item, LoopItem):
            out[id(item.loop)] = item
            _loop_items(item.body, out)
        elif isinstance(item, BranchItem):
            for body in item.branches:
                _loop_items(body, out)
    return out


def build_reverse(sdfg: dace.SDFG, spec: ADSpec) -> ADInterface:
    load_builtin_rules()
    tree, sites = build_tree(sdfg)
    loops = _loop_items(tree, {})
    rules = [_rule_for(site) for site in sites]
    accesses = [OpAccess(site.read_arrays(), site.written_arrays()) for site in sites]
    act = activity(sdfg.arrays, accesses, spec.wrt, spec.of)
    active = {s.index for s in sites if accesses[s.index].writes & act.carrying}
    check_symbols(sdfg, sites, active, loops.values())

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
    ctx = ReverseContext(sdfg, region, act, buffers)
    needs = [frozenset(rule.needs(site, ctx)) for site, rule in zip(sites, rules)]
    recompute = plan_recomputation(sdfg, sites, needs, accesses, spec.forwarding)
    builder = _Builder(sdfg, spec, tree, sites, loops, Tape(sdfg))
    builder.used_symbols = frozenset(str(x) for site in sites if site.index in active for x in site.state.free_symbols)
    builder.record_overwrites(needs, accesses, recompute.arrays)
    builder.record_control(tree, ())
    bounded = builder.guard_bounded_loops()

    last = block_chain(sdfg)[-1] if sdfg.nodes() else None
    saved = builder.tape.bracket(sdfg, last) if last is not None else None
    last = saved or last
    if bounded:
        _set_flag(sdfg.start_block, "0")
    sdfg.add_node(region)
    if last is not None:
        sdfg.add_edge(last, region, dace.InterstateEdge())
    else:
        sdfg.start_block = sdfg.node_id(region)

    # Working copies of the arrays the tape restores, so the forward's results are left as they are.
    restored = sorted({array for entries in builder.pops.values() for array, _, _ in entries})
    init = ctx.new_state("init_gradients", builder.tape.load_pointers())
    for array in restored:
        desc = sdfg.arrays[array]
        ctx.values[array], _ = sdfg.add_array(f"gradflow_work_{array}", desc.shape, desc.dtype, transient=True,
                                              find_new_name=True)
        copy_array(init, array, ctx.values[array])
    recompute.allocate(ctx)
    for array, buffer in buffers.items():
        if array in spec.of:
            if spec.mode == "vjp":
                copy_array(init, cotangents[array], buffer)
            else:
                fill(init, buffer, "1")
        elif not (spec.accumulate and array in spec.wrt):
            fill(init, buffer, "0")
    builder.reverse(tree, ctx, rules, recompute)
    sdfg.reset_cfg_list()
    return ADInterface(spec, grads, cotangents, buffers, builder.stores, tuple(sorted(recompute.arrays)), bounded)
