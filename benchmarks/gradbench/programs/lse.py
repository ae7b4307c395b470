"""lse: log-sum-exp of a vector and its gradient, `max + log(sum(exp(x - max)))` as numpy code writes it."""

from __future__ import annotations

import dace
import numpy as np

from . import Function, built, forward_call

N = dace.symbol("N")


@dace.program
def logsumexp(x: dace.float64[N], out: dace.float64[1]):
    m = np.max(x)
    out[0] = m + np.log(np.sum(np.exp(x - m)))



def _primal(input):
    forward, _ = built(logsumexp, "x", "out")
    x, out = np.array(input["x"], dtype=np.float64), np.zeros(1)

    return forward_call(forward, out, x=x, out=out), lambda out: float(out[0])


def _gradient(input):
    _, value_and_grad = built(logsumexp, "x", "out")
    x = np.array(input["x"], dtype=np.float64)
    return (lambda: value_and_grad(x=x)[1]), lambda g: g.tolist()


FUNCTIONS = {"primal": Function(_primal), "gradient": Function(_gradient)}
