"""Forwarding under a byte budget (`Forwarding.budget`): the mixed-integer program's choice is the
optimum over every store/recompute subset, its prediction is what the engine builds, a budget below the
least possible is a typed error stating that least, and the gradients stay exact."""

from __future__ import annotations

import functools
import itertools

import pytest

import gradflow
from gradflow.autodiff.budget import BudgetError
from gradflow.core.errors import GradflowError, InvalidArgumentError, NotDifferentiableError
from gradflow.verify import programs

SMALL = ["lp_softmax", "lp_if_else", "lp_trisolv", "lp_recurrence"]


def _sizes(name: str) -> dict:
    return dict(programs.case_named(name).symbols)


@functools.cache
def _universe(name: str) -> tuple[str, ...]:
    """Every array that can be rerun: what RECOMPUTE_ALL reruns, chain inputs included, and what it declines."""
    plan = programs.differentiated(name, gradflow.RECOMPUTE_ALL).meta["ad"].forwarding_plan
    return tuple(sorted({array for array, _, _ in plan.reruns} | set(plan.declined)))


@functools.cache
def _outcomes(name: str) -> dict[frozenset, tuple[int, int]]:
    """(bytes kept, work rerun) of every recompute subset the engine accepts, as built."""
    sizes = _sizes(name)
    found = {}
    universe = _universe(name)
    for k in range(len(universe) + 1):
        for subset in itertools.combinations(universe, k):
            try:
                plan = programs.differentiated(name, gradflow.recompute(*subset)).meta["ad"].forwarding_plan
            except InvalidArgumentError:
                continue  # not a valid recompute set for this program
            found[frozenset(subset)] = (plan.total_bytes(sizes), plan.total_work(sizes))
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
    graph = programs.differentiated(name, gradflow.Forwarding.budget(budget, sizes=_sizes(name)))
    plan = graph.meta["ad"].forwarding_plan
    built_bytes, built_work = plan.total_bytes(_sizes(name)), plan.total_work(_sizes(name))
    assert built_bytes <= budget
    assert built_work == best, f"budget {budget}: the planner's work {built_work}, the optimum {best}"
    assert (plan.predicted.predicted_bytes, plan.predicted.predicted_cost) == (built_bytes, built_work)
    assert plan.predicted.minimum_bytes == least


@pytest.mark.parametrize("name", SMALL[:2])
def test_a_budget_below_the_least_states_the_least(name: str) -> None:
    least = min(b for b, _ in _outcomes(name).values())
    with pytest.raises(BudgetError, match=f"least any plan needs is {least} bytes") as info:
        programs.differentiated(name, gradflow.Forwarding.budget(least - 1, sizes=_sizes(name)))
    assert info.value.minimum == least


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
    assert "loop_bounds" in str(info.value)
    bounded = gradflow.Forwarding.budget(10**9, sizes={"N": 6}, loop_bounds={"*": 64})
    assert programs.check("lp_newton_sqrt", 0, bounded) < 1e-9
