"""gmm: the log-posterior of a Gaussian mixture (ADBench's objective, with GradBench's fixes) and its
gradient with respect to the mixture's parameters alpha, mu, q and l.

The precision factor of component k is Q_k = diag(exp(q_k)) + L_k, with L_k strictly lower triangular,
filled column by column from l_k. Constants that depend only on the sizes, gamma and m (the Gaussian's
normalisation, the Wishart prior's log multigamma) are computed once in Python and passed in.
"""

from __future__ import annotations

import math

import dace
import numpy as np
from scipy.special import multigammaln

from . import Function, built, forward_call

N, K, D, T = (dace.symbol(s) for s in "NKDT")


@dace.program
def gmm(alpha: dace.float64[K], mu: dace.float64[K, D], q: dace.float64[K, D], l: dace.float64[K, T],  # noqa: E741
        x: dace.float64[N, D], gamma: dace.float64, m: dace.float64, constant: dace.float64,
        out: dace.float64[1]):
    Qdiags = np.exp(q)
    sum_qs = np.sum(q, axis=1)
    Ls = np.zeros((K, D, D), dtype=np.float64)
    for k in range(K):
        for j in range(D):
            for i in range(j + 1, D):
                Ls[k, i, j] = l[k, j * (D - 1) - (j * (j - 1)) // 2 + i - j - 1]
    inner = np.ndarray((N, K), dtype=np.float64)
    for k in range(K):
        xc = x - mu[k]
        Lxc = xc * Qdiags[k] + xc @ np.transpose(Ls[k])
        inner[:, k] = alpha[k] + sum_qs[k] - 0.5 * np.sum(Lxc * Lxc, axis=1)
    top = np.max(inner, axis=1)
    slse = np.sum(top + np.log(np.sum(np.exp(inner - top[:, None]), axis=1)))
    amax = np.max(alpha)
    lse_alpha = amax + np.log(np.sum(np.exp(alpha - amax)))
    prior = np.sum(0.5 * gamma * gamma * (np.sum(Qdiags * Qdiags, axis=1) + np.sum(l * l, axis=1)) - m * sum_qs)
    out[0] = constant + slse - N * lse_alpha - prior


def _constant(n: int, d: int, k: int, gamma: float, m: float) -> float:
    """The terms that depend on neither the data nor the parameters."""
    dof = d + m + 1
    wishart = k * (dof * d * math.log(gamma / math.sqrt(2)) - multigammaln(0.5 * dof, d))
    return -n * d * 0.5 * math.log(2 * math.pi) + wishart



def _inputs(input) -> dict:
    d, k, n = int(input["d"]), int(input["k"]), int(input["n"])
    arrays = {name: np.array(input[name], dtype=np.float64).reshape(shape) for name, shape in
              (("alpha", (k,)), ("mu", (k, d)), ("q", (k, d)), ("l", (k, d * (d - 1) // 2)), ("x", (n, d)))}
    gamma, m = float(input["gamma"]), float(input["m"])
    return arrays | {"gamma": gamma, "m": m, "constant": _constant(n, d, k, gamma, m)}


def _objective(input):
    forward, _ = built(gmm, ("alpha", "mu", "q", "l"), "out")
    arguments, out = _inputs(input), np.zeros(1)

    return forward_call(forward, out, **arguments, out=out), lambda out: float(out[0])


def _jacobian(input):
    _, value_and_grad = built(gmm, ("alpha", "mu", "q", "l"), "out")
    arguments = _inputs(input)
    return (lambda: value_and_grad(**arguments)[1]), lambda g: {k: v.tolist() for k, v in g.items()}


FUNCTIONS = {"objective": Function(_objective), "jacobian": Function(_jacobian)}
