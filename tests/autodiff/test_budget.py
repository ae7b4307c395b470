"""Forwarding under a byte budget (`Forwarding.budget`): the mixed-integer program's choice is the
optimum over every store/recompute subset, its prediction is what the engine builds, storing is priced
(a plan that fits the budget is never costlier than RECOMPUTE_ALL's when that fits too), a budget below the
least possible is a typed error stating that least, and the gradients stay exact. The tests of the MILP
itself keep the budget to storing and recomputing (`checkpoint=False`); a budget that checkpoints loops
is tested in test_checkpoint.py."""

from __future__ import annotations

import functools
import itertools

import pytest

import gradflow
from gradflow.analysis.cost import STORE_WORK, evaluate
from gradflow.autodiff.budget import BudgetError
from gradflow.autodiff.passes import forwarded_bytes
from gradflow.core.errors import GradflowError, InvalidArgumentError, NotDifferentiableError
from gradflow.verify import programs

#: programs with 2 to 6 arrays that can be rerun (lp_softmax had 3 before its exp-and-sum loop became a map;
#: lp_if_else has 8 since a definition that writes part of an array may be rerun for a reader of that part)
SMALL = ["lp_cholesky_dot", "lp_conditional_accumulate", "lp_trisolv", "lp_recurrence"]


def _sizes(name: str) -> dict:
    return dict(programs.case_named(name).symbols)


@functools.cache
def _universe(name: str) -> tuple[str, ...]:
    """Every array that can be rerun: what RECOMPUTE_ALL reruns, chain inputs included, and what it declines."""
    plan = programs.differentiated(name, gradflow.RECOMPUTE_ALL).meta["ad"].forwarding_plan
    return tuple(sorted({array for array, _, _ in plan.reruns} | set(plan.declined)))


def _moves(graph, sizes: dict) -> int:
    """Element operations a plan adds to the fwd+bwd call, counted from the built graph: the work of its
    reruns, and `STORE_WORK` per element of every stack of overwritten values (the push and the pop)."""
    ad = graph.meta["ad"]
    stacks = [s for s, array in ad.stores.items() if not array.startswith("<")]  # not the control flow's
    pushed = sum(evaluate(graph.sdfg.arrays[s].total_size, sizes, s) for s in stacks)
    return ad.forwarding_plan.total_work(sizes) + STORE_WORK * pushed


@functools.cache
def _outcomes(name: str) -> dict[frozenset, tuple[int, int]]:
    """(bytes kept, cost: `_moves`) of every recompute subset the engine accepts, as built."""
    sizes = _sizes(name)
    found = {}
    universe = _universe(name)
    for k in range(len(universe) + 1):
        for subset in itertools.combinations(universe, k):
            try:
                graph = programs.differentiated(name, gradflow.recompute(*subset))
            except InvalidArgumentError:
                continue  # not a valid recompute set for this program
            found[frozenset(subset)] = (graph.meta["ad"].forwarding_plan.total_bytes(sizes), _moves(graph, sizes))
    return found


def test_the_universe_is_small_enough_to_enumerate() -> None:
    assert all(2 <= len(_universe(n)) <= 6 for n in SMALL)


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 0.9, 1.0])
def test_milp_equals_the_brute_force_optimum(name: str, fraction: float) -> None:
    outcomes = _outcomes(name)
    least = min(b for b, _ in outcomes.values())
    most = max(b for b, _ in outcomes.values())
    budget = int(least + fraction * (most - least))
    best = min(w for b, w in outcomes.values() if b <= budget)
    graph = programs.differentiated(name, gradflow.Forwarding.budget(budget, sizes=_sizes(name), checkpoint=False))
    plan = graph.meta["ad"].forwarding_plan
    built_bytes, built_cost = plan.total_bytes(_sizes(name)), _moves(graph, _sizes(name))
    assert built_bytes <= budget
    assert built_cost == best, f"budget {budget}: the planner's cost {built_cost}, the optimum {best}"
    assert (plan.predicted.predicted_bytes, plan.predicted.predicted_cost) == (built_bytes, built_cost)
    assert plan.total_cost(_sizes(name)) == built_cost
    assert plan.predicted.minimum_bytes == least


@pytest.mark.parametrize("name", [*SMALL, "lp_softmax"])
def test_a_budget_that_recompute_all_fits_costs_no_more_than_recompute_all(name: str) -> None:
    """Storing is not free. When the planner priced only reruns, lp_softmax at 75% of STORE_ALL's bytes
    (room for RECOMPUTE_ALL's plan) kept two more row-sized stacks to save two one-tasklet reruns, and its
    fwd+bwd ran 1.24x slower than RECOMPUTE_ALL's (benchmarks/results/memory.md)."""
    sizes = _sizes(name)
    every = programs.differentiated(name, gradflow.RECOMPUTE_ALL)
    stored = programs.differentiated(name, gradflow.STORE_ALL).meta["ad"].forwarding_plan.total_bytes(sizes)
    floor = every.meta["ad"].forwarding_plan.total_bytes(sizes)
    for budget in sorted({floor, max(floor, int(0.75 * stored)), max(floor, stored)}):
        chosen = programs.differentiated(name, gradflow.Forwarding.budget(budget, sizes=sizes, checkpoint=False))
        assert _moves(chosen, sizes) <= _moves(every, sizes), \
            f"budget {budget}: {chosen.meta['ad'].forwarding_plan.describe(sizes)}"


@pytest.mark.parametrize("name", SMALL[:2])
def test_a_budget_below_the_least_states_the_least(name: str) -> None:
    least = min(b for b, _ in _outcomes(name).values())
    with pytest.raises(BudgetError, match=f"least any plan needs is {least} bytes") as info:
        programs.differentiated(name, gradflow.Forwarding.budget(least - 1, sizes=_sizes(name), checkpoint=False))
    assert info.value.minimum == least


def test_a_scalar_pushed_per_iteration_is_dearer_than_three_element_reruns() -> None:
    """lp_go_fast reads B[i, j] * B[i, j] in a scalar double loop. Pricing a push and pop at 2 element
    operations, every budget with room for it stored the product (1 million scalars at N = 1000) to save
    rerunning it and its two reads, and ran 1.9x slower than RECOMPUTE_ALL (22.3 ms against 12.0 ms);
    priced as measured, a budget that RECOMPUTE_ALL's plan fits reruns them."""
    name = "lp_go_fast"
    sizes = _sizes(name)
    every = programs.differentiated(name, gradflow.RECOMPUTE_ALL).meta["ad"].recomputed
    stored = programs.differentiated(name, gradflow.STORE_ALL).meta["ad"].forwarding_plan.total_bytes(sizes)
    chosen = programs.differentiated(name, gradflow.Forwarding.budget(stored, sizes=sizes)).meta["ad"].recomputed
    assert chosen == every


@pytest.mark.parametrize("name", ["lp_map_of_loops", "lp_map_of_while"])
def test_a_nested_sdfgs_own_tape_is_not_held_against_the_budget(name: str) -> None:
    """A map body's loop is differentiated as a nested SDFG whose forward is rerun in the backward sweep:
    its tape never crosses from the forward, and STORE_ALL forwards nothing. The budget used to be applied
    inside it as well, so a budget of what STORE_ALL forwards was rejected (least 56 bytes)."""
    sizes = _sizes(name)
    stored = programs.differentiated(name, gradflow.STORE_ALL)
    budget = forwarded_bytes(stored, sizes)
    graph = programs.differentiated(name, gradflow.Forwarding.budget(budget, sizes=sizes))
    assert forwarded_bytes(graph, sizes) <= budget
    assert programs.check(name, 3, gradflow.Forwarding.budget(budget, sizes=sizes)) < 1e-9


def test_symbolic_sizes_need_values() -> None:
    with pytest.raises(GradflowError, match="sizes=") as info:
        programs.differentiated("lp_softmax", gradflow.Forwarding.budget(10_000))
    assert "'N'" in str(info.value) or "'M'" in str(info.value)


def test_budget_is_a_whole_number_of_bytes() -> None:
    with pytest.raises(InvalidArgumentError, match="byte budget"):
        gradflow.Forwarding.budget(-5)
    assert gradflow.Forwarding.budget(100, sizes={"N": 3}).name == "budget(100)"


@pytest.mark.parametrize("name", SMALL)
def test_gradients_under_a_tight_budget_are_exact(name: str) -> None:
    least = min(b for b, _ in _outcomes(name).values())
    assert programs.check(name, 3, gradflow.Forwarding.budget(least, sizes=_sizes(name))) < 1e-9


def test_the_plan_is_printable() -> None:
    sizes = _sizes("lp_softmax")
    plan = programs.differentiated("lp_softmax", gradflow.Forwarding.budget(1200, sizes=sizes)).meta["ad"] \
        .forwarding_plan
    text = plan.describe(sizes)
    assert "kept for the backward sweep" in text and "recomputed in the backward sweep" in text
    assert f"total: {plan.total_bytes(sizes)} bytes kept" in text


def test_a_while_loop_without_a_bound_cannot_be_priced_and_says_which() -> None:
    # Its stacks would grow at run time: a byte budget cannot cover them, and the error names the loop.
    with pytest.raises(NotDifferentiableError, match="no trip-count bound") as info:
        programs.differentiated("lp_newton_sqrt", gradflow.Forwarding.budget(10**9, sizes={"N": 6}))
    assert "loop_bounds" in str(info.value) and "the while loop (line" in str(info.value)
    bounded = gradflow.Forwarding.budget(10**9, sizes={"N": 6}, loop_bounds={"*": 64})
    assert programs.check("lp_newton_sqrt", 0, bounded) < 1e-9


def test_a_call_costs_more_than_an_arithmetic_operation() -> None:
    """lp_recurrence reruns sin(...) per element; priced as one element operation, budgets that
    RECOMPUTE_ALL's plan fits reran it instead of keeping the stack, 1.08x slower than RECOMPUTE_ALL."""
    import dace

    from gradflow.analysis.cost import CALL_WORK, _tasklet_work

    plain = dace.sdfg.nodes.Tasklet("t", {"a", "b"}, {"o"}, "o = a * b + a")
    called = dace.sdfg.nodes.Tasklet("t", {"a"}, {"o"}, "o = sin(a) + max(a, 0.0)")
    assert _tasklet_work(plain) == 1 and _tasklet_work(called) == 1 + CALL_WORK
    assert CALL_WORK > STORE_WORK  # a stored element is cheaper than rerunning a call
    name = "lp_recurrence"
    sizes = {"N": 200000}
    every = programs.differentiated(name, gradflow.RECOMPUTE_ALL)
    fits = forwarded_bytes(every, sizes)
    chosen = programs.differentiated(name, gradflow.Forwarding.budget(fits, sizes=sizes)).meta["ad"].recomputed
    assert chosen == every.meta["ad"].recomputed


def test_a_budget_below_every_plan_of_a_loop_with_a_branch_on_its_accumulator_states_the_least() -> None:
    """lp_conditional_accumulate's body branches on a symbol it computes from data. Its checkpointed step was
    refused once (the step exported that symbol); it is checkpointed now, but its plans keep no fewer bytes
    than storing (N = 10): a budget below every plan is a `BudgetError` stating the least of the
    store/recompute and checkpointed plans, and that least is enough."""
    name = "lp_conditional_accumulate"
    sizes = _sizes(name)
    with pytest.raises(BudgetError) as plain:
        programs.differentiated(name, gradflow.Forwarding.budget(1, sizes=sizes, checkpoint=False))
    least = plain.value.minimum
    with pytest.raises(BudgetError, match="checkpointed or not") as info:
        programs.differentiated(name, gradflow.Forwarding.budget(least - 1, sizes=sizes))
    assert info.value.minimum == least
    fitted = programs.differentiated(name, gradflow.Forwarding.budget(least, sizes=sizes))
    assert fitted.meta["ad"].forwarding_plan.total_bytes(sizes) <= least
