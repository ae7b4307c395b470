"""`analysis.loops.counter_bound`: a `while` loop capped by a counter gets a trip-count bound, and only when
that bound holds (the counter assigned once per iteration, the stop fixed in the body, the start known
before the loop). A bound lets a byte budget price the loop without `loop_bounds` and gives it fixed-size
stacks (and `hvp` equals torch's through it)."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.analysis.loops import counter_bound
from gradflow.autodiff.budget import BudgetError
from gradflow.autodiff.normalize import NORMALIZE

n = dace.symbol("n")


@dace.program
def capped(x: dace.float64[2], S: dace.float64[1]):
    v = x[0]
    i = 0
    while i < 6 and v < 5.0:
        v = v * np.sin(v) + x[1] * x[1] + 1.0
        i += 1
    S[0] = v


def t_capped(x):
    v, i = x[0], 0
    while i < 6 and v < 5.0:
        v = v * torch.sin(v) + x[1] * x[1] + 1.0
        i += 1
    return v


@dace.program
def capped_by_argument(x: dace.float64[n], S: dace.float64[1]):
    v = x[0]
    i = 1
    while i < n and v < 5.0:
        v = v * 1.5 + x[i]
        i += 1
    S[0] = v


@dace.program
def counter_moved_twice(x: dace.float64[2], S: dace.float64[1]):
    v = x[0]
    i = 0
    while i < 6 and v < 5.0:
        v = v * 1.5 + x[1]
        i += 1
        if v > 2.0:
            i -= 1
    S[0] = v


@dace.program
def stop_moved_in_the_body(x: dace.float64[2], S: dace.float64[1]):
    v = x[0]
    i = 0
    k = 6
    while i < k and v < 5.0:
        v = v * 1.5 + x[1]
        k += 1
        i += 1
    S[0] = v


@dace.program
def counter_read_after_its_update(x: dace.float64[2], S: dace.float64[1]):
    v = x[0]
    i = 0
    while i < 6 and v < 5.0:
        i += 1
        v = v * 1.5 + x[1] * i
    S[0] = v


def _while_loop(program) -> dace.sdfg.state.LoopRegion:
    sdfg = NORMALIZE(gradflow.Graph.of(program)).unwrap().sdfg
    loops = [r for r in sdfg.all_control_flow_regions() if isinstance(r, dace.sdfg.state.LoopRegion)]
    assert len(loops) == 1 and not loops[0].loop_variable
    return loops[0]


def test_a_while_loop_capped_by_a_counter_is_bounded_by_it() -> None:
    bound = counter_bound(_while_loop(capped))
    assert bound is not None and bound.trip_count() == (6, 1)
    bound = counter_bound(_while_loop(capped_by_argument))
    assert bound is not None and bound.trip_count() == (dace.symbol("n") - 1, 1)


@pytest.mark.parametrize("program", [counter_moved_twice, stop_moved_in_the_body, counter_read_after_its_update],
                         ids=lambda p: p.name)
def test_no_bound_where_the_counter_does_not_bound_the_trips(program) -> None:
    assert counter_bound(_while_loop(program)) is None


def test_a_capped_while_loop_fits_a_budget_without_loop_bounds_and_has_torchs_hvp() -> None:
    x, direction = np.array([0.3, 0.5]), np.array([0.7, -0.2])
    tensor = torch.tensor(x, requires_grad=True)
    expected = torch.autograd.grad(t_capped(tensor), tensor)[0].numpy()
    with pytest.raises(BudgetError) as too_small:  # the least working budget, named by the error, fits
        gradflow.value_and_grad(capped, wrt="x", of="S", forwarding=gradflow.Forwarding.budget(8))(
            x=x, S=np.zeros(1))
    for budget in (4096, too_small.value.minimum):
        f = gradflow.value_and_grad(capped, wrt="x", of="S", forwarding=gradflow.Forwarding.budget(budget))
        _, grad = f(x=x, S=np.zeros(1))
        np.testing.assert_allclose(grad, expected, rtol=1e-10)
    hv = gradflow.hvp(capped, wrt="x", of="S")(x=x, S=np.zeros(1), tan_x=direction)
    hv = hv["x"] if isinstance(hv, dict) else hv
    hessian = torch.autograd.functional.hessian(t_capped, torch.tensor(x))
    np.testing.assert_allclose(hv, (hessian @ torch.tensor(direction)).numpy(), rtol=1e-10)
