"""Tangents and Hessians of products where factors are zero: a map multiplying into an argument
(`P[0] *= f(x[i])`, a write-conflict product, whose old value is a factor too) and `np.prod`, against
torch in float64. The gradient of a product treats zero factors apart; its tangent (a Hessian through
forward mode) must keep the tangents of the zero factors."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow

N = dace.symbol("N")


@dace.program
def _into_argument(x: dace.float64[N], P: dace.float64[2], S: dace.float64[1]):
    for i in dace.map[0:N]:
        P[0] *= x[i] * (x[i] + 1.0)
    S[0] = P[0] * P[1] + np.prod(x[1:] * 2.0)


def _torch_loss(x, P):
    return P[0] * (x * (x + 1.0)).prod() * P[1] + (x[1:] * 2.0).prod()


# zero factors: none; x = 0 (in both products); x = -1 (a zero of the map's factor only); two and three
# zeros; the old value P[0] = 0, alone and with a zero factor
POINTS = {
    "no_zero": ([0.5, 1.5, -0.7, 2.0, 0.9], [1.3, -0.8]),
    "one_zero": ([0.5, 0.0, -0.7, 2.0, 0.9], [1.3, -0.8]),
    "minus_one": ([0.5, -1.0, -0.7, 2.0, 0.9], [1.3, -0.8]),
    "two_zeros": ([0.5, 0.0, -1.0, 2.0, 0.9], [1.3, -0.8]),
    "three_zeros": ([0.0, 0.0, 1.0, 0.0, 0.9], [1.3, -0.8]),
    "old_value_zero": ([0.5, 1.5, -0.7, 2.0, 0.9], [0.0, -0.8]),
    "old_value_and_factor_zero": ([0.5, 1.5, 0.0, 2.0, 0.9], [0.0, -0.8]),
}


@pytest.fixture(scope="module")
def hvp():
    return gradflow.hvp(_into_argument, wrt=("x", "P"), of="S")


@pytest.fixture(scope="module")
def jvp():
    return gradflow.value_and_jvp(_into_argument, wrt=("x", "P"), of=("P", "S"))


@pytest.mark.parametrize("point", sorted(POINTS))
def test_hessian_of_products_with_zero_factors_equals_torch(hvp, point):
    x, P = (np.array(a) for a in POINTS[point])
    want = torch.autograd.functional.hessian(_torch_loss, (torch.tensor(x), torch.tensor(P)))
    n = x.size
    for k in range(n + 2):  # one Hessian column per unit direction
        vx, vP = np.zeros(n), np.zeros(2)
        (vx if k < n else vP)[k if k < n else k - n] = 1.0
        got = hvp(x=x.copy(), P=P.copy(), S=np.zeros(1), tan_x=vx, tan_P=vP)
        col_x = (want[0][0][:, k] if k < n else want[0][1][:, k - n]).numpy()
        col_P = (want[1][0][:, k] if k < n else want[1][1][:, k - n]).numpy()
        np.testing.assert_allclose(got["x"], col_x, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got["P"], col_P, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("point", sorted(POINTS))
def test_tangent_of_a_write_conflict_product_equals_torch(jvp, point):
    x, P = (np.array(a) for a in POINTS[point])
    rng = np.random.default_rng(len(point))
    vx, vP = rng.standard_normal(x.size), rng.standard_normal(2)

    def f(tx, tP):
        new = torch.cat([tP[:1] * (tx * (tx + 1.0)).prod(), tP[1:]])
        return new, _torch_loss(tx, tP).reshape(1)

    (want_P, want_S), (tan_P, tan_S) = torch.func.jvp(f, (torch.tensor(x), torch.tensor(P)),
                                                      (torch.tensor(vx), torch.tensor(vP)))
    values, tangents = jvp(x=x.copy(), P=P.copy(), S=np.zeros(1), tan_x=vx, tan_P=vP)
    np.testing.assert_allclose(values["P"], want_P.numpy(), rtol=1e-12)
    np.testing.assert_allclose(values["S"], want_S.numpy(), rtol=1e-12)
    np.testing.assert_allclose(tangents["P"], tan_P.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tangents["S"], tan_S.numpy(), rtol=1e-10, atol=1e-12)
