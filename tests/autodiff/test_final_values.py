"""Rules read an operation's result where the backward sweep finds it unchanged (`ReverseContext.final_value`:
written by that operation only, outside loops) instead of recomputing it: the reverse of `y = exp(u)` reads
`y`, the reverse of a max reduction compares with the stored maximum. Where the result is overwritten
later, they recompute it. Gradients agree with NumPy's in both cases."""

from __future__ import annotations

import dace
import numpy as np
from dace.libraries.standard import Reduce

import gradflow
from gradflow.runtime.compile import compile_sdfg

N, M = 5, 7


@dace.program
def softmax_like(x: dace.float64[N, M], w: dace.float64[N, M], S: dace.float64[1]):
    m = np.max(x, axis=1)
    e = np.exp(x - m[:, np.newaxis])
    S[0] = np.sum(e * w) + np.sum(m)


@dace.program
def overwritten_results(x: dace.float64[N, M], w: dace.float64[N, M], S: dace.float64[1]):
    m = np.max(x, axis=1)
    e = np.exp(x - m[:, np.newaxis])
    S[0] = np.sum(e * w) + np.sum(m)
    e[:] = 0.0  # both results are overwritten after their last use
    m[:] = 0.0
    S[0] += np.sum(e) + np.sum(m)


def _backward_code(sdfg: dace.SDFG) -> str:
    [backward] = [b for b in sdfg.nodes() if b.label == "gradflow_backward"]
    return "\n".join(n.code.as_string for n, _ in backward.all_nodes_recursive() if isinstance(n, dace.nodes.Tasklet))


def _reductions(sdfg: dace.SDFG) -> int:
    return sum(isinstance(n, Reduce) and n.wcr is not None and "max" in n.wcr
               for n, _ in sdfg.all_nodes_recursive())


def _gradient(sdfg: dace.SDFG, x, w) -> np.ndarray:
    g = np.full((N, M), np.nan)
    compile_sdfg(sdfg)(x=x.copy(), w=w, S=np.zeros(1), grad_x=g)
    return g


def _expected(x, w) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    at_max = (x == m).astype(float)
    return e * w + at_max * (1 - (e * w).sum(axis=1, keepdims=True))


def test_results_are_read_where_they_stay() -> None:
    sdfg = gradflow.grad(softmax_like, wrt="x", of="S", optimize=False)
    assert "exp(" not in _backward_code(sdfg) and _reductions(sdfg) == 1
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((N, M)), rng.standard_normal((N, M))
    np.testing.assert_allclose(_gradient(sdfg, x, w), _expected(x, w), rtol=1e-12, atol=1e-14)


def test_overwritten_results_are_recomputed() -> None:
    sdfg = gradflow.grad(overwritten_results, wrt="x", of="S", optimize=False)
    assert "exp(" in _backward_code(sdfg) and _reductions(sdfg) == 2
    rng = np.random.default_rng(10)
    x, w = rng.standard_normal((N, M)), rng.standard_normal((N, M))
    np.testing.assert_allclose(_gradient(sdfg, x, w), _expected(x, w), rtol=1e-12, atol=1e-14)
