"""`hoist_row_products`: a loop of vector-matrix products over the columns of a matrix reads rows of one
matrix product computed before the loop; not where the loop writes an operand, or where the rows the
products sum over change with the loop. Values and gradients are the loop's.

Also the gradient of such a Gram product `X^T X`: one product `X (G + G^T)`, not two."""

from __future__ import annotations

import dace
import numpy as np
from dace.libraries.blas import Gemm, MatMul

import gradflow
from gradflow.transforms.row_products import HoistRowProducts, _candidates
from gradflow.transforms.views import RemoveViews
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg

N, M = dace.symbol("N"), dace.symbol("M")


@dace.program
def upper_products(X: dace.float64[N, M], Y: dace.float64[N, M], W: dace.float64[M, M], S: dace.float64[1]):
    P = np.zeros((M, M), dtype=np.float64)
    for i in range(M):
        P[i, i:M] = X[:, i] @ Y[:, i:M] * 2.0
    S[0] = np.sum(P * W)


@dace.program
def rewritten_operand(X: dace.float64[N, M], P: dace.float64[M, M]):
    for i in range(M):
        P[i, i:M] = X[:, i] @ X[:, i:M]
        X[:, i] = 0.5 * X[:, i]  # the loop writes X: a later row reads the new column


@dace.program
def moving_rows(X: dace.float64[N, M], P: dace.float64[M, M]):
    for i in range(M):
        P[i, i:M] = X[i:N, i] @ X[i:N, i:M]  # the rows summed over change with i


def _unviewed(program) -> Graph:
    return RemoveViews()(Graph.of(program)).unwrap()


def _count(graph: Graph) -> int:
    return sum(len(_candidates(s)) for s in graph.sdfg.all_sdfgs_recursive())


def test_a_loop_of_row_products_reads_one_product() -> None:
    graph = _unviewed(upper_products)
    assert _count(graph) == 1
    hoisted = HoistRowProducts()(graph).unwrap()
    assert _count(hoisted) == 0
    [product] = [n for n, _ in hoisted.sdfg.all_nodes_recursive() if isinstance(n, MatMul)]
    assert product.transA and product.alpha == 1
    n, m = 7, 5
    rng = np.random.default_rng(5)
    X, Y, W = rng.standard_normal((n, m)), rng.standard_normal((n, m)), rng.standard_normal((m, m))
    for sdfg in (graph, hoisted):
        S = np.zeros(1)
        compile_sdfg(sdfg)(X=X, Y=Y, W=W, S=S, N=n, M=m)
        np.testing.assert_allclose(S[0], np.sum(np.triu(2.0 * X.T @ Y) * W), rtol=1e-12)


def test_loops_writing_an_operand_or_moving_their_rows_are_left_alone() -> None:
    for program in (rewritten_operand, moving_rows):
        graph = _unviewed(program)
        assert _count(graph) == 0, program.name
        assert HoistRowProducts()(graph).unwrap() is graph


def test_gradients_of_hoisted_row_products() -> None:
    sdfg = gradflow.grad(upper_products, wrt=["X", "Y"], of="S")
    n, m = 6, 4
    rng = np.random.default_rng(6)
    X, Y, W = rng.standard_normal((n, m)), rng.standard_normal((n, m)), rng.standard_normal((m, m))
    gX, gY = np.full((n, m), np.nan), np.full((n, m), np.nan)
    compile_sdfg(sdfg)(X=X, Y=Y, W=W, S=np.zeros(1), grad_X=gX, grad_Y=gY, N=n, M=m)
    G = 2.0 * np.triu(W)  # dS/d(X^T Y) on the upper triangle the loop writes
    np.testing.assert_allclose(gX, Y @ G.T, rtol=1e-12)
    np.testing.assert_allclose(gY, X @ G, rtol=1e-12)


@dace.program
def gram_rows(X: dace.float64[N, M], W: dace.float64[M, M], S: dace.float64[1]):
    P = np.zeros((M, M), dtype=np.float64)
    for i in range(M):
        P[i, i:M] = X[:, i] @ X[:, i:M]
    S[0] = np.sum(P * W)


def test_the_gradient_of_a_gram_product_is_one_product() -> None:
    sdfg = gradflow.grad(gram_rows, wrt="X", of="S")
    # forward X^T X, backward X (G + G^T): one Gemm each (the general rule makes two in the backward)
    products = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, (Gemm, MatMul))]
    assert len(products) == 2
    n, m = 6, 4
    rng = np.random.default_rng(7)
    X, W = rng.standard_normal((n, m)), rng.standard_normal((m, m))
    gX = np.full((n, m), np.nan)
    compile_sdfg(sdfg)(X=X, W=W, S=np.zeros(1), grad_X=gX, N=n, M=m)
    G = np.triu(W)
    np.testing.assert_allclose(gX, X @ (G + G.T), rtol=1e-12)
