"""`gradflow.torch.function` of a program with loop limits: a while loop stopped at the user's bound
(`Forwarding.with_loop_bounds`) or a loop checkpointed for the trip count at `sizes=`. Both report a broken
limit through `gradflow_overflow`; the function reads that flag after every call (an extra output, as the
index checks' flag) and raises `LoopBoundError`, through either dispatcher. Until 2026-12-07 such a VJP was
refused when the function was made, because neither dispatcher read the flag."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gradflow
import gradflow.torch
from gradflow.core.errors import LoopBoundError
from gradflow.verify.corpus import loops
from tests.autodiff.test_checkpoint_planned_trips import PLANNED, steps
from tests.autodiff.test_checkpoint_planned_trips import _torch_gradient as _steps_gradient

NEWTON = loops.CASES_BY_NAME["lp_newton_sqrt"]


def _newton(bound: int, dispatcher: str) -> gradflow.torch.Function:
    return gradflow.torch.function(NEWTON.program, inputs=["A", "X"], outputs=["S"], wrt=["A"],
                                   dispatcher=dispatcher,
                                   forwarding=gradflow.STORE_ALL.with_loop_bounds(**{"*": bound}))


@pytest.mark.parametrize("dispatcher", ["ctypes", "cpp"])
def test_a_while_loop_past_its_bound_is_refused_and_within_it_is_torchs(dispatcher: str) -> None:
    arrays = NEWTON.inputs(0)
    a = torch.tensor(arrays["A"], requires_grad=True)
    with pytest.raises(LoopBoundError, match="ran more than its bound of 2 iterations"):
        _newton(2, dispatcher)(a, torch.zeros(a.shape, dtype=torch.float64))
    ample = _newton(64, dispatcher)
    assert ample.outputs == ("S",)  # the flag is checked, not returned
    (got,) = torch.autograd.grad(ample(a, torch.zeros(a.shape, dtype=torch.float64)).sum(), [a])
    reference = torch.tensor(arrays["A"], requires_grad=True)
    (want,) = torch.autograd.grad(NEWTON.torch_fn(A=reference, S=torch.zeros(1, dtype=torch.float64)).sum(),
                                  [reference])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10)


@pytest.mark.parametrize("trips", [PLANNED - 1, PLANNED, PLANNED + 2])
def test_a_checkpoint_schedule_runs_only_at_its_planned_trip_count(trips: int) -> None:
    pair = gradflow.vjp(steps, "x", "S", forwarding=gradflow.Forwarding.checkpoint(2, sizes={"T": PLANNED}))
    function = gradflow.torch.function(pair, inputs=["x", "y"], outputs=["S"], symbols={"T": trips})
    rng = np.random.default_rng(trips)
    x, y = rng.uniform(-1.0, 1.0, 5), rng.uniform(-1.0, 1.0, 5)
    xt = torch.tensor(x, requires_grad=True)
    if trips != PLANNED:
        with pytest.raises(LoopBoundError, match=f"other than the {PLANNED} its Revolve schedule"):
            function(xt, torch.tensor(y))
        return
    (got,) = torch.autograd.grad(function(xt, torch.tensor(y)).sum(), [xt])
    np.testing.assert_allclose(got.numpy(), _steps_gradient(x, y, trips), rtol=1e-10)
