"""What one reverse-mode build is asked (`ADSpec`, `ADTables`) and what it answers (`ADInterface`).

These records sit below the engine and the rules, so that a rule which differentiates a sub-program (a
nested SDFG, a checkpointed step) can state what it asks without importing the engine: the engine hands
it a `Differentiate` function through its context.
"""

from __future__ import annotations

from typing import Callable, Mapping

import attrs
import dace
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion

from gradflow.analysis.cost import STORE_WORK, evaluate
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.core.errors import LoopBoundError
from gradflow.core.rule_table import RuleTable

BACKWARD_LABEL = "gradflow_backward"
#: An empty state after the backward region: DaCe 2.0.0b1's post-dominator analysis (used to place
#: allocations) loops forever-cyclic when a plain ControlFlowRegion is the last block of its SDFG.
END_LABEL = "gradflow_end"
#: The int64[1] argument through which a run reports that a loop broke a limit of its build (`LoopLimit`).
OVERFLOW = "gradflow_overflow"


@attrs.frozen
class LoopLimit:
    """A loop whose runs the differentiated program checks, reporting a breach through `OVERFLOW` (its
    1-based position in `ADInterface.bounded_loops`): a while loop stopped at the user's bound (`count`),
    or, `planned`, a checkpointed loop whose Revolve schedule was computed for `count` trips (a run of
    another trip count would follow the wrong schedule)."""

    label: str
    count: int
    planned: bool = False
    #: a limit of the program's own earlier build (a gradient program differentiated again), whose flag
    #: numbers its own run keeps: what it was is not known here
    inherited: bool = False


def inherited_limits(sdfg: dace.SDFG) -> int:
    """How many flag numbers the program itself may write into `OVERFLOW` (a gradient program with loop
    limits, differentiated again): the largest constant any tasklet of it, nested ones included, writes
    there. The new build numbers its own limits after them."""
    largest = 0
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, dace.nodes.Tasklet) or not isinstance(state, dace.SDFGState):
            continue
        code = node.code.as_string.strip()
        if (code.startswith("__o = ") and code[6:].strip().isdigit()
                and any(isinstance(e.dst, dace.nodes.AccessNode) and e.dst.data == OVERFLOW
                        for e in state.out_edges(node))):
            largest = max(largest, int(code[6:].strip()))
    return largest


def check_loop_bounds(arrays: Mapping, limits: tuple[LoopLimit, ...]) -> None:
    """Raise `LoopBoundError` when a run of a differentiated program broke one of `limits` (the
    `bounded_loops` of its `ADInterface` or `VJPResult`), reading its `OVERFLOW` output in `arrays`: a
    while loop stopped at its bound, or a checkpointed loop ran a trip count its schedule was not made for."""
    flag = arrays.get(OVERFLOW) if limits else None
    number = int(flag.reshape(-1)[0]) if flag is not None else 0
    if not number:
        return
    limit = limits[number - 1]
    if limit.inherited:
        raise LoopBoundError(
            f"the program differentiated is itself a differentiated program, and this run broke a loop limit of "
            f"its build ({OVERFLOW} = {number}: a while loop stopped at its bound, or a checkpointed loop run at "
            "a trip count other than its planned one); the gradients of this call are invalid",
            "raise that build's loop bounds, or call it at the sizes its checkpoints were planned for")
    if limit.planned:
        raise LoopBoundError(
            f"checkpointed loop '{limit.label}' ran a number of times other than the {limit.count} its Revolve "
            "schedule was computed for (the sizes= of Forwarding.checkpoint or Forwarding.budget); the "
            "gradients of this call are invalid",
            "call it at the sizes it was planned for, pass this call's sizes, or use gradflow.value_and_grad, "
            "which plans at each call")
    raise LoopBoundError(
        f"while loop '{limit.label}' ran more than its bound of {limit.count} iterations; the gradients of this "
        "call are invalid",
        f"raise the bound: forwarding=gradflow.Forwarding(loop_bounds={{'{limit.label}': <larger>}})")


@attrs.frozen
class ADTables:
    """The rule tables one reverse-mode build uses (the fields of the `reverse` pass, bundled); the
    built-in ones are `autodiff.rules.default_tables()`."""

    reverse: RuleTable
    library: RuleTable
    control: RuleTable


@attrs.frozen
class ADSpec:
    wrt: tuple[str, ...]
    of: tuple[str, ...]
    mode: str = "grad"  # "grad": seed 1.0; "vjp": seed from a cotangent argument
    prefix: str = "grad_"
    forwarding: Forwarding = STORE_ALL
    accumulate: bool = False  # vjp mode: add into the `wrt` gradients (in/out) instead of overwriting them
    outermost: bool = True  # False for the SDFG of a nested node: the outer program owns gradflow_overflow
    #: flag numbers up to this one are taken: by the limits of enclosing programs (a nested build), or by the
    #: program's own earlier build (outermost: a gradient program differentiated again, `inherited_limits`)
    overflow_base: int = 0
    # vjp mode: (array, subset) pairs, the only part of an `of` array's cotangent that is seeded. The vjp of
    # a map's nested body gets whole outer arrays but one iteration's part of them: seeding it all cost a
    # copy of the whole array per iteration (lp_map_with_branch: 8 s at N = 200,000).
    seed_regions: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Choice:
    """The planner's answer: the recompute set, and what the model predicts for it (`predicted_cost`: the
    work of the reruns plus that of the tape stacks, as `ForwardingPlan.total_cost` counts it)."""

    recompute: frozenset[str]
    predicted_bytes: int
    predicted_cost: int
    minimum_bytes: int



@attrs.frozen
class ForwardingPlan:
    """What reaches the backward sweep and how, as built (`ADInterface.forwarding_plan`): the forward's
    temporaries and tape stacks kept for it (bytes, symbolic), the stacks of overwritten values among them
    (elements, symbolic), the definitions rerun for it (which array, for which operation, the work of one
    rerun times how often that operation's reverse runs), and, under a budget, what the planner predicted."""

    policy: str
    kept: tuple[tuple[str, object], ...] = ()
    reruns: tuple[tuple[str, str, object], ...] = ()
    predicted: Choice | None = None
    #: arrays stored although they could be rerun (`RECOMPUTE_ALL` declines a rerun that would keep larger
    #: overwritten arrays for the backward sweep than the value it saves)
    declined: tuple[str, ...] = ()
    #: tape stacks of overwritten values and the elements each holds (the control flow's stacks are not here)
    pushed: tuple[tuple[str, object], ...] = ()

    def total_bytes(self, sizes: Mapping[str, int]) -> int:
        return sum(evaluate(b, sizes, f"the size of '{a}'") for a, b in self.kept)

    def total_work(self, sizes: Mapping[str, int]) -> int:
        return sum(evaluate(w, sizes, f"the rerun of '{a}'") for a, _, w in self.reruns)

    def total_pushed(self, sizes: Mapping[str, int]) -> int:
        return sum(evaluate(n, sizes, f"the size of '{a}'") for a, n in self.pushed)

    def total_cost(self, sizes: Mapping[str, int]) -> int:
        """What the budget planner minimizes: rerun work plus `STORE_WORK` per element pushed on the tape."""
        return self.total_work(sizes) + STORE_WORK * self.total_pushed(sizes)

    def describe(self, sizes: Mapping[str, int] | None = None) -> str:
        """A table a person reads: kept arrays and their bytes, reruns and their work, totals."""
        def shown(expr, what):
            return str(evaluate(expr, sizes, what)) if sizes is not None else str(expr)

        lines = [f"forwarding plan ({self.policy})", "  kept for the backward sweep:"]
        lines += [f"    {a:40s} {shown(b, a):>12s} bytes" for a, b in self.kept] or ["    nothing"]
        lines.append("  recomputed in the backward sweep:")
        lines += [f"    {a:40s} for {p:30s} work {shown(w, a)}" for a, p, w in self.reruns] or ["    nothing"]
        if self.declined:
            lines.append(f"  stored although recomputable (the rerun would keep more): {', '.join(self.declined)}")
        if sizes is not None:
            lines.append(f"  total: {self.total_bytes(sizes)} bytes kept, {self.total_work(sizes)} element operations "
                         f"rerun, {self.total_pushed(sizes)} elements pushed on the tape (cost "
                         f"{self.total_cost(sizes)})")
        if self.predicted is not None:
            lines.append(f"  planner: predicted {self.predicted.predicted_bytes} bytes, work "
                         f"{self.predicted.predicted_cost} (reruns and tape); least possible "
                         f"{self.predicted.minimum_bytes} bytes")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


@attrs.frozen
class ADInterface:
    """Frozen facts about a differentiated SDFG, attached to the Graph as `meta["ad"]`."""

    spec: ADSpec
    grads: dict[str, str]  # wrt -> gradient output array
    cotangents: dict[str, str]  # of -> cotangent input array (vjp mode)
    buffers: dict[str, str]  # forward array -> gradient buffer (internal and outputs)
    stores: dict[str, str]  # tape array -> forward array (or "<control>") it records
    recomputed: tuple[str, ...] = ()  # arrays the backward sweep recomputes instead of storing
    bounded_loops: tuple[LoopLimit, ...] = ()  # the loops whose runs report through OVERFLOW
    backward_label: str = BACKWARD_LABEL
    rules_used: tuple[str, ...] = ()  # names of the reverse, library and control rules applied
    forwarding_plan: ForwardingPlan | None = None  # what is kept and what is rerun (see budget.py)
    #: heap records of the growable stacks (tape.py): their buffers live within one call of the SDFG
    heaps: tuple[str, ...] = ()

    def backward_region(self, sdfg: dace.SDFG):
        """The region of `sdfg` (the differentiated one) that holds the backward sweep."""
        return next(b for b in sdfg.nodes() if b.label == self.backward_label)


#: Reverse mode of a sub-program: a private, not yet normalized SDFG and what to build from it -> the
#: normalized SDFG, now forward + backward, and its interface. Rules get it from the engine (the nested
#: rule, checkpointed loops), so that recursion does not import upwards.
Differentiate = Callable[[dace.SDFG, ADSpec], "tuple[dace.SDFG, ADInterface]"]


def flag_array(sdfg: dace.SDFG) -> str:
    """`OVERFLOW`, added to `sdfg` as a non-transient int64[1] if it has none yet."""
    if OVERFLOW not in sdfg.arrays:
        sdfg.add_array(OVERFLOW, (1,), dace.int64, transient=False)
    return OVERFLOW


def flag_branch(sdfg: dace.SDFG, label: str, condition: str, number: int) -> ConditionalBlock:
    """A conditional (`label`) that sets `OVERFLOW` to `number` when `condition` holds; the caller places it
    in its region (after a loop stopped at its bound, before a loop whose trip count was planned)."""
    check = ConditionalBlock(label, sdfg=sdfg)
    hit = ControlFlowRegion(f"{label}_hit", sdfg=sdfg)
    check.add_branch(condition, hit)
    set_flag(hit.add_state("set_overflow", is_start_block=True), flag_array(sdfg), str(number))
    return check


def set_flag(state, array: str, value: str) -> None:
    """array[0] = value, as a tasklet in `state`."""
    tasklet = state.add_tasklet(f"set_{array}", set(), {"__o"}, f"__o = {value}")
    state.add_edge(tasklet, "__o", state.add_write(array), None, dace.Memlet(f"{array}[0]"))
