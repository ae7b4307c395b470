"""lse: log-sum-exp of a vector and its gradient, `max + log(sum(exp(x - max)))` as numpy code writes it."""

from __future__ import annotations

import functools

import dace
import numpy as np

import gradflow
from gradflow.api import optimized
from gradflow.runtime import Runner

from . import Function

N = dace.symbol("N")


@dace.program
def logsumexp(x: dace.float64[N], out: dace.float64[1]):
    m = np.max(x)
    out[0] = m + np.log(np.sum(np.exp(x - m)))


@functools.cache
def _built():
    return (Runner(optimized(gradflow.Graph.of(logsumexp), True)),
            gradflow.value_and_grad(logsumexp, wrt="x", of="out"))


def _primal(input):
    forward, _ = _built()
    x, out = np.array(input["x"], dtype=np.float64), np.zeros(1)

    def call():
        forward(x=x, out=out)
        return out[0]
    return call, float


def _gradient(input):
    _, value_and_grad = _built()
    x = np.array(input["x"], dtype=np.float64)
    return (lambda: value_and_grad(x=x)[1]), lambda g: g.tolist()


FUNCTIONS = {"primal": Function(_primal), "gradient": Function(_gradient)}
