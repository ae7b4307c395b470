"""llsq: a linear least-squares objective, `0.5 * sum_i (sign(t_i) - sum_j x_j t_i^j)^2` at n points
`t_i = -1 + 2 i / (n - 1)`, and its gradient. Written with the matrix of powers, as numpy code would."""

from __future__ import annotations

import dace
import numpy as np

from . import Function, built, forward_call

N, M = dace.symbol("N"), dace.symbol("M")


@dace.program
def llsq(x: dace.float64[M], out: dace.float64[1]):
    t = -1.0 + 2.0 * np.arange(N) / (N - 1)
    P = np.ndarray([N, M], dtype=np.float64)
    P[:, 0] = 1.0
    for j in range(1, M):
        P[:, j] = P[:, j - 1] * t
    r = np.sign(t) - P @ x
    out[0] = 0.5 * np.sum(r * r)



def _inputs(input):
    return np.array(input["x"], dtype=np.float64), int(input["n"])


def _primal(input):
    forward, _ = built(llsq, "x", "out")
    (x, n), out = _inputs(input), np.zeros(1)

    return forward_call(forward, out, x=x, out=out, N=n), lambda out: float(out[0])


def _gradient(input):
    _, value_and_grad = built(llsq, "x", "out")
    x, n = _inputs(input)
    return (lambda: value_and_grad(x=x, N=n)[1]), lambda g: g.tolist()


FUNCTIONS = {"primal": Function(_primal), "gradient": Function(_gradient)}
