"""`overwrite_loop_sums`: in a reversed loop, a gradient buffer that the body adds into first and resets after
use is overwritten by its first sum; its resets and its zeroing before the loop go where nothing reads them.

The gradients must stay those of OPTIMIZE without the pass and of torch, at trip counts 0, 1 and more, on
loops where the pass applies (Runge-Kutta stages, as GradBench's ode) and on loops written so that it must
not (a stage read after the loop, a reset under a condition, a reset of part of the buffer)."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.api import grad_graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.loop_sums import _cover, _plans, _zero_region

N, T = dace.symbol("N"), dace.symbol("T")
WITHOUT = OPTIMIZE.without("overwrite_loop_sums")


@dace.program
def rate(x: dace.float64[N], y: dace.float64[N], dy: dace.float64[N]):
    dy[0] = x[0]
    dy[1:] = x[1:] * y[:-1]


@dace.program
def runge_kutta(x: dace.float64[N], S: dace.float64[1]):
    y = np.zeros_like(x)
    k1 = np.ndarray([N], dtype=np.float64)
    k2 = np.ndarray([N], dtype=np.float64)
    for _ in range(T):
        rate(x, y, k1)
        rate(x, y + 0.25 * k1, k2)
        y[:] = y + 0.5 * (k1 + k2)
    S[0] = np.sum(y * y)


def _rate_torch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:1], x[1:] * y[:-1]])


def runge_kutta_torch(x: torch.Tensor, t: int) -> torch.Tensor:
    y = torch.zeros_like(x)
    for _ in range(t):
        k1 = _rate_torch(x, y)
        k2 = _rate_torch(x, y + 0.25 * k1)
        y = y + 0.5 * (k1 + k2)
    return torch.sum(y * y)


@dace.program
def stage_read_after(x: dace.float64[N], S: dace.float64[1]):
    # k's gradient gets the sum's contribution before the loop's reverse: no zeroing right before it
    y = np.ones_like(x)
    k = np.zeros_like(x)
    for _ in range(T):
        rate(x, y, k)
        y[:] = y + 0.5 * k
    S[0] = np.sum(y * k)


def stage_read_after_torch(x: torch.Tensor, t: int) -> torch.Tensor:
    y, k = torch.ones_like(x), torch.zeros_like(x)
    for _ in range(t):
        k = _rate_torch(x, y)
        y = y + 0.5 * k
    return torch.sum(y * k)


@dace.program
def branch_in_body(x: dace.float64[N], S: dace.float64[1]):
    # the branch reads the k of the iteration before: in the reverse, k's gradient is reset, then the
    # branch (taken or not, by the data) may add into it again
    y = np.ones_like(x)
    k = np.ndarray([N], dtype=np.float64)
    rate(x, y, k)
    for _ in range(T):
        if y[0] > 1.2:
            y[:] = y - 0.25 * k
        rate(x, y, k)
        y[:] = y + 0.5 * k
    S[0] = np.sum(y * y)


def branch_in_body_torch(x: torch.Tensor, t: int) -> torch.Tensor:
    y = torch.ones_like(x)
    k = _rate_torch(x, y)
    for _ in range(t):
        if y[0] > 1.2:
            y = y - 0.25 * k
        k = _rate_torch(x, y)
        y = y + 0.5 * k
    return torch.sum(y * y)


@dace.program
def stage_buffer_reused(x: dace.float64[N], S: dace.float64[1]):
    # one buffer for both stages: in the reverse, the second stage's reset is added into again by the
    # first stage's adjoint, so that reset stays
    y = np.ones_like(x)
    k = np.ndarray([N], dtype=np.float64)
    z = np.ndarray([N], dtype=np.float64)
    for _ in range(T):
        rate(x, y, k)
        z[:] = y + 0.5 * k
        rate(x, z, k)
        y[:] = y + 0.25 * (k + z)
    S[0] = np.sum(y * y)


def stage_buffer_reused_torch(x: torch.Tensor, t: int) -> torch.Tensor:
    y = torch.ones_like(x)
    for _ in range(t):
        k = _rate_torch(x, y)
        z = y + 0.5 * k
        k = _rate_torch(x, z)
        y = y + 0.25 * (k + z)
    return torch.sum(y * y)


@dace.program
def stage_before_loop(x: dace.float64[N], S: dace.float64[1]):
    # the same step once before the loop: its adjoint, after the loop's reverse, adds into k's gradient
    # the loop left zero, so the loop's resets stay
    y = np.ones_like(x)
    k = np.ndarray([N], dtype=np.float64)
    rate(x, y, k)
    y[:] = y + 0.5 * k
    for _ in range(T):
        rate(x, y, k)
        y[:] = y + 0.5 * k
    S[0] = np.sum(y * y)


def stage_before_loop_torch(x: torch.Tensor, t: int) -> torch.Tensor:
    y = torch.ones_like(x)
    for _ in range(t + 1):
        y = y + 0.5 * _rate_torch(x, y)
    return torch.sum(y * y)


@dace.program
def partly_reset(x: dace.float64[N], S: dace.float64[1]):
    # the loop writes k[1:] only: the reverse resets k[1:]'s gradient, and k[0]'s sums over the iterations
    y = np.ones_like(x)
    k = np.zeros_like(x)
    k[0] = x[0]
    for _ in range(T):
        k[1:] = np.tanh(y[1:]) * x[1:]
        y[:] = y + 0.5 * k
    S[0] = np.sum(y * y)


def partly_reset_torch(x: torch.Tensor, t: int) -> torch.Tensor:
    y = torch.ones_like(x)
    k = torch.cat([x[:1], torch.zeros_like(x[1:])])
    for _ in range(t):
        k = torch.cat([k[:1], torch.tanh(y[1:]) * x[1:]])
        y = y + 0.5 * k
    return torch.sum(y * y)


CASES = {"runge_kutta": (runge_kutta, runge_kutta_torch), "stage_read_after": (stage_read_after, stage_read_after_torch),
         "branch_in_body": (branch_in_body, branch_in_body_torch),
         "stage_buffer_reused": (stage_buffer_reused, stage_buffer_reused_torch),
         "stage_before_loop": (stage_before_loop, stage_before_loop_torch), "partly_reset": (partly_reset, partly_reset_torch)}


def _torch_gradient(f, x: np.ndarray, t: int) -> tuple[float, np.ndarray]:
    xt = torch.tensor(x, requires_grad=True)
    value = f(xt, t)
    if not value.requires_grad:  # no iteration ran: the value does not depend on x
        return value.item(), np.zeros_like(x)
    value.backward()
    return value.item(), xt.grad.numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_equal_those_without_the_pass_and_torchs(name: str) -> None:
    program, twin = CASES[name]
    with_pass = gradflow.value_and_grad(program, wrt="x", of="S")
    without = gradflow.value_and_grad(program, wrt="x", of="S", optimize=WITHOUT)
    rng = np.random.default_rng(7)
    for n, t in ((9, 0), (9, 1), (9, 3), (1, 2), (40, 5)):
        x = rng.uniform(0.2, 1.0, n)
        value, grad = with_pass(x=x.copy(), T=t)
        value_without, grad_without = without(x=x.copy(), T=t)
        want_value, want = _torch_gradient(twin, x, t)
        np.testing.assert_allclose(value, want_value, rtol=1e-12)
        np.testing.assert_allclose(grad, grad_without, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-12)


def _plans_before_the_pass(program) -> list:
    """The pass's matches on `program`'s gradient optimized up to the pass."""
    steps = OPTIMIZE.steps[:[s.name for s in OPTIMIZE.steps].index("overwrite_loop_sums")]
    sdfg = grad_graph(program, "x", "S", None, optimize=Pipeline(steps)).sdfg
    return list(_plans(sdfg))


def test_runge_kutta_stages_are_overwritten_and_not_reset() -> None:
    plans = {p.name: p for p in _plans_before_the_pass(runge_kutta)}
    # the two stages' gradients, and that of the update's temporary (y + 0.5 (k1 + k2), copied into y)
    assert sorted(plans) == ["gradflow_g_k1", "gradflow_g_k2", "gradflow_g_y_slice"]
    # each stage's gradient is reset twice per iteration (element 0 and the rest); both resets go, and so
    # does its zeroing before the loop
    assert [len(plans[k].resets) for k in sorted(plans)] == [2, 2, 1]
    assert all(p.zeroing is not None for p in plans.values())


def test_a_stage_read_after_the_loop_keeps_its_sum() -> None:
    assert "gradflow_g_k" not in {p.name for p in _plans_before_the_pass(stage_read_after)}


def test_a_sum_after_the_reset_keeps_the_sum() -> None:
    assert "gradflow_g_k" not in {p.name for p in _plans_before_the_pass(branch_in_body)}


def test_a_reset_added_into_again_stays() -> None:
    plans = {p.name: p for p in _plans_before_the_pass(stage_buffer_reused)}
    # overwritten by its first sum, reset at the end of the iteration; of its four resets, the second
    # stage's two are added into again by the first stage's adjoint
    assert len(plans["gradflow_g_k"].resets) == 2


def test_a_buffer_read_after_the_loop_keeps_its_resets_and_zeros() -> None:
    plans = {p.name: p for p in _plans_before_the_pass(stage_before_loop)}
    assert plans["gradflow_g_k"].resets == () and plans["gradflow_g_k"].zeroing is None


def test_a_partial_reset_keeps_the_sum() -> None:
    assert "gradflow_g_k" not in {p.name for p in _plans_before_the_pass(partly_reset)}


def test_chained_regions_cover_an_array_whatever_their_order() -> None:
    n = dace.symbol("n")
    parts = [dace.subsets.Range([(1, n - 1, 1)]), dace.subsets.Range([(0, 0, 1)])]
    assert _cover(parts, (n,))
    assert not _cover(parts[:1], (n,))
    assert not _cover([dace.subsets.Range([(0, 0, 1)]), dace.subsets.Range([(2, n - 1, 1)])], (n,))
    rows = [dace.subsets.Range([(0, 1, 1), (0, n - 1, 1)]), dace.subsets.Range([(2, 4, 1), (0, n - 1, 1)])]
    assert _cover(rows, (5, n)) and not _cover(rows, (6, n))


def test_a_zero_region_is_exact_or_nothing() -> None:
    sdfg = dace.SDFG("zeros")
    sdfg.add_array("g", [N], dace.float64, transient=True)
    state = sdfg.add_state()
    shifted = state.add_mapped_tasklet("reset", {"i": "0:N - 1"}, {}, "o = 0", {"o": dace.Memlet("g[i + 1]")},
                                       external_edges=True)[2]
    stepped = state.add_mapped_tasklet("every_other", {"i": "0:N:2"}, {}, "o = 0", {"o": dace.Memlet("g[i]")},
                                       external_edges=True)[2]
    not_zero = state.add_mapped_tasklet("ones", {"i": "0:N"}, {}, "o = 1", {"o": dace.Memlet("g[i]")},
                                        external_edges=True)[2]
    unused = state.add_mapped_tasklet("first", {"i": "0:N", "j": "0:N"}, {}, "o = 0", {"o": dace.Memlet("g[i]")},
                                      external_edges=True)[2]
    region = _zero_region(state, state.out_edges(shifted)[0], set())
    assert region is not None and str(region) == "1:N"
    assert _zero_region(state, state.out_edges(shifted)[0], {"N"}) is None
    for exit_ in (stepped, not_zero, unused):
        assert _zero_region(state, state.out_edges(exit_)[0], set()) is None


def _hand_made_loop(condition: str) -> dace.SDFG:
    """g zeroed, then a loop whose body adds into all of g (`g[i] += x[i]`), then, on an edge with
    `condition`, resets it after reading it (`y[i] += g[i]; g[i] = 0`)."""
    from dace.sdfg.state import LoopRegion

    sdfg = dace.SDFG(f"hand_made_{'cond' if condition != '1' else 'plain'}")
    for name in ("x", "y"):
        sdfg.add_array(name, [N], dace.float64)
    sdfg.add_array("g", [N], dace.float64, transient=True)
    zero = sdfg.add_state("zero", is_start_block=True)
    zero.add_mapped_tasklet("fill", {"i": "0:N"}, {}, "o = 0", {"o": dace.Memlet("g[i]")}, external_edges=True)
    loop = LoopRegion("steps", "t < T", "t", "t = 0", "t = t + 1")
    sdfg.add_node(loop)
    sdfg.add_edge(zero, loop, dace.InterstateEdge())
    add = loop.add_state("add", is_start_block=True)
    add.add_mapped_tasklet("sum", {"i": "0:N"}, {"a": dace.Memlet("x[i]")}, "o = a",
                           {"o": dace.Memlet("g[i]", wcr="lambda p, q: p + q")}, external_edges=True)
    reset = loop.add_state("reset")
    reset.add_mapped_tasklet("use", {"i": "0:N"}, {"a": dace.Memlet("g[i]")}, "o = a\nz = 0",
                             {"o": dace.Memlet("y[i]", wcr="lambda p, q: p + q"), "z": dace.Memlet("g[i]")},
                             external_edges=True)
    loop.add_edge(add, reset, dace.InterstateEdge(condition=condition))
    return sdfg


def test_a_conditional_edge_in_the_body_keeps_the_sum() -> None:
    # where the condition is false the iteration ends before the reset: the next one adds into g as it is
    assert [p.name for p in _plans(_hand_made_loop("1"))] == ["g"]
    assert list(_plans(_hand_made_loop("t < 2"))) == []
