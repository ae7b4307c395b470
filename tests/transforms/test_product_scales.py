"""`fold_product_scales`: `(c * A) @ x` reads `A`, with the product's alpha times `c`; products whose
scaled operand is shared, or that DaCe computes without alpha (a dot product), are left alone. Values
and gradients are those of the program as written."""

from __future__ import annotations

import dace
import numpy as np
from dace.libraries.blas import MatMul

import gradflow
from gradflow.transforms.views import RemoveViews
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import optimized
from gradflow.transforms.product_scales import FoldProductScales, _candidates
from gradflow.runtime.compile import compile_sdfg

N, M = 6, 4


@dace.program
def scaled_products(A: dace.float64[N, M], B: dace.float64[M, N], x: dace.float64[M], w: dace.float64[N],
                    y: dace.float64[N], C: dace.float64[N, N]):
    y[:] = 1.5 * A @ x + w @ (-2 * B).T @ (A.T @ w)  # a Gemv and two products through transposes
    C[:] = (A * 0.5) @ B  # a Gemm, the factor on the right


@dace.program
def shared_scale(A: dace.float64[N, M], x: dace.float64[M], y: dace.float64[N], z: dace.float64[N, M]):
    T = 3.0 * A
    y[:] = T @ x
    z[:] = T  # the scaled matrix is read again: the map stays


@dace.program
def scaled_dot(a: dace.float64[M], b: dace.float64[M], out: dace.float64[1]):
    out[0] = (2.0 * a) @ b  # a dot product: DaCe's Dot has no alpha


@dace.program
def divided(A: dace.float64[N, M], x: dace.float64[M], y: dace.float64[N]):
    y[:] = (A / 4.0) @ x  # not a product with a constant: left alone


_FOLD = Pipeline((RemoveViews(), FoldProductScales()))


def _count(graph: Graph) -> int:
    return sum(len(_candidates(s)) for s in graph.sdfg.all_sdfgs_recursive())


def _alphas(graph: Graph) -> list:
    return sorted(n.alpha for n, _ in graph.sdfg.all_nodes_recursive() if isinstance(n, MatMul))


def test_constant_factors_move_into_the_products_and_values_stay() -> None:
    before = RemoveViews()(Graph.of(scaled_products)).unwrap()
    assert _count(before) == 2  # `1.5 * A` and `A * 0.5`; `-2 * B` reaches its product through a transpose
    after = optimized(scaled_products, _FOLD)
    assert _count(after) == 0 and _alphas(after).count(1.5) == 1 and _alphas(after).count(0.5) == 1
    assert len(after.sdfg.arrays) == len(before.sdfg.arrays) - 2  # the two scaled copies are gone
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((N, M)), rng.standard_normal((M, N))
    x, w = rng.standard_normal(M), rng.standard_normal(N)
    y, C = np.zeros(N), np.zeros((N, N))
    compile_sdfg(after)(A=A, B=B, x=x, w=w, y=y, C=C)
    np.testing.assert_allclose(y, 1.5 * A @ x + w @ (-2 * B).T @ (A.T @ w), rtol=1e-12)
    np.testing.assert_allclose(C, (A * 0.5) @ B, rtol=1e-12)


def test_shared_dot_and_divided_operands_are_left_alone() -> None:
    for program in (shared_scale, scaled_dot, divided):
        graph = RemoveViews()(Graph.of(program)).unwrap()
        assert _count(graph) == 0, program.name
        assert FoldProductScales()(graph).unwrap() is graph, program.name


@dace.program
def gesummv(A: dace.float64[N, N], B: dace.float64[N, N], x: dace.float64[N], ct: dace.float64[N],
            S: dace.float64[1]):
    S[0] = np.sum((1.5 * A @ x + 1.2 * B @ x) * ct)


def test_gradients_through_folded_products() -> None:
    sdfg = gradflow.grad(gesummv, wrt=["A", "B", "x"], of="S")
    assert sorted(n.alpha for n, _ in sdfg.all_nodes_recursive() if isinstance(n, MatMul)) == [1.2, 1.5]
    assert not any(d.transient and tuple(d.shape) == (N, N) for d in sdfg.arrays.values())  # no scaled copies
    rng = np.random.default_rng(1)
    A, B, x, ct = (rng.standard_normal(s) for s in ((N, N), (N, N), (N,), (N,)))
    grads = {"grad_A": np.full((N, N), np.nan), "grad_B": np.full((N, N), np.nan), "grad_x": np.full(N, np.nan)}
    compile_sdfg(sdfg)(A=A, B=B, x=x, ct=ct, S=np.zeros(1), **grads)
    np.testing.assert_allclose(grads["grad_A"], 1.5 * np.outer(ct, x), rtol=1e-12)
    np.testing.assert_allclose(grads["grad_B"], 1.2 * np.outer(ct, x), rtol=1e-12)
    np.testing.assert_allclose(grads["grad_x"], (1.5 * A + 1.2 * B).T @ ct, rtol=1e-12)
