"""`raise_loop_reductions`: a loop taking the max (or min) of a row element by element becomes a `Reduce`;
sums (whose order would change), loops over a computed value and loops writing what they reduce are left
alone. Values and gradients are the loop's."""

from __future__ import annotations

import dace
import numpy as np
import torch
from dace.libraries.standard import Reduce
from dace.sdfg.state import LoopRegion

import gradflow
from gradflow.transforms.loop_reductions import RaiseLoopReductions, _candidates
from gradflow.transforms.views import RemoveViews
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg

N, M = dace.symbol("N"), dace.symbol("M")


@dace.program
def row_extrema(X: dace.float64[N, M], W: dace.float64[N], S: dace.float64[1]):
    for i in range(N):
        hi = X[i, 0]
        for j in range(1, M):
            hi = max(hi, X[i, j])
        lo = X[i, M - 1]
        for j in range(M - 2, -1, -1):
            lo = min(X[i, j], lo)
        S[0] += (hi - lo) * W[i]


@dace.program
def not_extrema(X: dace.float64[N, M], S: dace.float64[1]):
    for i in range(N):
        s = 0.0
        for j in range(M):
            s += X[i, j]  # a sum: vectorized, its order would change
        t = X[i, 0]
        for j in range(1, M):
            t = max(t, 2.0 * X[i, j])  # a computed value, not an element
        u = X[i, 0]
        for j in range(1, M):
            u = max(u, X[i, j])
            X[i, j] = u  # writes what it reduces
        S[0] += s + t + u


@dace.program
def index_used_after(X: dace.float64[N, M], Y: dace.float64[M], S: dace.float64[1]):
    m = X[0, 0]
    for j in range(1, M):
        m = max(m, X[0, j])
    Y[j] = m  # the loop variable's last value is read after the loop: the loop stays
    S[0] = m


def _prepared(program) -> Graph:
    return RemoveViews()(Graph.of(program)).unwrap()


def _count(graph: Graph) -> int:
    return sum(len(_candidates(s)) for s in graph.sdfg.all_sdfgs_recursive())


def _loops(graph: Graph) -> int:
    return sum(isinstance(b, LoopRegion) for b in graph.sdfg.all_control_flow_blocks())


def test_max_and_min_loops_become_reductions() -> None:
    graph = _prepared(row_extrema)
    assert _count(graph) == 2 and _loops(graph) == 3
    raised = RaiseLoopReductions()(graph).unwrap()
    assert _count(raised) == 0 and _loops(raised) == 1
    assert sum(isinstance(n, Reduce) for n, _ in raised.sdfg.all_nodes_recursive()) == 2
    n, m = 6, 9
    rng = np.random.default_rng(11)
    X, W = rng.standard_normal((n, m)), rng.standard_normal(n)
    for sdfg in (graph, raised):
        S = np.zeros(1)
        compile_sdfg(sdfg)(X=X, W=W, S=S, N=n, M=m)
        np.testing.assert_allclose(S[0], np.sum((X.max(1) - X.min(1)) * W), rtol=1e-13)


def test_sums_computed_values_and_rewritten_rows_stay_loops() -> None:
    for program in (not_extrema, index_used_after):
        graph = _prepared(program)
        assert _count(graph) == 0, program.name
        assert RaiseLoopReductions()(graph).unwrap() is graph


def test_gradient_of_raised_extrema() -> None:
    sdfg = gradflow.grad(row_extrema, wrt="X", of="S")
    assert not any(isinstance(b, LoopRegion) and b.label.startswith("reverse_for") and
                   any(isinstance(c, LoopRegion) for c in b.all_control_flow_blocks() if c is not b)
                   for b in sdfg.all_control_flow_blocks())  # no reversed inner loops
    n, m = 5, 8
    rng = np.random.default_rng(12)
    X, W = rng.standard_normal((n, m)), rng.standard_normal(n)
    g = np.full((n, m), np.nan)
    compile_sdfg(sdfg)(X=X.copy(), W=W, S=np.zeros(1), grad_X=g, N=n, M=m)
    x = torch.tensor(X, requires_grad=True)
    (torch.sum((x.amax(1) - x.amin(1)) * torch.tensor(W))).backward()
    np.testing.assert_allclose(g, x.grad.numpy(), rtol=1e-13)
