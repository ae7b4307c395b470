"""Checkpointed loops: the Revolve schedule, and gradients and memory of `Forwarding.checkpoint`.

The schedule is checked by simulating it (every step reversed once, last to first, from the state it
started from; never more than `s` snapshots) and by counting its advances against the closed form of the
binomial bound, computed here from Griewank & Walther's formula, and against a brute-force optimum on
small cases. The programs are differentiated once per snapshot count (the schedule is compiled in) and
checked against `STORE_ALL` on data hypothesis varies.
"""

from __future__ import annotations

import functools
from math import comb

import attrs
import dace
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.autodiff import revolve
from gradflow.autodiff.budget import BudgetError
from gradflow.autodiff.passes import Reverse, ad_pipeline, forwarded_bytes
from gradflow.core.graph import Graph
from gradflow.core.passes import unwrap_or_raise
from gradflow.verify.corpus import loops

# ---- the schedule ----------------------------------------------------------------------------------------


def binomial_bound(steps: int, snapshots: int) -> int:
    """t(l, s) = r*l - C(s + r, s + 1), r the least repetition number with C(s + r, s) >= l."""
    r = 0
    while comb(snapshots + r, snapshots) < steps:
        r += 1
    return r * steps - comb(snapshots + r, snapshots + 1)


@functools.cache
def brute_force(steps: int, snapshots: int) -> int:
    """The fewest advances over every split (the recursion Revolve's bound solves), by exhaustion."""
    if steps <= 1:
        return 0
    if snapshots == 1:
        return steps * (steps - 1) // 2
    return min(m + brute_force(steps - m, snapshots - 1) + brute_force(m, snapshots) for m in range(1, steps))


def simulate(actions, snapshots: int, slots: dict[int, int] | None = None,
             current: int | None = 0) -> tuple[list[int], int]:
    """Run a schedule on a model where the state is its step index, from `current` with `slots` filled
    (slot -> position; the offline schedule starts at step 0 with none, the online backward from what its
    forward stored): the steps reversed in order, and the advances. Fails on an action from the wrong
    state, a slot out of range or never filled."""
    slots = dict(slots or {})
    reversed_steps, advanced = [], 0
    for a in actions:
        if a.kind == revolve.RESTORE:
            assert slots.get(a.arg) == a.position, f"{a}: slot holds {slots.get(a.arg)}"
            current = slots[a.arg]
            continue
        assert current is not None and a.position == current, a
        if a.kind == revolve.ADVANCE:
            assert a.arg >= 1
            current += a.arg
            advanced += a.arg
        elif a.kind == revolve.TAKESHOT:
            assert 0 <= a.arg < snapshots, f"slot {a.arg} with {snapshots} snapshots"
            slots[a.arg] = current
        else:
            assert a.kind == revolve.REVERSE
            reversed_steps.append(current)
            current = None
    return reversed_steps, advanced


@pytest.mark.parametrize("snapshots", range(1, 9))
def test_schedule_reverses_every_step_once_with_the_binomial_number_of_advances(snapshots: int) -> None:
    for steps in range(0, 61):
        actions = revolve.schedule(steps, snapshots)
        order, advanced = simulate(actions, snapshots)
        assert order == list(reversed(range(steps)))
        assert advanced == binomial_bound(steps, snapshots) == revolve.advances(actions)
        if steps <= 24 and snapshots <= 4:
            assert advanced == brute_force(steps, snapshots)


def test_forward_phase_ends_at_the_last_step() -> None:
    ahead, rest = revolve.forward_phase(revolve.schedule(1000, 10))
    assert {a.kind for a in ahead} <= {revolve.ADVANCE, revolve.TAKESHOT}
    assert rest[0] == revolve.Action(revolve.REVERSE, 0, 999)
    assert revolve.advances(ahead) == 999
    assert revolve.advances(rest) == binomial_bound(1000, 10) - 999


@pytest.mark.parametrize("steps, snapshots", [(-1, 2), (3, 0), (2.5, 2), (4, True)])
def test_schedule_rejects_bad_arguments(steps, snapshots) -> None:
    with pytest.raises(gradflow.InvalidArgumentError):
        revolve.schedule(steps, snapshots)


# ---- gradients -------------------------------------------------------------------------------------------

#: (kernel, trip count symbol value): time loops of the loop corpus; seidel's loop runs T - 1 times.
KERNELS = {"lp_jacobi_1d": 4, "lp_whole_array_update": 5, "lp_seidel_2d": 4}


def _trips(name: str) -> int:
    return KERNELS[name] - (1 if name == "lp_seidel_2d" else 0)


def _sizes(name: str, t: int) -> dict[str, int]:
    return {**dict(loops.CASES_BY_NAME[name].symbols), "T": t}


@functools.cache
def _function(name: str, policy: gradflow.Forwarding):
    case = loops.CASES_BY_NAME[name]
    return gradflow.value_and_grad(case.program.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=policy)


def _run(name: str, policy: gradflow.Forwarding, seed: int):
    case = loops.CASES_BY_NAME[name]
    inputs = {k: np.copy(v) for k, v in case.inputs(seed).items()}
    value, grads = _function(name, policy)(**inputs, T=KERNELS[name])
    return value, grads


@pytest.mark.parametrize("name", list(KERNELS))
@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_gradients_equal_store_all_for_every_snapshot_count(name: str, seed: int) -> None:
    value, grads = _run(name, gradflow.STORE_ALL, seed)
    for s in range(1, _trips(name) + 1):
        policy = gradflow.Forwarding.checkpoint(snapshots=s, sizes=_sizes(name, KERNELS[name]))
        got_value, got = _run(name, policy, seed)
        np.testing.assert_allclose(got_value, value, rtol=1e-12, atol=0)
        assert set(got) == set(grads)
        for x in grads:
            np.testing.assert_allclose(got[x], grads[x], rtol=1e-12, atol=1e-15, err_msg=f"d/d{x}, s={s}")


def test_a_loop_that_does_not_run_records_and_reverses_nothing() -> None:
    case = loops.CASES_BY_NAME["lp_seidel_2d"]  # its time loop runs T - 1 times
    inputs = case.inputs(5)
    results = []
    for policy in (gradflow.STORE_ALL, gradflow.Forwarding.checkpoint(snapshots=2, sizes=_sizes(case.name, 1))):
        results.append(_function(case.name, policy)(**{k: np.copy(v) for k, v in inputs.items()}, T=1))
    (value, grads), (got_value, got) = results
    np.testing.assert_allclose(got_value, value, rtol=1e-12)
    for x in grads:
        np.testing.assert_allclose(got[x], grads[x], rtol=1e-12, atol=1e-15)


N, T = dace.symbol("N"), dace.symbol("T")


@dace.program
def read_then_smooth(A: dace.float64[N], S: dace.float64[1]):
    S[0] = np.sum(A * A * A)  # read before the loop: its reverse needs A's initial value
    for t in range(T):
        A[1:N - 1] = 0.5 * A[1:N - 1] + 0.25 * A[2:N]  # linear: the step's own vjp reads no value
    for i in range(N):
        S[0] += A[i] * (i + 1.0)


@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 2**31 - 1))
def test_a_linear_loop_still_restores_what_an_earlier_operation_reads(seed: int) -> None:
    a = np.random.default_rng(seed).uniform(-1, 1, 6)
    results = []
    for policy in (gradflow.STORE_ALL, gradflow.Forwarding.checkpoint(snapshots=1, sizes={"T": 3, "N": 6})):
        f = _program_function(policy)
        results.append(f(A=a.copy(), S=np.zeros(1), T=3))
    (value, grad), (got_value, got) = results
    np.testing.assert_allclose(got_value, value, rtol=1e-12)
    np.testing.assert_allclose(got, grad, rtol=1e-12, atol=1e-15)


@functools.cache
def _program_function(policy: gradflow.Forwarding):
    return gradflow.value_and_grad(read_then_smooth.to_sdfg(), wrt="A", of="S", forwarding=policy)


def test_split_forward_and_backward_carry_only_the_snapshots() -> None:
    """`vjp`: the forward SDFG hands the snapshots to the backward SDFG, which reads its schedule from
    constants (not forwarded); the gradients are those of the combined program under STORE_ALL."""
    from gradflow.runtime.compile import compile_sdfg

    case = loops.CASES_BY_NAME["lp_whole_array_update"]
    t = KERNELS["lp_whole_array_update"]
    result = gradflow.vjp(case.to_sdfg(), wrt=list(case.wrt), of=case.of,
                          forwarding=gradflow.Forwarding.checkpoint(snapshots=2, sizes=_sizes(case.name, t)))
    assert [a for a in result.saved if not a.startswith("gradflow_tape_top")] == ["gradflow_snap_A"]
    inputs = case.inputs(3)
    n = inputs["A"].shape[0]
    values = {N: n, T: t}
    fwd_args = {k: np.zeros(tuple(int(dace.symbolic.evaluate(x, values)) for x in d.shape))
                for k, d in result.forward.arrays.items() if not d.transient and k not in inputs}
    fwd_args.update({k: np.copy(v) for k, v in inputs.items()})
    compile_sdfg(Graph.adopt(result.forward))(**fwd_args, N=n, T=t)
    bwd_args = {k: fwd_args[k] for k in result.forwarded}
    bwd_args.update(grad_S=np.ones(1), grad_A=np.full(n, np.nan), grad_W=np.full(n, np.nan))
    compile_sdfg(Graph.adopt(result.backward))(**bwd_args, N=n, T=t)
    _, expected = _run(case.name, gradflow.STORE_ALL, 3)
    for x in case.wrt:
        np.testing.assert_allclose(bwd_args[f"grad_{x}"], expected[x], rtol=1e-12, atol=1e-15)


# ---- memory and re-executions ----------------------------------------------------------------------------


@functools.cache
def _graph(name: str, policy: gradflow.Forwarding) -> Graph:
    case = loops.CASES_BY_NAME[name]
    return unwrap_or_raise(ad_pipeline(Reverse(case.wrt, (case.of,), forwarding=policy))(Graph.of(case.to_sdfg())))


def _reexecutions(graph: Graph) -> int:
    """Advances the backward's action tables hold (each advance reruns one step)."""
    constants = graph.sdfg.constants_prop
    total = 0
    for name in [n for n in constants if n.startswith("gradflow_actions_")]:
        kinds = np.asarray(constants[name][1])
        args = np.asarray(constants[name.replace("gradflow_actions_", "gradflow_args_")][1])
        total += int(args[kinds == revolve.ADVANCE].sum())
    return total


@pytest.mark.parametrize("name", ["lp_jacobi_1d", "lp_whole_array_update"])
def test_thousand_steps_with_ten_snapshots_forward_at_most_eleven_arrays(name: str) -> None:
    sizes = _sizes(name, 1000)
    array_bytes = 8 * sizes["N"]
    checkpointed = _graph(name, gradflow.Forwarding.checkpoint(snapshots=10, sizes=sizes))
    stored = forwarded_bytes(_graph(name, gradflow.STORE_ALL), sizes)
    kept = forwarded_bytes(checkpointed, sizes)
    assert kept <= 11 * array_bytes, f"{kept} bytes forwarded, {array_bytes} per array"
    # jacobi_1d's step is linear, and its closing sum is a map (`loops_to_maps`): storing forwards nothing
    # either, and checkpointing must not forward more; where storing forwards something, it forwards less.
    assert kept < stored if stored else kept == 0
    assert "CheckpointedLoop" in checkpointed.meta["ad"].rules_used


def test_reexecutions_are_the_binomial_bound_when_the_step_needs_its_state() -> None:
    sizes = _sizes("lp_whole_array_update", 1000)
    graph = _graph("lp_whole_array_update", gradflow.Forwarding.checkpoint(snapshots=10, sizes=sizes))
    # The forward sweep runs the first 999 advances of the schedule; the backward reruns the rest.
    assert _reexecutions(graph) == binomial_bound(1000, 10) - 999
    assert forwarded_bytes(graph, sizes) == 11 * 8 * sizes["N"]


def test_a_linear_step_is_reversed_without_snapshots_or_reruns() -> None:
    """jacobi_1d's step is linear: its vjp reads no forward value, so nothing is stored or rerun."""
    sizes = _sizes("lp_jacobi_1d", 1000)
    graph = _graph("lp_jacobi_1d", gradflow.Forwarding.checkpoint(snapshots=10, sizes=sizes))
    assert "CheckpointedLoop" in graph.meta["ad"].rules_used
    assert _reexecutions(graph) == 0
    assert not {"<snapshots of A>", "<snapshots of B>"} & set(graph.meta["ad"].stores.values())


# ---- errors ----------------------------------------------------------------------------------------------


def test_symbolic_trip_count_without_sizes_is_an_error_naming_the_symbol() -> None:
    case = loops.CASES_BY_NAME["lp_whole_array_update"]
    with pytest.raises(gradflow.InvalidArgumentError, match=r"loop 'for_\d+'.*depends on T") as info:
        gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of,
                      forwarding=gradflow.Forwarding.checkpoint(snapshots=3))
    assert "sizes=" in info.value.hint


def test_unknown_loop_label_is_an_error_listing_the_loops() -> None:
    case = loops.CASES_BY_NAME["lp_whole_array_update"]
    with pytest.raises(gradflow.InvalidArgumentError, match=r"'nope', which is not a loop.*for_\d+"):
        gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of,
                      forwarding=gradflow.Forwarding.checkpoint(snapshots=3, loops=["nope"], sizes={"T": 4}))


def test_a_while_loop_inside_another_loop_cannot_be_checkpointed() -> None:
    case = loops.CASES_BY_NAME["lp_newton_sqrt"]
    sdfg = case.to_sdfg()
    label = next(r.label for r in sdfg.all_control_flow_regions() if r.label.startswith("while"))
    with pytest.raises(gradflow.NotDifferentiableError, match=rf"loop '{label}' is inside loop"):
        gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of,
                      forwarding=gradflow.Forwarding.checkpoint(snapshots=3, loops=[label]))


def _loop_label(sdfg, predicate) -> str:
    from dace.sdfg.state import LoopRegion

    return next(r.label for r in sdfg.all_control_flow_regions() if isinstance(r, LoopRegion) and predicate(r))


def test_a_loop_inside_another_cannot_be_checkpointed() -> None:
    from dace.sdfg.state import LoopRegion

    case = loops.CASES_BY_NAME["lp_seidel_2d"]
    sdfg = case.to_sdfg()
    label = _loop_label(sdfg, lambda r: isinstance(r.parent_graph, LoopRegion))
    with pytest.raises(gradflow.NotDifferentiableError, match=rf"loop '{label}' is inside loop 'for_\d+'"):
        gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of,
                      forwarding=gradflow.Forwarding.checkpoint(snapshots=2, loops=[label], sizes={"T": 4}))


def test_a_step_reading_an_index_array_is_refused_when_named_and_skipped_by_default() -> None:
    case = loops.CASES_BY_NAME["lp_masked_normalise"]
    sdfg = case.to_sdfg()
    label = _loop_label(sdfg, lambda r: any(n.data == "idx" for st in r.all_control_flow_blocks(recursive=True)
                                            if hasattr(st, "data_nodes") for n in st.data_nodes()))
    with pytest.raises(gradflow.NotDifferentiableError, match=rf"loop '{label}' cannot be checkpointed.*idx"):
        gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of,
                      forwarding=gradflow.Forwarding.checkpoint(snapshots=2, loops=[label], sizes=dict(case.symbols)))
    graph = gradflow.api.grad_graph(case.to_sdfg(), list(case.wrt), case.of, "grad_", None,
                                    gradflow.Forwarding.checkpoint(snapshots=2, sizes=dict(case.symbols)))
    assert "CheckpointedLoop" in graph.meta["ad"].rules_used  # the other loop is checkpointed


@pytest.mark.parametrize("snapshots", [0, -2, 1.5, True, None])
def test_snapshot_count_must_be_a_positive_int(snapshots) -> None:
    with pytest.raises(gradflow.InvalidArgumentError, match="snapshots"):
        gradflow.Forwarding.checkpoint(snapshots=snapshots)


def test_checkpointing_does_not_combine_with_a_recompute_set() -> None:
    with pytest.raises(gradflow.InvalidArgumentError, match="checkpoint policy cannot also"):
        gradflow.Forwarding(snapshots=3, recompute="all")
    assert gradflow.Forwarding(snapshots=3, max_bytes=100).name == "budget(100) with checkpoint(3)"


def test_policy_is_a_frozen_value_with_a_name() -> None:
    a = gradflow.Forwarding.checkpoint(snapshots=4, loops=["b", "a"], sizes={"T": 9})
    assert a == gradflow.Forwarding.checkpoint(snapshots=4, loops=("a", "b"), sizes={"T": 9})
    assert a.name == "checkpoint(4, a, b)" and gradflow.Forwarding.checkpoint(snapshots=2).name == "checkpoint(2)"


# ---- a byte budget that checkpoints ----------------------------------------------------------------------


def _budgeted(name: str, fraction: float, t: int) -> tuple[gradflow.Forwarding, int]:
    sizes = _sizes(name, t)
    stored = forwarded_bytes(_graph(name, gradflow.STORE_ALL), sizes)
    return gradflow.Forwarding.budget(int(fraction * stored), sizes=sizes), stored


@pytest.mark.parametrize("fraction", [0.1, 0.01])
def test_a_budget_below_what_storing_needs_checkpoints_the_time_loop(fraction: float) -> None:
    """lp_whole_array_update with 1000 steps: no store/recompute plan keeps less than every step's
    overwritten array; the budget checkpoints the loop with as many snapshots as fit."""
    name = "lp_whole_array_update"
    sizes = _sizes(name, 1000)
    policy, stored = _budgeted(name, fraction, 1000)
    with pytest.raises(BudgetError):
        _graph(name, attrs.evolve(policy, budget_checkpoints=False))
    graph = _graph(name, policy)
    plan = graph.meta["ad"].forwarding_plan
    assert "CheckpointedLoop" in graph.meta["ad"].rules_used
    assert plan.policy.startswith(f"budget({policy.max_bytes}) with checkpoint(")
    kept = forwarded_bytes(graph, sizes)
    assert kept <= policy.max_bytes
    assert plan.predicted.predicted_bytes >= kept  # the snapshots are priced at most one slot over


def test_a_budget_below_one_snapshot_states_the_least_any_plan_needs() -> None:
    name = "lp_whole_array_update"
    sizes = _sizes(name, 1000)
    one = forwarded_bytes(_graph(name, gradflow.Forwarding.checkpoint(snapshots=1, sizes=sizes)), sizes)
    with pytest.raises(BudgetError, match=f"checkpointed or not; the least any plan needs is {one} bytes") as info:
        _graph(name, gradflow.Forwarding.budget(one - 1, sizes=sizes))
    assert info.value.minimum == one
    assert forwarded_bytes(_graph(name, gradflow.Forwarding.budget(one, sizes=sizes)), sizes) == one


@pytest.mark.parametrize("fraction", [0.9, 0.6, 0.4])
@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_gradients_under_a_checkpointing_budget_equal_store_all(fraction: float, seed: int) -> None:
    name = "lp_whole_array_update"
    policy, _ = _budgeted(name, fraction, KERNELS[name])
    value, grads = _run(name, gradflow.STORE_ALL, seed)
    got_value, got = _run(name, policy, seed)
    np.testing.assert_allclose(got_value, value, rtol=1e-12, atol=0)
    for x in grads:
        np.testing.assert_allclose(got[x], grads[x], rtol=1e-12, atol=1e-15, err_msg=f"d/d{x}, {policy.name}")


def test_snapshots_within_a_budget_leave_the_rest_of_the_budget_to_the_plan() -> None:
    name = "lp_whole_array_update"
    sizes = _sizes(name, 1000)
    policy = attrs.evolve(gradflow.Forwarding.budget(10 * 8 * sizes["N"], sizes=sizes), snapshots=4)
    graph = _graph(name, policy)
    assert graph.meta["ad"].forwarding_plan.policy == f"budget({policy.max_bytes}) with checkpoint(4)"
    assert forwarded_bytes(graph, sizes) <= policy.max_bytes
    with pytest.raises(BudgetError, match="with 4 snapshot"):
        _graph(name, attrs.evolve(policy, max_bytes=3 * 8 * sizes["N"]))


# ---- while loops: online checkpointing -------------------------------------------------------------------


def _simulate_online(steps: int, snapshots: int) -> tuple[list[int], int]:
    """Run the online forward (Python model) and the backward's schedule on the step-index model."""
    stride, stored = revolve.thinned(steps, snapshots)
    assert stored == tuple(j * stride for j in range(len(stored))) and len(stored) <= snapshots
    return simulate(revolve.online_schedule(steps, snapshots), snapshots, dict(enumerate(stored)), current=None)


@pytest.mark.parametrize("snapshots", range(1, 9))
def test_online_schedule_reverses_every_step_within_the_slots(snapshots: int) -> None:
    for steps in range(0, 80):
        order, advanced = _simulate_online(steps, snapshots)
        assert order == list(reversed(range(steps)))
        stride, stored = revolve.thinned(steps, snapshots)
        # each segment is reversed by Revolve with the slots the earlier segments leave free
        assert advanced == sum(binomial_bound(min(stride, steps - j * stride), snapshots - j)
                               for j in range(len(stored)))


def test_online_checkpointing_of_a_thousand_steps_costs_a_fifth_more_reruns_than_knowing_the_count() -> None:
    _, advanced = _simulate_online(1000, 10)
    offline = binomial_bound(1000, 10) - 999  # the forward of the offline schedule does 999 of its advances
    assert revolve.thinned(1000, 10) == (128, tuple(range(0, 1000, 128)))
    assert advanced == 3156 and advanced <= 1.2 * offline


@pytest.mark.parametrize("snapshots", [1, 2, 5])
def test_the_run_time_generator_emits_the_python_schedule(snapshots: int) -> None:
    """The C++ code the backward runs (`revolve.NEXT_ACTION_CPP`) against `revolve.online_schedule`, in one
    small compiled program per snapshot count that drains the generator into an array."""
    from dace.sdfg.state import LoopRegion

    from gradflow.runtime.compile import compile_sdfg

    words = revolve.generator_words(snapshots)
    sdfg = dace.SDFG(f"revolve_generator_{snapshots}")
    sdfg.add_array("trips", (3,), dace.int64)
    sdfg.add_array("out", (4096, 3), dace.int64)
    sdfg.add_array("count", (1,), dace.int64)
    sdfg.add_array("gen", (words,), dace.int64, transient=True)
    sdfg.add_array("action", (3,), dace.int64, transient=True)
    init = sdfg.add_state("init", is_start_block=True)
    t = init.add_tasklet("init", {revolve.INFO}, {revolve.STATE}, revolve.init_code(snapshots, linear=False), language=dace.Language.CPP)
    init.add_edge(init.add_read("trips"), None, t, revolve.INFO, dace.Memlet("trips[0:3]"))
    init.add_edge(t, revolve.STATE, init.add_write("gen"), None, dace.Memlet(f"gen[0:{words}]"))
    drain = LoopRegion("drain", "kind != 4", sdfg=sdfg)
    sdfg.add_node(drain)
    sdfg.add_edge(init, drain, dace.InterstateEdge(assignments={"kind": "0", "c": "0"}))
    ask = drain.add_state("ask", is_start_block=True)
    nxt = ask.add_tasklet("next", {revolve.STATE_IN}, {revolve.STATE, revolve.ACTION}, revolve.next_action_code(), language=dace.Language.CPP)
    ask.add_edge(ask.add_read("gen"), None, nxt, revolve.STATE_IN, dace.Memlet(f"gen[0:{words}]"))
    ask.add_edge(nxt, revolve.STATE, ask.add_write("gen"), None, dace.Memlet(f"gen[0:{words}]"))
    ask.add_edge(nxt, revolve.ACTION, ask.add_write("action"), None, dace.Memlet("action[0:3]"))
    keep = drain.add_state_after(ask, "keep")
    keep.add_nedge(keep.add_read("action"), keep.add_write("out"), dace.Memlet("action[0:3]", other_subset="c, 0:3"))
    drain.add_state_after(keep, "counted", assignments={"kind": "action[0]", "c": "c + 1"})
    done = sdfg.add_state_after(drain, "done")
    w = done.add_tasklet("count", set(), {"o"}, "o = c")
    done.add_edge(w, "o", done.add_write("count"), None, dace.Memlet("count[0]"))
    program = compile_sdfg(Graph.adopt(sdfg))
    for steps in [0, 1, 2, 7, 33, 100]:
        stride, stored = revolve.thinned(steps, snapshots)
        out, count = np.full((4096, 3), -1, dtype=np.int64), np.zeros(1, dtype=np.int64)
        program(trips=np.array([steps, stride, len(stored)], dtype=np.int64), out=out, count=count)
        got = [tuple(row) for row in out[: int(count[0]) - 1]]  # the last row is DONE
        assert out[int(count[0]) - 1, 0] == revolve.DONE
        assert got == [(a.kind, a.arg, a.position) for a in revolve.online_schedule(steps, snapshots)]


M = dace.symbol("M")


@dace.program
def relax_until(A: dace.float64[M], W: dace.float64[M], L: dace.float64[1], S: dace.float64[1]):
    while A[0] < L[0]:  # a trip count known only when the loop has run
        A[1:M] = np.sin(A[1:M] * W[1:M]) + 0.5 * A[0:M - 1]  # nonlinear: reversing a step needs its state
        A[0] = A[0] + 1.0
    for i in range(M):
        S[0] += A[i] * A[i] * (i + 1.0)


def _while_label(sdfg) -> str:
    return _loop_label(sdfg, lambda r: r.label.startswith("while"))


@functools.cache
def _relax_function(policy: gradflow.Forwarding):
    return gradflow.value_and_grad(relax_until.to_sdfg(), wrt=["A", "W"], of="S", forwarding=policy)


@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 2**31 - 1), start=st.floats(0.0, 0.9))
def test_a_while_loop_checkpointed_online_gives_store_all_gradients_for_every_snapshot_count(seed, start) -> None:
    rng = np.random.default_rng(seed)
    a, w = rng.uniform(-1, 1, 7), rng.uniform(-1, 1, 7)
    a[0] = start
    limit = np.array([6.0])  # ceil(6 - start) steps: 6 here
    label = _while_label(relax_until.to_sdfg())
    value, grads = _relax_function(gradflow.STORE_ALL)(A=a.copy(), W=w.copy(), L=limit.copy(), S=np.zeros(1))
    for s in range(1, 7):
        got_value, got = _relax_function(gradflow.Forwarding.checkpoint(snapshots=s, loops=[label]))(
            A=a.copy(), W=w.copy(), L=limit.copy(), S=np.zeros(1))
        np.testing.assert_allclose(got_value, value, rtol=1e-12, atol=0)
        for x in grads:
            np.testing.assert_allclose(got[x], grads[x], rtol=1e-12, atol=1e-15, err_msg=f"d/d{x}, s={s}")


def test_a_checkpointed_while_loop_forwards_its_snapshots_and_trip_count_only() -> None:
    label = _while_label(relax_until.to_sdfg())
    graph = unwrap_or_raise(ad_pipeline(Reverse(("A", "W"), ("S",), forwarding=gradflow.Forwarding.checkpoint(
        snapshots=3, loops=[label])))(Graph.of(relax_until.to_sdfg())))
    stores = graph.meta["ad"].stores
    assert "CheckpointedLoop" in graph.meta["ad"].rules_used
    assert stores[f"gradflow_online_{label}"] == f"<trip count of {label}>"
    assert graph.sdfg.arrays["gradflow_snap_A"].shape[0] == 3  # three slots, whatever the trip count
    assert not [s for s, a in stores.items() if a == "A"]  # no per-iteration stack of A


def test_split_backward_of_a_checkpointed_while_loop_equals_store_all() -> None:
    from gradflow.runtime.compile import compile_sdfg

    label = _while_label(relax_until.to_sdfg())
    result = gradflow.vjp(relax_until.to_sdfg(), wrt=["A", "W"], of="S",
                          forwarding=gradflow.Forwarding.checkpoint(snapshots=2, loops=[label]))
    rng = np.random.default_rng(4)
    a, w, limit = rng.uniform(-1, 1, 7), rng.uniform(-1, 1, 7), np.array([4.5])
    a[0] = 0.2
    fwd_args = {"A": a.copy(), "W": w.copy(), "L": limit.copy(), "S": np.zeros(1)}
    for k, d in result.forward.arrays.items():
        if not d.transient and k not in fwd_args:
            fwd_args[k] = np.zeros(tuple(int(dace.symbolic.evaluate(x, {M: 7})) for x in d.shape),
                                   dtype=d.dtype.as_numpy_dtype())
    compile_sdfg(Graph.adopt(result.forward))(**fwd_args, M=7)
    bwd_args = {k: fwd_args[k] for k in result.forwarded}
    bwd_args.update(grad_S=np.ones(1), grad_A=np.full(7, np.nan), grad_W=np.full(7, np.nan))
    compile_sdfg(Graph.adopt(result.backward))(**bwd_args, M=7)
    _, expected = _relax_function(gradflow.STORE_ALL)(A=a.copy(), W=w.copy(), L=limit.copy(), S=np.zeros(1))
    for x in ("A", "W"):
        np.testing.assert_allclose(bwd_args[f"grad_{x}"], expected[x], rtol=1e-12, atol=1e-15)
