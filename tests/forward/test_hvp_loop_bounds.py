"""A Hessian-vector program is the tangent of a gradient program; where that gradient program stops a while
loop at a user bound (`Forwarding.with_loop_bounds`, what the error for a growable tape suggests), a run
that reaches the bound must be refused, as `value_and_grad` refuses it. Found 2026-12-07: `gradflow.hvp`
of lp_newton_sqrt with a bound of 2 returned a product off by up to 0.11 with no error (its call read no
`gradflow_overflow`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gradflow
from gradflow.core.errors import LoopBoundError
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
