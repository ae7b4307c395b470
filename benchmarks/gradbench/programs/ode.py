"""ode: `s` steps of fourth-order Runge-Kutta from y = 0 to t = 2 on y'_0 = x_0, y'_i = x_i y_{i-1}; the
primal is the final y, the gradient that of its last element with respect to x."""

from __future__ import annotations

import dace
import numpy as np

from . import Function, built, forward_call

N, S = dace.symbol("N"), dace.symbol("S")


@dace.program
def rate(x: dace.float64[N], y: dace.float64[N], dy: dace.float64[N]):
    dy[0] = x[0]
    dy[1:] = x[1:] * y[:-1]


@dace.program
def ode(x: dace.float64[N], y: dace.float64[N], last: dace.float64[1]):
    h = 2.0 / S
    y[:] = 0.0
    k1 = np.ndarray([N], dtype=np.float64)
    k2 = np.ndarray([N], dtype=np.float64)
    k3 = np.ndarray([N], dtype=np.float64)
    k4 = np.ndarray([N], dtype=np.float64)
    for _ in range(S):
        rate(x, y, k1)
        rate(x, y + h / 2 * k1, k2)
        rate(x, y + h / 2 * k2, k3)
        rate(x, y + h * k3, k4)
        y[:] = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    last[0] = y[N - 1]



def _inputs(input):
    return np.array(input["x"], dtype=np.float64), int(input["s"])


def _primal(input):
    forward, _ = built(ode, "x", "last")
    x, s = _inputs(input)
    y, last = np.zeros_like(x), np.zeros(1)

    return forward_call(forward, y, x=x, y=y, last=last, S=s), lambda y: y.tolist()


def _gradient(input):
    _, value_and_grad = built(ode, "x", "last")
    x, s = _inputs(input)
    return (lambda: value_and_grad(x=x, S=s)[1]), lambda g: g.tolist()


FUNCTIONS = {"primal": Function(_primal), "gradient": Function(_gradient)}
