"""A gradient RECOMPUTE_ALL got wrong (found by `gradflow fuzz`, seed 5797, program 54, at 0659819; present at
4c56270 too): an element overwritten in every iteration (`x0[0] = x0[i2]`) and read by a product
accumulating in place (`x0[1] *= x0[0]`). The rerun of `t = x0[0]` rebuilt x0's element 0 as its input and
the product's reverse then read all of x0 through that rerun's buffer (its element 1 never written) and
not from the tape. Fails before the fix in `recompute.py` (`RecomputePlan.direct`); STORE_ALL's gradient is
checked too."""

from __future__ import annotations

import dace
import numpy as np

import gradflow

N = dace.symbol("N")


@dace.program
def overwritten_factor(x0: dace.float64[N], w0: dace.float64[N], S: dace.float64[1]):
    for i2 in range(2, N - 2, 3):
        x0[0] = x0[i2]
        x0[1] *= x0[0]
    S[0] += np.sum(x0 * w0)


def _value(x: np.ndarray, w: np.ndarray) -> float:
    x = x.copy()
    for i2 in range(2, len(x) - 2, 3):
        x[0] = x[i2]
        x[1] *= x[0]
    return float(np.sum(x * w))


def _gradient(policy) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = 10
    x, w = rng.uniform(0.5, 1.2, n), rng.normal(size=n)
    steps = np.eye(n) * 1e-6
    differences = np.array([(_value(x + e, w) - _value(x - e, w)) / 2e-6 for e in steps])
    _, grad = gradflow.value_and_grad(overwritten_factor, wrt="x0", of="S", forwarding=policy)(
        x0=x.copy(), w0=w, S=np.zeros(1), N=n)
    return grad, differences


def test_store_all_is_right() -> None:
    grad, differences = _gradient(gradflow.STORE_ALL)
    np.testing.assert_allclose(grad, differences, rtol=1e-6, atol=1e-8)


def test_recompute_all_is_right() -> None:
    grad, differences = _gradient(gradflow.RECOMPUTE_ALL)
    np.testing.assert_allclose(grad, differences, rtol=1e-6, atol=1e-8)
