"""Second order through a gradient program that stops a while loop at a user bound
(`Forwarding.with_loop_bounds`, what the error for a growable tape suggests): a run that reaches the bound
must be refused, as `value_and_grad` refuses it. Found 2026-12-07 on lp_newton_sqrt with a bound of 2, both
ways returning a product off by up to 0.11 with no error: `gradflow.hvp` (forward over reverse: its call
read no `gradflow_overflow`) and the `vjp` of the gradient program (reverse over reverse: the second build
did not know the flag numbers the first one writes, `spec.inherited_limits`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gradflow
from gradflow.core.errors import LoopBoundError
from gradflow.verify.routes import run_vjp
from gradflow.verify.corpus import loops
from gradflow.verify.corpus.case import to_tensors

CASE = loops.CASES_BY_NAME["lp_newton_sqrt"]


def _arrays() -> dict[str, np.ndarray]:
    return CASE.inputs(0)


def _torch_hvp(arrays: dict[str, np.ndarray], direction: np.ndarray) -> np.ndarray:
    tensors = to_tensors(arrays)
    rest = {k: v for k, v in tensors.items() if k != "A"}
    _, product = torch.autograd.functional.hvp(lambda a: CASE.torch_fn(A=a, **rest).reshape(()), tensors["A"],
                                               torch.tensor(direction))
    return product.numpy()


def test_a_run_past_the_bound_is_refused_and_one_within_it_is_torchs() -> None:
    arrays = _arrays()
    direction = np.linspace(-1.0, 1.0, arrays["A"].size)
    tight = gradflow.hvp(CASE.program, "A", "S", forwarding=gradflow.STORE_ALL.with_loop_bounds(**{"*": 2}))
    with pytest.raises(LoopBoundError, match="ran more than its bound of 2 iterations"):
        tight(**{k: v.copy() for k, v in arrays.items()}, tan_A=direction)
    ample = gradflow.hvp(CASE.program, "A", "S", forwarding=gradflow.STORE_ALL.with_loop_bounds(**{"*": 64}))
    product = ample(**{k: v.copy() for k, v in arrays.items()}, tan_A=direction)["A"]
    np.testing.assert_allclose(product, _torch_hvp(arrays, direction), rtol=1e-8, atol=1e-12)


def test_the_vjp_of_a_bounded_gradient_program_refuses_a_run_past_the_bound() -> None:
    """Reverse over reverse: the cotangent w of `grad_A` gives H w (H is symmetric)."""
    arrays = _arrays()
    w = np.linspace(-1.0, 1.0, arrays["A"].size)
    for bound in (2, 64):
        gradient_program = gradflow.grad(CASE.program, wrt="A", of="S", optimize=False,
                                         forwarding=gradflow.STORE_ALL.with_loop_bounds(**{"*": bound}))
        pair = gradflow.vjp(gradient_program, wrt="A", of="grad_A", prefix=None)
        given = {**{k: v.copy() for k, v in arrays.items()}, "grad_A": np.zeros_like(arrays["A"])}
        if bound == 2:
            with pytest.raises(LoopBoundError, match="itself a differentiated program"):
                run_vjp(pair, given, dict(CASE.symbols), {"grad_A": w})
        else:
            _, grads = run_vjp(pair, given, dict(CASE.symbols), {"grad_A": w})
            np.testing.assert_allclose(grads["A"], _torch_hvp(arrays, w), rtol=1e-8, atol=1e-12)
