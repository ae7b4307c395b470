"""hello: `square(x) = x * x` and `double(x)`, the derivative of `square` at x."""

from __future__ import annotations

import dace
import numpy as np

from . import Function, built, forward_call


@dace.program
def square(x: dace.float64[1], y: dace.float64[1]):
    y[0] = x[0] * x[0]


def _square(value):
    forward, _ = built(square, "x", "y")
    x, y = np.array([float(value)]), np.zeros(1)
    return forward_call(forward, y, x=x, y=y), lambda y: float(y[0])


def _double(value):
    _, derivative = built(square, "x", "y")
    x = np.array([float(value)])
    return (lambda: derivative(x=x)[1]), lambda g: float(g[0])


FUNCTIONS = {"square": Function(_square), "double": Function(_double)}
