"""The forward-mode entry points as users call them: `jvp`, `value_and_jvp`, `hvp`, `hessian` against torch,
their errors, and what they leave untouched."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.core.errors import ArgumentError, InvalidArgumentError, UnknownArrayError

N = dace.symbol("N")
K = dace.symbol("K")
D = dace.symbol("D")
H = dace.symbol("H")


@dace.program
def smooth(x: dace.float64[N], w: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    y[:] = np.tanh(x) * w + np.exp(0.5 * x)
    S[0] = np.sum(y * y) + np.max(x * w)


def _torch_smooth(x, w):
    y = torch.tanh(x) * w + torch.exp(0.5 * x)
    return y, (y * y).sum() + torch.max(x * w)


@pytest.fixture(scope="module")
def smooth_jvp():
    return gradflow.value_and_jvp(smooth, wrt="x")


def test_value_and_jvp_numpy_and_torch(smooth_jvp):
    rng = np.random.default_rng(3)
    x, w, v = rng.normal(size=8), rng.normal(size=8), rng.normal(size=8)
    values, tangents = smooth_jvp(x=x, w=w, tan_x=v)
    (y_ref, s_ref), (ty_ref, ts_ref) = torch.func.jvp(lambda t: _torch_smooth(t, torch.tensor(w)),
                                                      (torch.tensor(x),), (torch.tensor(v),))
    np.testing.assert_allclose(values["y"], y_ref.numpy(), rtol=1e-12)
    np.testing.assert_allclose(values["S"], s_ref.item(), rtol=1e-12)
    np.testing.assert_allclose(tangents["y"], ty_ref.numpy(), rtol=1e-10)
    np.testing.assert_allclose(tangents["S"][0], ts_ref.item(), rtol=1e-10)
    _, from_torch = smooth_jvp(x=torch.tensor(x), w=torch.tensor(w), tan_x=torch.tensor(v))
    assert isinstance(from_torch["S"], torch.Tensor)
    np.testing.assert_allclose(from_torch["S"].numpy(), tangents["S"], rtol=1e-14)


def test_missing_tangent_is_named(smooth_jvp):
    with pytest.raises(ArgumentError, match="tan_x"):
        smooth_jvp(x=np.ones(4), w=np.ones(4))


def test_unknown_wrt_is_named():
    with pytest.raises(UnknownArrayError, match="wrt"):
        gradflow.jvp(smooth, wrt="z")


def test_integer_wrt_is_refused():
    @dace.program
    def counts(i: dace.int64[N], S: dace.float64[1]):
        S[0] = np.sum(i) * 1.0

    with pytest.raises(InvalidArgumentError, match="only floating-point"):
        gradflow.jvp(counts, wrt="i")


def test_jvp_sdfg_takes_and_returns_tangents():
    sdfg = gradflow.jvp(smooth, wrt="x", of="S")
    arguments = {n for n, d in sdfg.arrays.items() if not d.transient}
    assert {"tan_x", "tan_S"} <= arguments and "tan_y" not in arguments


@dace.program
def scale_in_place(x: dace.float64[N], S: dace.float64[1]):
    x[:] = x * x
    S[0] = np.sum(x)


def test_in_place_wrt_keeps_the_callers_tangent():
    f = gradflow.value_and_jvp(scale_in_place, wrt="x", of=["x", "S"])
    x, v = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.5, -1.0])
    given = v.copy()
    _, tangents = f(x=x.copy(), tan_x=given)
    np.testing.assert_array_equal(given, v)
    np.testing.assert_allclose(tangents["x"], 2 * np.array([1.0, 2.0, 3.0]) * v)
    np.testing.assert_allclose(tangents["S"], [np.sum(2 * np.array([1.0, 2.0, 3.0]) * v)])


@dace.program
def tied_max(x: dace.float64[N], S: dace.float64[1]):
    S[0] = np.max(x)


def test_max_tangent_is_the_mean_over_ties_as_torch_amax():
    f = gradflow.value_and_jvp(tied_max, wrt="x", of="S")
    x, v = np.array([3.0, 1.0, 3.0, 3.0]), np.array([1.0, 5.0, 2.0, 6.0])
    _, tangents = f(x=x, tan_x=v)
    want = torch.func.jvp(torch.amax, (torch.tensor(x),), (torch.tensor(v),))[1]
    np.testing.assert_allclose(tangents["S"][0], want.item(), rtol=1e-14)


@dace.program
def mlp_loss(X: dace.float64[N, D], W1: dace.float64[D, H], W2: dace.float64[H, 1], S: dace.float64[1]):
    h = np.tanh(X @ W1)
    out = h @ W2
    S[0] = np.sum(out * out) / N


def test_hessian_of_a_small_mlp_loss_equals_torch():
    rng = np.random.default_rng(5)
    X, W1, W2 = rng.normal(size=(6, 3)), rng.normal(size=(3, 4)), rng.normal(size=(4, 1))
    H_gf = gradflow.hessian(mlp_loss, wrt="W1", of="S")(X=X, W1=W1, W2=W2)

    def loss(w1):
        out = torch.tanh(torch.tensor(X) @ w1) @ torch.tensor(W2)
        return (out * out).sum() / X.shape[0]

    want = torch.autograd.functional.hessian(loss, torch.tensor(W1))
    assert H_gf.shape == (3, 4, 3, 4)
    np.testing.assert_allclose(H_gf, want.numpy(), rtol=1e-10, atol=1e-12)


@dace.program
def kmeans_objective(P: dace.float64[N, D], C: dace.float64[K, D], S: dace.float64[1]):
    dist = np.ndarray((N, K), dtype=np.float64)
    for i in range(N):
        for k in range(K):
            dist[i, k] = np.sum((P[i] - C[k]) * (P[i] - C[k]))
    S[0] = np.sum(np.min(dist, axis=1))


def test_hessian_of_the_k_means_objective_equals_torch():
    rng = np.random.default_rng(11)
    P, C = rng.normal(size=(7, 2)), rng.normal(size=(3, 2))
    H_gf = gradflow.hessian(kmeans_objective, wrt="C", of="S")(P=P, C=C)

    def objective(c):
        d = ((torch.tensor(P)[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        return d.min(dim=1).values.sum()

    want = torch.autograd.functional.hessian(objective, torch.tensor(C))
    np.testing.assert_allclose(H_gf, want.numpy(), rtol=1e-10, atol=1e-12)


@dace.program
def product(x: dace.float64[N], S: dace.float64[1]):
    S[0] = np.prod(x)


@pytest.mark.parametrize("x", [[2.0, -1.5, 3.0, 0.5], [2.0, 0.0, 3.0, 0.5], [0.0, 1.0, 0.0, 2.0]])
def test_product_tangent_is_exact_where_factors_are_zero(x):
    f = gradflow.value_and_jvp(product, wrt="x", of="S")
    x, v = np.array(x), np.array([0.3, -1.2, 0.7, 2.0])
    _, tangents = f(x=x, tan_x=v)
    want = torch.func.jvp(torch.prod, (torch.tensor(x),), (torch.tensor(v),))[1]
    np.testing.assert_allclose(tangents["S"][0], want.item(), rtol=1e-14, atol=1e-15)


@dace.program
def _cubed_min_of_neighbours(x: dace.float64[N], w: dace.float64[N], S: dace.float64[1]):
    y = x[:N - 1] ** 3
    z = np.minimum(y[:N - 2], y[1:]) ** 3
    S[0] += np.sum(z * w[:N - 2])


def test_hvp_through_a_min_of_computed_values_equals_torch():
    # the min's backward tasklet and its tangent both name temporaries `__cse1`, ...; the tangent's came
    # first and made one a bool, so the backward's gradient of y read 1.0 (H v 1.81 where torch has 0.0157;
    # fuzz seed 16567, program 88). The tangent's temporaries now avoid the tasklet's names.
    n = 5
    x, w = np.linspace(0.3, 0.9, n), np.random.default_rng(3).standard_normal(n)
    weights = torch.tensor(w)

    def loss(t):
        y = t[:n - 1] ** 3
        return (torch.minimum(y[:n - 2], y[1:]) ** 3 * weights[:n - 2]).sum()

    f = gradflow.hvp(_cubed_min_of_neighbours, wrt="x", of="S")
    for v in np.eye(n):
        want = torch.autograd.functional.hvp(loss, torch.tensor(x), torch.tensor(v))[1].numpy()
        got = f(x=x.copy(), w=w, S=np.zeros(1), tan_x=v)["x"]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


P = dace.symbol("P")


@dace.program
def _kmeans_cost(points: dace.float64[P, D], centroids: dace.float64[K, D], S: dace.float64[1]):
    distances = (np.sum(points * points, axis=1)[:, None] + np.sum(centroids * centroids, axis=1)[None, :]
                 - 2.0 * (points @ np.transpose(centroids)))
    S[0] = np.sum(np.min(distances, axis=1))


def test_grad_and_hvp_return_torchs_gradient_and_hessian_vector_product():
    # one program for both (GradBench's k-means Newton direction needs the two); sizes of several tiles
    rng = np.random.default_rng(8)
    f = gradflow.grad_and_hvp(_kmeans_cost, wrt="centroids", of="S")
    for p, k, d in ((9, 3, 2), (40, 70, 3)):
        points, centroids, v = rng.random((p, d)), rng.random((k, d)), rng.standard_normal((k, d))

        def loss(c, points=points):
            t = torch.tensor(points)
            return ((t[:, None, :] - c[None, :, :]) ** 2).sum(-1).min(dim=1).values.sum()

        c = torch.tensor(centroids)
        want_grad = torch.func.grad(loss)(c).numpy()
        want_hvp = torch.autograd.functional.hvp(loss, c, torch.tensor(v))[1].numpy()
        got_grad, got_hvp = f(points=points, centroids=centroids.copy(), S=np.zeros(1), tan_centroids=v)
        np.testing.assert_allclose(got_grad["centroids"], want_grad, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got_hvp["centroids"], want_hvp, rtol=1e-10, atol=1e-12)
        # the same as `hvp` and `value_and_grad`, each on its own
        alone = gradflow.hvp(_kmeans_cost, wrt="centroids", of="S")(points=points, centroids=centroids.copy(),
                                                                   S=np.zeros(1), tan_centroids=v)
        np.testing.assert_allclose(got_hvp["centroids"], alone["centroids"], rtol=1e-14, atol=0)
