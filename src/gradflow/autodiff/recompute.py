"""Recomputation: rerun the operation that defined a value instead of storing the value.

Array R can be recomputed for an operation P that reads it (in its reverse) and does not write it (an
update in place, such as a max accumulated into R, may read its own result) when R's defining operation
Q (the last operation before P that writes R):
- sits in the same region and the same loops as P (so rerunning it at P's reverse sees the same loop
  variables), writes only R, without write-conflict resolution, and does not read R; it writes all of R,
  or exactly (no dynamic memlet, not from a nested SDFG) a part that contains what P reads;
- reads nothing that an operation between Q and P overwrites, and no symbol that is reassigned between
  them (so Q's inputs, as the backward sweep holds them for P, are what Q read); inputs that are themselves
  recomputed must satisfy the same conditions (chains such as `a = exp(x); b = sin(a)` are rerun in order).
Then, right before P is reversed, the backward sweep runs a copy of Q that reads the backward's view of
its inputs (working copies where the tape restores them) and writes a backward-local `gradflow_re_R`,
valid for P's reverse only; the inputs of Q become values P needs, so the tape restores them where they
are overwritten later. An array is recomputed (never stored) only when this holds for every operation
that needs it; otherwise it is stored. Under `RECOMPUTE_ALL` the prerequisites of a rerun may be any
array with a valid definition, needed or not.
"""

from __future__ import annotations

import ast
import copy

import attrs
import dace
import sympy
from dace.sdfg.state import LoopRegion, SDFGState

from gradflow.analysis.activity import OpAccess
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.forwarding import ALL, Forwarding
from gradflow.core.errors import InvalidArgumentError

MAX_CHAIN = 16


def _covers_all(site: OpSite, array: str) -> bool:
    desc = site.state.sdfg.arrays[array]
    whole = dace.subsets.Range.from_array(desc)
    sub = site.written_subset(array)
    if sub.dims() != whole.dims():
        return False
    return all(dace.symbolic.simplify(a - b) == 0 for a, b in zip(sub.size(), whole.size())) and all(
        dace.symbolic.simplify(b) == 0 for b, _, _ in sub
    )


def _exact_writes(site: OpSite, array: str) -> bool:
    """One edge writes `array`, exactly its subset (so that subset is what is written, not a bounding box
    of several): no write-conflict resolution, no dynamic memlet (a may-write), not from a nested SDFG
    (whose outer memlet only bounds what it writes)."""
    state = site.state
    edges = [e for i in site.op.writes if state.node(i).data == array for e in state.in_edges(state.node(i))]
    return len(edges) == 1 and not (edges[0].data.wcr is not None or edges[0].data.dynamic
                                    or isinstance(edges[0].src, dace.nodes.NestedSDFG))


def _sym(expr) -> sympy.Expr:
    return sympy.sympify(dace.symbolic.pystr_to_symbolic(str(expr)))


def _covers_read(q: OpSite, array: str, reader: OpSite) -> bool:
    """`q` rebuilds every element of `array` that `reader` reads: `q` writes all of it, or its exact
    write subset contains the reader's read subset (`y[0:k] = ...` for a reader of `y[0:k]` in one loop
    body; the rerun's buffer holds only that part, which is all the reader's reverse reads)."""
    if _covers_all(q, array):
        return True
    need = reader.read_subset(array)
    box = q._box(array, reads=False)
    if need is None or box is None or need.dims() != box.dims() or not _exact_writes(q, array):
        return False
    for (wb, we, ws), (rb, re_, _) in zip(box, need):
        if ws != 1:
            return False
        # through strings: the two subsets may carry like-named symbols with different assumptions
        lo, hi = (sympy.simplify(_sym(a) - _sym(b)) for a, b in ((rb, wb), (we, re_)))
        if not (lo.is_number and hi.is_number and lo >= 0 and hi >= 0):
            return False
    return True


def _no_wcr(site: OpSite, array: str) -> bool:
    state = site.state
    return all(e.data.wcr is None for i in site.op.writes if state.node(i).data == array
               for e in state.in_edges(state.node(i)))


@attrs.define
class RecomputePlan:
    """What to rerun before each operation's reverse; `allocate` adds the buffers when the backward
    region is built (so the plan is filled in two steps and is not frozen)."""

    arrays: frozenset[str]
    before: dict  # site index -> tuple of (array, defining site), in the order to rerun them
    buffers: dict = attrs.field(factory=dict)  # array -> backward-local buffer
    #: arrays `RECOMPUTE_ALL` could rerun but stores: the rerun would keep larger overwritten arrays alive
    declined: frozenset[str] = frozenset()
    #: site index -> the rerun arrays that operation's own reverse reads (the others are a rerun's inputs)
    direct: dict = attrs.field(factory=dict)

    def allocate(self, ctx: ReverseContext) -> None:
        rerun = {array for plan in self.before.values() for array, _ in plan}
        for array in sorted(rerun):
            desc = ctx.sdfg.arrays[array]
            name, _ = ctx.sdfg.add_array(f"gradflow_re_{array}", desc.shape, desc.dtype, transient=True,
                                         find_new_name=True)
            self.buffers[array] = name

    def emit_before(self, site: OpSite, ctx: ReverseContext) -> dict[str, str | None]:
        """Rerun the definitions `site` needs; returns the context's previous views, for `restore`."""
        previous: dict[str, str | None] = {}
        for array, q in self.before.get(site.index, ()):
            previous.setdefault(array, ctx.values.get(array))
            state = copy.deepcopy(q.state)
            state.label = f"recompute_{array}_{q.state.label}"
            renames = {n.data: ctx.values.get(n.data, n.data) for n in state.data_nodes()}
            renames.update(self._locals(state, array, ctx))
            renames[array] = self.buffers[array]
            state.sdfg = ctx.sdfg
            ctx.add_block(state)
            state.replace_dict({k: v for k, v in renames.items() if k != v})
            for node in state.nodes():
                if isinstance(node, dace.nodes.NestedSDFG):
                    node.sdfg.parent, node.sdfg.parent_sdfg, node.sdfg.parent_nsdfg_node = state, ctx.sdfg, node
            ctx.values[array] = self.buffers[array]
        # A rerun's input rebuilt only as far as that rerun reads it (`x0[0]` for `t = x0[0]`) is not the
        # operation's own view of the array (its reverse may read `x0[1]`, which the tape restores).
        own = self.direct.get(site.index, frozenset())
        for array in [a for a in previous if a not in own]:
            self.restore(ctx, {array: previous.pop(array)})
        return previous

    @staticmethod
    def _locals(state: SDFGState, array: str, ctx: ReverseContext) -> dict[str, str]:
        """Temporaries the operation writes inside itself (a fused map's intermediate scalar) get names of
        the backward's own in the rerun: it writes them before reading them, and sharing the forward's would
        make them values the forward hands the backward (forwarded bytes no plan priced)."""
        renames = {}
        for node in state.data_nodes():
            desc = ctx.sdfg.arrays[node.data]
            if (node.data != array and node.data not in ctx.values and desc.transient and state.in_degree(node)
                    and node.data not in renames):
                renames[node.data] = ctx.sdfg.add_datadesc(f"gradflow_re_{node.data}", copy.deepcopy(desc),
                                                           find_new_name=True)
        return renames

    @staticmethod
    def restore(ctx: ReverseContext, previous: dict[str, str | None]) -> None:
        """A recomputed value is valid for the operation it was recomputed for only."""
        for array, view in previous.items():
            if view is None:
                ctx.values.pop(array, None)
            else:
                ctx.values[array] = view


def _assigned_between(first: SDFGState, last: SDFGState) -> set[str]:
    """Symbols assigned (on interstate edges, or as loop variables) between two states of one chain."""
    region, names, block = first.parent_graph, set(), first
    while block is not last:
        out = region.out_edges(block)
        if not out:
            break
        names |= set(out[0].data.assignments)
        block = out[0].dst
        if block is not last and not isinstance(block, SDFGState):
            names |= {k for e in block.all_interstate_edges() for k in e.data.assignments}
            names |= {b.loop_variable for b in [block, *block.all_control_flow_blocks()]
                      if isinstance(b, LoopRegion) and b.loop_variable}
    return names


@attrs.frozen(eq=False)
class Recomputability:
    """Where each array is defined, and whether rerunning that definition rebuilds it for an operation:
    the structural facts both the planner here and the budget model (`budget.py`) use."""

    sites: list
    accesses: list

    def definition(self, array: str, reader: OpSite) -> OpSite | None:
        """The last operation before `reader` that writes `array`."""
        for q in reversed(self.sites[: reader.index]):
            if array in self.accesses[q.index].writes:
                return q
        return None

    def rerunnable(self, array: str, reader: OpSite, target: OpSite, own: bool = False) -> OpSite | None:
        """The definition of `array` as `reader` read it when rerunning it at the reverse of `target`
        rebuilds that value (chains aside), else None. `own`: `reader`'s reverse reads what `reader` itself
        wrote into `array` (exp's value, a max; `ReverseContext.results_read`), so its definition is
        `reader`."""
        if own:
            q: OpSite | None = reader if array not in self.accesses[reader.index].reads else None
        elif array in self.accesses[reader.index].writes:
            return None  # an update in place (a max into y): its reverse may read its own result, not q's
        else:
            q = self.definition(array, reader)
        if q is None or q.op.kind not in ("map", "tasklet", "library", "copy"):
            return None
        if q.loops != target.loops or q.state.parent_graph is not target.state.parent_graph:
            return None
        if self.accesses[q.index].writes != {array} or array in self.accesses[q.index].reads:
            return None
        if not (_covers_read(q, array, reader) and _no_wcr(q, array)):
            return None
        between = set().union(set(), *(self.accesses[s.index].writes for s in self.sites[q.index + 1: target.index]))
        if self.accesses[q.index].reads & between:
            return None
        if {str(x) for x in q.state.free_symbols} & _assigned_between(q.state, target.state):
            return None  # a symbol it reads may have another value by then
        return q

    def chain(self, array: str, reader: OpSite, target: OpSite, wanted: set, strict: bool,
              depth: int = 0, own: bool = False) -> list[tuple[str, OpSite]] | None:
        """The reruns (prerequisites first) that rebuild `array` as `reader` read it (`own`: as `reader`
        wrote it), at the reverse of `target`, recomputing the inputs in `wanted` too (strict: all of them,
        or None). A lenient chain stops at depth `MAX_CHAIN`; a strict one follows the budget planner's
        choice, which prices chains of any depth (nb_resnet's batch norms at 10%: 17 reruns deep)."""
        q = self.rerunnable(array, reader, target, own) if strict or depth <= MAX_CHAIN else None
        if q is None:
            return None
        reruns: list[tuple[str, OpSite]] = []
        for inp in sorted(self.accesses[q.index].reads & wanted):
            sub = self.chain(inp, q, target, wanted, strict, depth + 1)
            if sub is None:
                if strict:
                    return None
                continue  # not recomputable here: the input is restored from the tape instead
            reruns.extend(sub)
        return reruns + [(array, q)]


#: the value symbols take when `RECOMPUTE_ALL` compares sizes (it has no sizes; budgets have exact ones)
SIZE_PROBE = 64


def _elements(sdfg: dace.SDFG, name: str) -> float:
    """The element count of `name` with every symbol at `SIZE_PROBE` (0 when it cannot be evaluated)."""
    size = dace.symbolic.pystr_to_symbolic(str(sdfg.arrays[name].total_size))
    try:
        return float(size.subs({s: SIZE_PROBE for s in size.free_symbols}))
    except (TypeError, ValueError):
        return 0.0


def _keeps_more(sdfg: dace.SDFG, array: str, plans, accesses: list[OpAccess]) -> bool:
    """Whether rerunning what defines `array` reads arrays that a later operation overwrites (so the
    backward sweep would have to keep their old values, e.g. a whole array put on the tape per iteration)
    that are larger than `array` itself: `RECOMPUTE_ALL` then stores `array` instead of trading a small
    value for a large one."""
    kept = set()
    for plan in plans:
        for _, q in plan:
            later = set().union(*(a.writes for a in accesses[q.index:])) if q.index < len(accesses) else set()
            kept |= {r for r in accesses[q.index].reads if r in later and r != array}
    return sum(_elements(sdfg, r) for r in kept) > _elements(sdfg, array)


def _kept_for_free(sdfg: dace.SDFG, array: str, accesses: list[OpAccess]) -> bool:
    """A program argument that a single operation writes: `RECOMPUTE_ALL` keeps it as `STORE_ALL` does (the
    backward sweep reads it where it is, or the tape restores it where that operation runs again in a
    loop) instead of rerunning it, which would make the rerun's inputs forwarded: go_fast's `B = A +
    trace`, rerun, kept the scalar `trace`, 8 bytes where storing kept none."""
    return not sdfg.arrays[array].transient and sum(array in a.writes for a in accesses) == 1


def _plain_assignment(tasklet: dace.nodes.Tasklet) -> bool:
    """The tasklet's code is `out = in`, one connector to another."""
    try:
        body = ast.parse(tasklet.code.as_string.strip()).body
    except SyntaxError:
        return False
    return (len(body) == 1 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
            and isinstance(body[0].targets[0], ast.Name) and isinstance(body[0].value, ast.Name)
            and body[0].targets[0].id in tasklet.out_connectors and body[0].value.id in tasklet.in_connectors)


def _moves_data(site: OpSite) -> bool:
    """The operation only moves data: a copy, or a map or tasklet whose every computation is `out = in`
    (a slice, a flip, a transpose, a broadcast)."""
    if site.op.kind == "copy":
        return True
    if site.op.kind not in ("map", "tasklet"):
        return False
    members = site.members()
    return all(not isinstance(n, (dace.nodes.NestedSDFG, dace.nodes.LibraryNode)) for n in members) and all(
        _plain_assignment(n) for n in members if isinstance(n, dace.nodes.Tasklet))


def rebuilt_for_free(sdfg: dace.SDFG, sites: list[OpSite], needs: list[frozenset[str]],
                     accesses: list[OpAccess]) -> set[str]:
    """The transients that `STORE_ALL` rebuilds instead of storing: every reader's value comes from an
    operation that only moves data, out of arrays that no operation writes or that the backward sweep
    holds anyway (they are needed themselves). Rerunning such a definition costs one copy, as a tape
    push and pop does, and keeps nothing more alive; storing it would put a second copy of those values on
    the tape (nb_durbin's two flipped slices: two row stacks of N*(N-1) doubles)."""
    facts = Recomputability(sites, accesses)
    needed = set().union(*needs) if needs else set()
    written = set().union(*(a.writes for a in accesses)) if accesses else set()
    free = set()
    for array in sorted(needed):
        if not sdfg.arrays[array].transient:
            continue
        readers = [p for p in sites if array in needs[p.index]]
        defs = [facts.definition(array, p) for p in readers]
        if all(q is not None and _moves_data(q)
               and all(x not in written or x in needed for x in accesses[q.index].reads) for q in defs):
            free.add(array)
    return free


def _choose(sdfg: dace.SDFG, sites: list[OpSite], needs: list[frozenset[str]], accesses: list[OpAccess],
            facts: "Recomputability", wanted: set[str], strict: bool, free: set[str],
            results: list[frozenset[str]]) -> tuple[set[str], set[str], dict[int, list[tuple[str, OpSite]]]]:
    """(arrays recomputed, arrays declined, the reruns before each operation with duplicates) for `wanted`:
    an array is recomputed when a chain rebuilds it for every operation that reads it."""
    needed = set().union(*needs, *results) if needs else set()
    chosen: set[str] = set()
    declined: set[str] = set()
    before: dict[int, list[tuple[str, OpSite]]] = {}
    for array in sorted(wanted):
        if array not in needed:
            continue
        if not strict and _kept_for_free(sdfg, array, accesses):
            continue
        uses = ([(p, False) for p in sites if array in needs[p.index]]
                + [(p, True) for p in sites if array in results[p.index]])  # (reader, reads its own result)
        readers = [p for p, _ in uses]
        plans = [facts.chain(array, p, p, wanted, strict, own=own) for p, own in uses]
        if (not strict and array not in free and all(plan is not None for plan in plans)
                and _keeps_more(sdfg, array, plans, accesses)):
            declined.add(array)
            continue
        if all(plan is not None for plan in plans):
            chosen.add(array)
            for p, plan in zip(readers, plans):
                assert plan is not None  # every plan is, by the test just above
                before.setdefault(p.index, []).extend(plan)
        elif strict:
            raise InvalidArgumentError(
                f"array '{array}' cannot be recomputed: its defining operation is not a single full overwrite "
                "in the same loop and region as every operation that needs it, or its inputs change in between",
                "store it (leave it out of `recompute`)",
            )
    return chosen, declined, before


def plan_recomputation(sdfg: dace.SDFG, sites: list[OpSite], needs: list[frozenset[str]],
                       accesses: list[OpAccess], policy: Forwarding,
                       chosen_set: frozenset[str] | None = None,
                       results: list[frozenset[str]] | None = None) -> RecomputePlan:
    """Which arrays to recompute, and what to rerun before each operation; updates `needs` in place.
    `chosen_set`, when given, replaces the policy's set (the budget planner's choice). `results`: per
    operation, the arrays it wrote that its reverse reads back (`ReverseContext.results_read`); one of
    them recomputed is rebuilt by rerunning that operation itself before its reverse."""
    results = results if results is not None else [frozenset() for _ in sites]
    free: set[str] = set()  # rerun without weighing what the rerun keeps: it keeps nothing more
    if chosen_set is None and policy.rebuild_copies and (not policy.recompute or policy.recompute == ALL):
        free = rebuilt_for_free(sdfg, sites, needs, accesses)
    if chosen_set is not None:
        wanted, strict = set(chosen_set), True
    elif not policy.recompute:
        wanted, strict = set(free), False
    elif policy.recompute == ALL:
        wanted, strict = set(sdfg.arrays), False
    else:
        wanted, strict = set(policy.recompute), True
        unknown = sorted(a for a in wanted if a not in sdfg.arrays)
        if unknown:
            raise InvalidArgumentError(
                f"forwarding names arrays the program does not have: {', '.join(unknown)}",
                f"arrays: {', '.join(sorted(n for n in sdfg.arrays if not n.startswith('gradflow_')))}",
            )
    if not wanted:
        return RecomputePlan(frozenset(), {})
    facts = Recomputability(sites, accesses)
    while True:
        chosen, declined, before = _choose(sdfg, sites, needs, accesses, facts, wanted, strict, free, results)
        # Deduplicate reruns per operation (the first occurrence respects prerequisites). What the reruns
        # read becomes a value that operation needs (so the tape restores it), unless it is rerun too.
        final: dict[int, tuple[tuple[str, OpSite], ...]] = {}
        extras: dict[int, frozenset[str]] = {}
        for index, plan in before.items():
            seen, ordered = set(), []
            for array, q in plan:
                if array not in seen:
                    seen.add(array)
                    ordered.append((array, q))
            final[index] = tuple(ordered)
            extras[index] = frozenset(set().union(*(accesses[q.index].reads for _, q in ordered)) - seen)
        # The tape restores only arrays that are not recomputed (`record_overwrites`): an input a chain
        # could not rerun for one operation (overwritten since it was defined) but that is recomputed for
        # another would reach that rerun stale. Such an array is stored for every reader instead. (A strict
        # chain reruns every wanted input or fails, so only a lenient one leaves a wanted input behind.)
        conflicts = chosen & set().union(set(), *extras.values())
        if not conflicts:
            break
        assert not strict, conflicts
        wanted = wanted - conflicts
    direct = {index: frozenset(a for a, _ in reruns if a in chosen and (a in needs[index] or a in results[index]))
              for index, reruns in final.items()}
    for index in final:
        # only what the operation itself gets recomputed leaves its needs: a rerun's input it also reads (an
        # element overwritten each iteration that an in-place product reads) is restored by the tape
        needs[index] = (needs[index] - direct[index]) | extras[index]
    return RecomputePlan(frozenset(chosen), final, declined=frozenset(declined), direct=direct)
