"""A checkpointed loop's Revolve schedule is computed for the trip count at `sizes=` (`grad`, `vjp`); a call
of that program at another trip count would follow the schedule of the planned one. Found 2026-12-07:
`Forwarding.checkpoint(2, sizes={"T": 4})` called at T = 1, 2, 6 returned gradients off by 0.8-3.3, with
no error. Now the forward checks the trip count before the loop and reports another one through
`gradflow_overflow` (`checkpoint._check_trips`), and every caller that reads the flag refuses the run
(`LoopBoundError`; a torch function too: `tests/torch/test_torch_loop_limits.py`). `value_and_grad` plans
at the call and is right at every T.
"""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.api import grad_graph
from gradflow.autodiff.spec import OVERFLOW
from gradflow.core.errors import LoopBoundError
from gradflow.runtime.invoke import Invoker
from gradflow.verify.routes import gradient, gradient_function

N, T = dace.symbol("N"), dace.symbol("T")
PLANNED = 4


@dace.program
def steps(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    for _ in range(T):
        y[:] = y + 0.5 * np.sin(y) * x
    S[0] = np.sum(y * y)


@dace.program
def from_two(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    for _ in range(2, T):
        y[:] = y * np.cos(x)
    S[0] = np.sum(y)


def _torch_gradient(x: np.ndarray, y: np.ndarray, trips: int) -> np.ndarray:
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = torch.tensor(y, dtype=torch.float64)
    for _ in range(trips):
        yt = yt + 0.5 * torch.sin(yt) * xt
    return torch.autograd.grad((yt * yt).sum(), [xt])[0].numpy()


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.uniform(-1.0, 1.0, 5), "y": rng.uniform(-1.0, 1.0, 5), "S": np.zeros(1)}


def test_at_the_planned_trip_count_the_checkpointed_gradient_is_torchs() -> None:
    arrays = _arrays(0)
    _, grads = gradient(steps, ("x",), "S", {k: v.copy() for k, v in arrays.items()}, {"N": 5, "T": PLANNED},
                        forwarding=gradflow.Forwarding.checkpoint(2, sizes={"T": PLANNED}))
    np.testing.assert_allclose(grads["x"], _torch_gradient(arrays["x"], arrays["y"], PLANNED), rtol=1e-10)


@pytest.mark.parametrize("route", ["grad", "vjp"])
@pytest.mark.parametrize(("program", "size", "planned", "trips"),
                         [(steps, PLANNED, PLANNED, 0), (steps, PLANNED, PLANNED, 1), (steps, PLANNED, PLANNED, 6),
                          (from_two, 2, 0, 3)])
def test_at_another_trip_count_the_run_is_refused(program, size: int, planned: int, trips: int, route: str) -> None:
    """`trips` loop trips where `planned` were planned (at T = `size`); `from_two` planned for none."""
    arrays = _arrays(trips)
    t = trips if program is steps else trips + 2
    with pytest.raises(LoopBoundError, match=rf"checkpointed loop '\w+' ran a number of times other than the "
                                             rf"{planned} its Revolve schedule was computed for"):
        gradient(program, ("x",), "S", {k: v.copy() for k, v in arrays.items()}, {"N": 5, "T": t}, route=route,
                 forwarding=gradflow.Forwarding.checkpoint(2, sizes={"T": size}))


def test_the_raw_program_reports_the_loop_in_its_flag() -> None:
    """Whoever calls the `grad` SDFG directly reads the flag: 0 at the planned trip count, the loop's
    number in `bounded_loops` at another."""
    graph = grad_graph(steps, "x", "S", forwarding=gradflow.Forwarding.checkpoint(2, sizes={"T": PLANNED}))
    (limit,) = graph.meta["ad"].bounded_loops
    assert limit.planned and limit.count == PLANNED
    run = Invoker(graph)
    for trips, flag in ((PLANNED, 0), (PLANNED + 1, 1)):
        out, _ = run(**_arrays(trips), N=5, T=trips)
        assert int(out[OVERFLOW][0]) == flag


def test_planned_at_the_call_every_trip_count_is_right() -> None:
    f = gradflow.value_and_grad(steps, wrt="x", of="S", forwarding=gradflow.Forwarding.checkpoint(2))
    for trips in (1, PLANNED, 6):
        arrays = _arrays(10 + trips)
        _, grad = f(x=arrays["x"].copy(), y=arrays["y"].copy(), S=np.zeros(1), N=5, T=trips)
        np.testing.assert_allclose(grad, _torch_gradient(arrays["x"], arrays["y"], trips), rtol=1e-10)


@dace.program
def every_third(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    for i in range(1, T, 3):
        y[:] = y * np.cos(x) + 0.1 * i
    S[0] = np.sum(y * y)


@dace.program
def down_by_two(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    for i in range(T, 0, -2):
        y[:] = y * np.cos(x) + 0.1 * i
    S[0] = np.sum(y * y)


def _third(t: int) -> range:
    return range(1, t, 3)


def _down(t: int) -> range:
    return range(t, 0, -2)


@pytest.mark.parametrize(("program", "iterations"), [(every_third, _third), (down_by_two, _down)])
def test_a_strided_loop_is_refused_exactly_when_its_trip_count_differs(program, iterations) -> None:
    """The check compares trip counts, not sizes: planned at T = 7, a call at another T with as many trips
    (range(1, 5, 3) and range(1, 7, 3) both run 1, 4; range(8, 0, -2) runs four times as range(7, 0, -2)
    does) follows a valid schedule and must not be refused; one with another count must be.
    `iterations(T)` is the loop's range in Python."""
    policy = gradflow.Forwarding.checkpoint(2, sizes={"T": 7})
    planned = len(iterations(7))
    outcomes = set()
    for t in (5, 7, 8, 9, 10):
        arrays = _arrays(t)
        xt = torch.tensor(arrays["x"], requires_grad=True)
        yt = torch.tensor(arrays["y"])
        for i in iterations(t):
            yt = yt * torch.cos(xt) + 0.1 * i
        expected = torch.autograd.grad((yt * yt).sum(), [xt])[0].numpy()
        run = gradient_function(program, ("x",), "S", {"N": 5, "T": t}, forwarding=policy)
        if len(iterations(t)) == planned:
            _, grads = run({k: v.copy() for k, v in arrays.items()})
            np.testing.assert_allclose(grads["x"], expected, rtol=1e-10)
            outcomes.add(t != 7)
        else:
            with pytest.raises(LoopBoundError):
                run({k: v.copy() for k, v in arrays.items()})
    assert outcomes == {False, True}  # an other T with the planned count was among them
