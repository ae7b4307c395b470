"""The `remove_views` pass: views are composed onto the arrays they view, or become arrays of their own
(reshapes, strided operands of library nodes); the pass is pure."""

from __future__ import annotations

import dace
import numpy as np
import pytest

import gradflow
from gradflow.transforms.views import RemoveViews
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


@dace.program
def overlapping_update(X: dace.float64[2 * H], S: dace.float64[1]):
    X[0:H] -= X[1::2]
    S[0] = np.sum(X * X)


def test_a_copy_out_of_a_view_named_by_its_destination_keeps_the_viewed_subset() -> None:
    """`X[0:H] -= X[1::2]` copies the view `X[1::2]` into a temporary by a memlet that names only the
    temporary; composed, that copy must still read X[1::2] (not all of X: a copy of 2H elements into H,
    found by `gradflow fuzz` as a heap overflow)."""
    after = RemoveViews()(Graph.of(overlapping_update.to_sdfg(simplify=True))).unwrap()
    assert _views(after.sdfg) == 0
    X = np.random.default_rng(1).normal(size=10)
    arrays = {"X": X.copy(), "S": np.zeros(1)}
    compile_sdfg(after)(**arrays, H=5)
    want = X.copy()
    want[0:5] -= X[1::2]
    np.testing.assert_allclose(arrays["X"], want, rtol=1e-14)
    g = gradflow.grad(overlapping_update, wrt="X", of="S")
    arrays = {"X": X.copy(), "S": np.zeros(1), "grad_X": np.zeros(10)}
    compile_sdfg(Graph.adopt(g))(**arrays, H=5)
    expected = 2 * want  # d/dX of sum(Y^2), Y = X with Y[j] = X[j] - X[2j + 1] for j < 5
    expected[1::2] -= 2 * want[0:5]
    np.testing.assert_allclose(arrays["grad_X"], expected, rtol=1e-12)


N, M = dace.symbol("N"), dace.symbol("M")


@dace.program
def strided_product(A: dace.float64[2 * N, M], B: dace.float64[M, N], C: dace.float64[N, N]):
    C[:] = A[::2, :] @ B


@dace.program
def reshaped(A: dace.float64[N, M], C: dace.float64[M, N]):
    C[:] = np.reshape(A, (M, N)) * 2.0


def _library_steps(sdfg: dace.SDFG) -> list:
    return [e.data.subset for s in sdfg.states() for e in s.edges()
            if isinstance(e.dst, dace.nodes.LibraryNode) and any(step != 1 for _, _, step in e.data.subset)]


def test_strided_view_read_by_a_library_node_becomes_a_copy() -> None:
    """DaCe's BLAS expansions ignore a subset's step: composing `A[::2, :]` into the MatMul's memlet would
    make the product read the first N rows; the view becomes an array filled by a strided copy instead."""
    after = RemoveViews()(Graph.of(strided_product.to_sdfg(simplify=True))).unwrap()
    assert _views(after.sdfg) == 0 and _library_steps(after.sdfg) == []
    rng = np.random.default_rng(0)
    A, B, C = rng.normal(size=(8, 3)), rng.normal(size=(3, 4)), np.zeros((4, 4))
    compile_sdfg(after)(A=A, B=B, C=C, N=4, M=3)
    np.testing.assert_allclose(C, A[::2] @ B, rtol=1e-12)


def test_reshape_of_equal_rank_is_not_composed_as_a_slice() -> None:
    """(N, M) -> (M, N) has as many non-unit dimensions on both sides but is no slice: it becomes an array
    of its own, element k of one at element k of the other in row-major order."""
    after = RemoveViews()(Graph.of(reshaped.to_sdfg(simplify=True))).unwrap()
    assert _views(after.sdfg) == 0
    A, C = np.random.default_rng(1).normal(size=(3, 5)), np.zeros((5, 3))
    compile_sdfg(after)(A=A, C=C, N=3, M=5)
    np.testing.assert_allclose(C, A.reshape(5, 3) * 2.0, rtol=1e-14)


def _onnx_reshape_program():
    import dace.libraries.onnx as donnx

    @dace.program
    def onnx_reshape(inp: dace.float64[9], bias: dace.float64[3], target_shape: dace.int64[2], S: dace.float64[1]):
        out = dace.define_local([3, 3], dace.float64)
        donnx.ONNXReshape(data=inp, shape=target_shape, reshaped=out)
        S[0] = np.sum(np.log(out + bias + 1.0))

    return onnx_reshape


@pytest.mark.parametrize("expanded", [False, True])
def test_onnx_reshape_gradient(expanded: bool) -> None:
    """An upstream `ONNXReshape` node (expanded by gradflow, or already expanded with StateFusion applied, so
    that the reshape sits on the memlet path into the addition) differentiates like torch.reshape."""
    import torch
    from dace.transformation.interstate import StateFusion

    sdfg = _onnx_reshape_program().to_sdfg(simplify=False)
    if expanded:
        sdfg.expand_library_nodes()
    sdfg.apply_transformations_repeated([StateFusion])
    g = gradflow.grad(sdfg, wrt=["inp", "bias"], of="S")
    rng = np.random.default_rng(2)
    inp, bias = rng.uniform(0.0, 1.0, 9), rng.uniform(0.0, 1.0, 3)
    arrays = {"inp": inp.copy(), "bias": bias.copy(), "target_shape": np.array([3, 3], dtype=np.int64),
              "S": np.zeros(1), "grad_inp": np.zeros(9), "grad_bias": np.zeros(3)}
    compile_sdfg(Graph.adopt(g))(**arrays)
    t_inp, t_bias = (torch.tensor(x, requires_grad=True) for x in (inp, bias))
    out = torch.log(t_inp.reshape(3, 3) + t_bias + 1.0).sum()
    out.backward()
    np.testing.assert_allclose(arrays["S"][0], float(out), rtol=1e-12)
    np.testing.assert_allclose(arrays["grad_inp"], t_inp.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(arrays["grad_bias"], t_bias.grad.numpy(), rtol=1e-9, atol=1e-12)


@dace.program
def reshaped_partial_slice(A: dace.float64[N + 1, M], S: dace.float64[1]):
    r = np.reshape(A[1:, 1:], ((M - 1) * N,))
    S[0] = np.sum(r * r)


def test_reshape_of_a_partial_slice_is_rejected() -> None:
    """DaCe reads such a view as consecutive memory of A (not numpy's copy of the slice): no view to compose
    and no row-major block to copy, so the pass says which view it is rather than leave it to reverse mode."""
    with pytest.raises(gradflow.NotDifferentiableError, match="neither a slice of it nor a reshape"):
        gradflow.grad(reshaped_partial_slice, wrt="A", of="S")
