"""The `remove_views` pass: views are composed onto the arrays they view; the pass is pure."""

from __future__ import annotations

import dace
import numpy as np

import gradflow
from gradflow.autodiff.views import RemoveViews
from gradflow.core.graph import Graph, fingerprint
from gradflow.runtime.compile import compile_sdfg

H = dace.symbol("H")


@dace.program
def strided(X: dace.float64[2 * H], Y: dace.float64[H], S: dace.float64[1]):
    Y[:] = X[1::2] * X[::2]
    S[0] = np.sum(Y)


def _views(sdfg: dace.SDFG) -> int:
    return sum(isinstance(sdfg.arrays[n.data], dace.data.View) for s in sdfg.states() for n in s.data_nodes())


def test_views_removed_and_input_untouched() -> None:
    graph = Graph.of(strided.to_sdfg(simplify=True))
    assert _views(graph.sdfg) > 0
    before = fingerprint(graph.sdfg)
    out = RemoveViews()(graph).unwrap()
    assert fingerprint(graph.sdfg) == before
    assert _views(out.sdfg) == 0
    out.sdfg.validate()


def test_program_without_views_is_returned_unchanged() -> None:
    @dace.program
    def plain(X: dace.float64[H], S: dace.float64[1]):
        S[0] = np.sum(X)

    graph = Graph.of(plain.to_sdfg(simplify=True))
    assert RemoveViews()(graph).unwrap() is graph


def test_same_values_and_gradient_after_removal() -> None:
    h = 5
    X = np.random.default_rng(3).normal(size=2 * h)
    after = RemoveViews()(Graph.of(strided.to_sdfg(simplify=True))).unwrap()
    arrays = {"X": X.copy(), "Y": np.zeros(h), "S": np.zeros(1)}
    compile_sdfg(after)(**arrays, H=h)
    np.testing.assert_allclose(arrays["Y"], X[1::2] * X[::2], rtol=1e-14)
    g = gradflow.grad(strided, wrt="X", of="S")
    arrays = {"X": X.copy(), "Y": np.zeros(h), "S": np.zeros(1), "grad_X": np.zeros(2 * h)}
    compile_sdfg(Graph.adopt(g))(**arrays, H=h)
    expected = np.zeros(2 * h)
    expected[1::2] = X[::2]
    expected[::2] = X[1::2]
    np.testing.assert_allclose(arrays["grad_X"], expected, rtol=1e-12)
