"""hello: `square(x) = x * x` and `double(x)`, the derivative of `square` at x."""

from __future__ import annotations

import functools

import dace
import numpy as np

import gradflow
from gradflow.api import optimized
from gradflow.runtime import Runner

from . import Function


@dace.program
def square(x: dace.float64[1], y: dace.float64[1]):
    y[0] = x[0] * x[0]


@functools.cache
def _built():
    return Runner(optimized(gradflow.Graph.of(square), True)), gradflow.value_and_grad(square, wrt="x", of="y")


def _square(value):
    forward, _ = _built()
    x, y = np.array([float(value)]), np.zeros(1)

    def call():
        forward(x=x, y=y)
        return y[0]
    return call, float


def _double(value):
    _, derivative = _built()
    x = np.array([float(value)])
    return (lambda: derivative(x=x)[1][0]), float


FUNCTIONS = {"square": Function(_square), "double": Function(_double)}
