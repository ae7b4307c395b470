"""Budgets a user can just set: `value_and_grad` with `Forwarding.budget(max_bytes)` or
`Forwarding.checkpoint(snapshots)` and no `sizes=`, on loop programs written as users write them (trip
counts as arguments, a symbolic trip count, an if/else in a loop, a row softmax, 2-D and 3-D stencils).

For each style, at 10/25/50/75% of STORE_ALL's forwarded bytes at the call's sizes: the gradients equal
STORE_ALL's (1e-12 relative) and the plan keeps at most the budget, or the budget is refused with a
`BudgetError` whose stated least is itself a budget that works. A plan is made once per set of call values
(sizes and trip counts) and reused for the same values."""

from __future__ import annotations

import dace
import numpy as np
import pytest

import gradflow
from gradflow import Forwarding
from gradflow.api import grad_graph
from gradflow.autodiff.budget import BudgetError, OverBudgetError, check_within
from gradflow.autodiff.spec import Choice, ForwardingPlan
from gradflow.core.errors import ArgumentError, InvalidArgumentError

N = dace.symbol("N")
M = dace.symbol("M")
T = dace.symbol("T")


@dace.program
def jacobi_steps(A: dace.float64[N], B: dace.float64[N], S: dace.float64[1], steps: dace.int64):
    for t in range(1, steps):
        B[1:-1] = 0.33333 * (A[:-2] + np.tanh(A[1:-1]) + A[2:])
        A[1:-1] = 0.33333 * (B[:-2] * B[1:-1] + B[2:])
    S[0] = np.sum(A * A)


@dace.program
def seidel_steps(A: dace.float64[N, N], S: dace.float64[1], tsteps: dace.int64):
    for t in range(0, tsteps - 1):
        for i in range(1, N - 1):
            A[i, 1:-1] += (A[i - 1, :-2] * A[i - 1, 1:-1] + A[i - 1, 2:] + A[i, 2:] +
                           A[i + 1, :-2] + A[i + 1, 1:-1] * A[i + 1, 2:]) * 0.1
            for j in range(1, N - 1):
                A[i, j] += A[i, j - 1]
                A[i, j] /= 9.0
    S[0] = np.sum(A)


@dace.program
def heat_steps(A: dace.float64[N, N, N], B: dace.float64[N, N, N], S: dace.float64[1], tsteps: dace.int64):
    for t in range(1, tsteps):
        B[1:-1, 1:-1, 1:-1] = (0.125 * (A[2:, 1:-1, 1:-1] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[:-2, 1:-1, 1:-1]) +
                               0.125 * (A[1:-1, 2:, 1:-1] * A[1:-1, :-2, 1:-1]) +
                               0.125 * (A[1:-1, 1:-1, 2:] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[1:-1, 1:-1, :-2]) +
                               A[1:-1, 1:-1, 1:-1])
        A[1:-1, 1:-1, 1:-1] = (0.125 * (B[2:, 1:-1, 1:-1] * B[:-2, 1:-1, 1:-1]) +
                               0.125 * (B[1:-1, 2:, 1:-1] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[1:-1, :-2, 1:-1]) +
                               B[1:-1, 1:-1, 1:-1])
    S[0] = np.sum(A)


@dace.program
def symbolic_steps(x: dace.float64[N], S: dace.float64[1]):
    for t in range(T):
        x[:] = np.sin(x) * 0.9 + 0.1
    S[0] = np.sum(x)


@dace.program
def branch_in_loop(x: dace.float64[N], S: dace.float64[1]):
    acc = np.zeros([N], dtype=np.float64)
    for t in range(8):
        if t % 2 == 0:
            acc[:] = acc + np.sin(x) * x
        else:
            acc[:] = acc * np.cos(x)
    S[0] = np.sum(acc)


@dace.program
def row_softmax(x: dace.float64[N, M], S: dace.float64[1]):
    mx = np.max(x, axis=1)
    e = np.exp(x - mx[:, None])
    s = np.sum(e, axis=1)
    y = e / s[:, None]
    S[0] = np.sum(y * y)


@dace.program
def count_from_array(x: dace.float64[N], cnt: dace.int64[2], S: dace.float64[1]):
    for t in range(cnt[0], cnt[1], 2):
        x[:] = np.sin(x * (t * 0.1)) + 0.1 * t
    S[0] = np.sum(x * x)


@dace.program
def computed_count(x: dace.float64[N], S: dace.float64[1]):
    k = 0
    for i in range(N):
        if x[i] > 0.5:
            k += 1
    for t in range(k, 2 * k + 1):
        x[:] = np.sin(x * (t * 0.1)) + 0.1 * t
    k = 100  # assigned again after the loop: its reverse must use the start the loop ran with
    S[0] = np.sum(x * x) + k


#: styles whose trip count the program reads or computes: STORE_ALL's stacks grow as the loop runs, so its
#: bytes are priced here as what it stores, the loop's state (N float64) once per trip
GROWING = {"count_from_array": lambda args: 8 * args["x"].size * len(range(args["cnt"][0], args["cnt"][1], 2)),
           "computed_count": lambda args: 8 * args["x"].size * (int(np.sum(args["x"] > 0.5)) + 1)}


@dace.program
def inner_loop_in_step(x0: dace.float64[M], w0: dace.float64[M], S: dace.float64[1]):
    acc1 = np.zeros((1,), dtype=np.float64)
    for i2 in range(0, M - 1):
        acc1[:] *= acc1[:]
        for i3 in range(2, M - 2):
            acc1[0] *= (-0.75)
    acc1[:] -= S[:]
    S[0] += np.sum(x0 * w0) + np.sum(acc1 * 1.0)


def _arguments(name: str, rng: np.random.Generator) -> tuple[object, str, dict]:
    """(program, wrt, arguments of one call) per style."""
    cases = {
        "jacobi_steps": (jacobi_steps, "A", dict(A=rng.random(12), B=rng.random(12), steps=6)),
        "seidel_steps": (seidel_steps, "A", dict(A=rng.random((6, 6)), tsteps=4)),
        "heat_steps": (heat_steps, "A", dict(A=rng.random((5, 5, 5)), B=rng.random((5, 5, 5)), tsteps=4)),
        "symbolic_steps": (symbolic_steps, "x", dict(x=rng.random(12), T=20)),
        "branch_in_loop": (branch_in_loop, "x", dict(x=rng.random(12))),
        "row_softmax": (row_softmax, "x", dict(x=rng.random((3, 11)))),
        "count_from_array": (count_from_array, "x", dict(x=rng.random(12), cnt=np.array([3, 14]))),
        "computed_count": (computed_count, "x", dict(x=rng.random(12))),
    }
    return cases[name]


def _copies(arguments: dict) -> dict:
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in arguments.items()}


def _run(program, wrt: str, policy: Forwarding, arguments: dict):
    """(gradient, the plan built at the call, its sizes) of one call through `value_and_grad`."""
    f = gradflow.value_and_grad(program, wrt=wrt, of="S", forwarding=policy)
    _, gradient = f(**_copies(arguments))
    ((key, plan),) = f.plans.items()
    return gradient, plan, dict(key)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.max(np.abs(a - b)) <= 1e-12 * max(1.0, float(np.max(np.abs(b)))))


STYLES = ["jacobi_steps", "seidel_steps", "heat_steps", "symbolic_steps", "branch_in_loop", "row_softmax",
          "count_from_array", "computed_count"]


@pytest.mark.parametrize("style", STYLES)
def test_budgets_without_sizes(style):
    program, wrt, arguments = _arguments(style, np.random.default_rng(7))
    _, expected = gradflow.value_and_grad(program, wrt=wrt, of="S")(**_copies(arguments))
    # STORE_ALL's bytes at the call's sizes (the sizes a budget planned at the call reports)
    _, _, sizes = _run(program, wrt, Forwarding.budget(10**15), arguments)
    if style in GROWING:
        full = GROWING[style](arguments)
    else:
        store_all = grad_graph(program, wrt, "S", forwarding=Forwarding(sizes=sizes)).meta["ad"].forwarding_plan
        full = store_all.total_bytes(sizes)
    assert full > 0, "a style whose backward sweep needs nothing tests no budget"
    for fraction in (0.10, 0.25, 0.50, 0.75):
        budget = int(full * fraction)
        try:
            gradient, plan, _ = _run(program, wrt, Forwarding.budget(budget), arguments)
        except BudgetError as refused:
            assert str(refused.minimum) in refused.message and refused.minimum > budget
            assert "for_" not in refused.message.split("DaCe's label")[0]  # loops named by line and variable
            budget = refused.minimum  # the least it states is a budget that works
            gradient, plan, _ = _run(program, wrt, Forwarding.budget(budget), arguments)
        assert plan.total_bytes(sizes) <= budget, (fraction, plan.describe(sizes))
        assert _close(gradient, expected), fraction


def test_a_checkpoint_policy_needs_no_sizes():
    program, wrt, arguments = _arguments("symbolic_steps", np.random.default_rng(3))
    _, expected = gradflow.value_and_grad(program, wrt=wrt, of="S")(**_copies(arguments))
    gradient, plan, sizes = _run(program, wrt, Forwarding.checkpoint(snapshots=3), arguments)
    assert sizes == {"N": 12, "T": 20} and plan.policy.startswith("checkpoint(3")
    assert _close(gradient, expected)


@pytest.mark.parametrize("style", ["count_from_array", "computed_count"])
def test_a_count_known_once_the_loop_ran_is_checkpointed_online(style):
    """The loop variable of each step (start 3 or k, step 2 or 1) is the forward's, with 1 to 3 snapshots."""
    program, wrt, arguments = _arguments(style, np.random.default_rng(11))
    _, expected = gradflow.value_and_grad(program, wrt=wrt, of="S")(**_copies(arguments))
    for snapshots in (1, 3):
        gradient, plan, _ = _run(program, wrt, Forwarding.checkpoint(snapshots=snapshots), arguments)
        assert any(a.startswith("gradflow_online_") for a, _ in plan.kept), plan.kept
        assert _close(gradient, expected), snapshots


def test_a_plan_per_set_of_call_values():
    rng = np.random.default_rng(5)
    f = gradflow.value_and_grad(jacobi_steps, wrt="A", of="S", forwarding=Forwarding.budget(400))
    f(A=rng.random(12), B=rng.random(12), steps=6)
    f(rng.random(12), rng.random(12), np.zeros(1), 6)  # positionally: the same values, the same plan
    assert list(f.plans) == [(("N", 12), ("steps", 6))]
    a, b = rng.random(12), rng.random(12)
    _, gradient = f(A=a.copy(), B=b.copy(), steps=9)  # another trip count: planned again
    assert list(f.plans) == [(("N", 12), ("steps", 6)), (("N", 12), ("steps", 9))]
    _, expected = gradflow.value_and_grad(jacobi_steps, wrt="A", of="S")(A=a.copy(), B=b.copy(), steps=9)
    assert _close(gradient, expected)
    f(A=rng.random(20), B=rng.random(20), steps=9)  # another size
    assert len(f.plans) == 3


@pytest.mark.parametrize("policy", [Forwarding.budget(400), Forwarding.checkpoint(2)], ids=["budget", "checkpoint"])
def test_a_loop_that_does_not_run_at_the_call_is_planned(policy):
    """`range(1, steps)` at steps = 0 and 1 runs no iteration. The plan at the call took the trip count
    0 among its sizes, which the converter of `sizes` refused as if it were a loop bound ("positive int
    bounds"; found by the fuzzer's value_and_grad route on the regression `loop_that_does_not_run...`)."""
    f = gradflow.value_and_grad(jacobi_steps, wrt="A", of="S", forwarding=policy)
    reference = gradflow.value_and_grad(jacobi_steps, wrt="A", of="S")
    a, b = np.linspace(0.1, 1.2, 12), np.linspace(-1.0, 0.5, 12)
    for steps in (0, 1, 3):
        _, gradient = f(A=a.copy(), B=b.copy(), steps=steps)
        _, expected = reference(A=a.copy(), B=b.copy(), steps=steps)
        assert _close(gradient, expected), steps
    assert dict(Forwarding.budget(400, sizes={"T": 0}).sizes) == {"T": 0}
    with pytest.raises(InvalidArgumentError, match="sizes must map symbol names to int"):
        Forwarding.budget(400, sizes={"T": 1.5})
    with pytest.raises(InvalidArgumentError, match="loop_bounds must map"):
        Forwarding.budget(400, loop_bounds={"*": 0})


def test_a_call_that_does_not_give_a_trip_count_is_told_which():
    f = gradflow.value_and_grad(jacobi_steps, wrt="A", of="S", forwarding=Forwarding.budget(400))
    with pytest.raises(ArgumentError, match="'steps'"):
        f(A=np.ones(12), B=np.ones(12))


def test_grad_names_the_values_a_budget_needs_by_the_users_names():
    with pytest.raises(InvalidArgumentError) as refused:
        gradflow.grad(jacobi_steps, wrt="A", of="S", forwarding=Forwarding.budget(400))
    assert "steps" in str(refused.value) and "for_" not in str(refused.value)
    # given, it plans (the sizes are the user's names, too)
    graph = gradflow.grad(jacobi_steps, wrt="A", of="S", forwarding=Forwarding.budget(400, sizes={"N": 12, "steps": 6}))
    assert "grad_A" in graph.arrays


def test_a_plan_over_its_budget_is_never_returned():
    plan = ForwardingPlan("budget(100)", kept=(("kept", "8 * N"),), predicted=Choice(frozenset(), 80, 0, 0))
    check_within(plan, Forwarding.budget(100, sizes={"N": 12}))  # 96 bytes: within
    with pytest.raises(OverBudgetError, match="104 bytes"):
        check_within(plan, Forwarding.budget(100, sizes={"N": 13}))
    with pytest.raises(OverBudgetError, match="grow"):
        check_within(plan, Forwarding.budget(100, sizes={"N": 12}), heaps=("gradflow_heap_x",))


def test_torch_function_plans_a_budget_at_the_call():
    import torch

    import gradflow.torch as gt

    x0 = torch.rand(12, dtype=torch.float64)
    reference = gt.function(symbolic_steps, outputs=["S"], symbols={"T": 20})
    x = x0.clone().requires_grad_()
    reference(x).sum().backward()
    f = gt.function(symbolic_steps, outputs=["S"], symbols={"T": 20}, forwarding=Forwarding.budget(600))
    y = x0.clone().requires_grad_()
    f(y).sum().backward()
    ((key, plan),) = f.plans.items()
    assert dict(key) == {"N": 12, "T": 20} and plan.total_bytes(dict(key)) <= 600
    assert torch.allclose(y.grad, x.grad, rtol=1e-12, atol=0)


def test_torch_compile_takes_a_budget():
    import torch

    import gradflow.torch as gt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()
    x = torch.rand(8, 16, dtype=torch.float64)

    def gradients(module):
        for p in model.parameters():
            p.grad = None
        module(x).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = gradients(model)
    compiled = gt.compile(model, (x,), forwarding=Forwarding.budget(1000))
    got = gradients(compiled)
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(got, expected))
    (program,) = compiled._gf_programs.values()  # the example's shapes: their own program, planned once
    plan = program.functions[None].vjp.forwarding_plan
    assert plan.policy == "budget(1000)" and plan.total_bytes({}) <= 1000
    with pytest.raises(InvalidArgumentError, match="forwarding"):
        gt.compile(model, (x,), forwarding="budget")


@pytest.mark.parametrize("route", ["grad", "vjp"])
def test_a_step_that_exports_a_symbol_keeps_within_the_budget(route):
    """(fuzz seed 6354, program 66) The checkpointed step's inner loop variable leaves it as `__sym_out_i3`;
    the backward copied the forward's value into its working copy, which made it kept and unpriced: 56
    bytes for a budget of 48 (`OverBudgetError`). A step overwrites it whole before reading it: no copy."""
    from gradflow.verify.routes import gradient

    rng = np.random.default_rng(2)
    data = dict(x0=rng.random(6), w0=rng.random(6), S=np.array([0.3]))
    _, expected = gradient(inner_loop_in_step, ("x0",), "S", data, {"M": 6}, route=route, optimize=False)
    policy = Forwarding.budget(48, sizes={"M": 6})
    graph = grad_graph(inner_loop_in_step, ["x0"], "S", forwarding=policy, optimize=False)
    plan = graph.meta["ad"].forwarding_plan
    assert "checkpoint" in plan.policy and plan.total_bytes({"M": 6}) <= 48, plan.describe({"M": 6})
    _, got = gradient(inner_loop_in_step, ("x0",), "S", data, {"M": 6}, route=route, forwarding=policy,
                      optimize=False)
    assert _close(got["x0"], expected["x0"])


@dace.program
def strided_by_argument(A: dace.float64[N], K: dace.int64, S: dace.float64[1]):
    for i in range(0, N - 1, K):
        A[i + 1] += A[i] * A[i]
    S[0] = np.sum(A)


@dace.program
def strided_by_count(A: dace.float64[N], K: dace.int64, S: dace.float64[1]):
    for j in range((N - 1 + K - 1) // K):
        A[j * K + 1] += A[j * K] * A[j * K]
    S[0] = np.sum(A)


def test_a_loop_stepping_by_an_argument_is_refused_under_a_budget_with_the_rewrite_that_works():
    """`range(0, N - 1, K)`: no constant step, so no trip count to price. The budget's checkpointing
    fallback took the loop for one to checkpoint online, which restores no loop variable, and refused it
    naming gradflow's internal step (`gradflow_step_for_5`); now the refusal names the loop and its step,
    and the counted form the hint gives plans under the same budget with STORE_ALL's gradient."""
    A = np.random.default_rng(0).normal(size=8) * 0.5
    plain = gradflow.value_and_grad(strided_by_argument, wrt="A", of="S")(A=A.copy(), K=3, S=np.zeros(1))
    f = gradflow.value_and_grad(strided_by_argument, wrt="A", of="S", forwarding=Forwarding.budget(512))
    with pytest.raises(gradflow.NotDifferentiableError, match=r"loop over i \(line \d+.*advances by 'K'") as refused:
        f(A=A.copy(), K=3, S=np.zeros(1))
    assert "gradflow_" not in str(refused.value) and "range((stop - start + K - 1) // K)" in str(refused.value)
    counted = gradflow.value_and_grad(strided_by_count, wrt="A", of="S", forwarding=Forwarding.budget(512))
    value, grad = counted(A=A.copy(), K=3, S=np.zeros(1))
    assert value == pytest.approx(plain[0], rel=1e-14)
    np.testing.assert_allclose(grad, plain[1], rtol=1e-13)
    label = next(r.label for r in strided_by_argument.to_sdfg().all_control_flow_regions()
                 if getattr(r, "loop_variable", None) == "i")
    with pytest.raises(gradflow.NotDifferentiableError, match="reads its variable 'i', which does not advance by a co"):
        gradflow.value_and_grad(strided_by_argument, wrt="A", of="S",
                                forwarding=Forwarding.checkpoint(2, loops=[label]))(A=A.copy(), K=3, S=np.zeros(1))


@dace.program
def strided_steps_not_reading_the_variable(A: dace.float64[N], K: dace.int64, S: dace.float64[1]):
    for t in range(0, 12, K):
        A[:] = np.sin(A) * 1.1 + A * A
    S[0] = np.sum(A)


def test_a_loop_stepping_by_an_argument_whose_body_ignores_its_variable_is_checkpointed_online():
    """The refusal above is for a body that reads the variable: a step rerun from a snapshot would read a
    stale one. A body that does not read it reruns right, so a budget checkpoints the loop online as before
    (the first form of the refusal, 2026-12-05, refused this too)."""
    A = np.random.default_rng(1).normal(size=200) * 0.3
    _, expected = gradflow.value_and_grad(strided_steps_not_reading_the_variable, wrt="A", of="S")(
        A=A.copy(), K=3, S=np.zeros(1))
    f = gradflow.value_and_grad(strided_steps_not_reading_the_variable, wrt="A", of="S",
                                forwarding=Forwarding.budget(3000))
    _, got = f(A=A.copy(), K=3, S=np.zeros(1))
    (plan,) = f.plans.values()
    assert "checkpoint" in plan.policy
    np.testing.assert_allclose(got, expected, rtol=1e-12)
