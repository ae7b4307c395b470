"""`transient_layouts`: transient arrays that the loops walk along a dimension other than the last are laid
out along it, and the program computes what it did (values and gradients against the unoptimized build)."""

from __future__ import annotations

import dace
import numpy as np

import gradflow
from gradflow.optimize import OPTIMIZE, TransientLayouts, optimized
from gradflow.runtime.compile import compile_sdfg

M, N = dace.symbol("M"), dace.symbol("N")


@dace.program
def column_sweeps(A: dace.float64[M, N], S: dace.float64[1]):
    B = np.zeros((M, N), dtype=np.float64)
    for j in range(N):
        for i in dace.map[0:M]:
            B[i, j] = np.tanh(A[i, j]) + j
    for j in range(1, N):  # carried from column to column: stays a loop, walking B[:, j]
        B[:, j] += B[:, j - 1] * A[:, j]
    S[0] = np.sum(B * A)


@dace.program
def column_dots(A: dace.float64[M, N], S: dace.float64[1]):
    B = A * 2.0
    for j in range(1, N):
        B[:, j] += B[:, j - 1] * A[:, j]  # walks B's columns, as in column_sweeps, but
        S[0] += np.dot(B[:, j], B[:, j - 1])  # a library node reads B: its layout stays


def test_a_column_walked_transient_becomes_column_major() -> None:
    # `move_loops_into_maps` turns both column loops of this forward program into row maps around loops
    # (then B is walked along its rows); without it they walk B's columns, as a gradient's loops still do
    walking_columns = OPTIMIZE.without("move_loops_into_maps")
    graph = optimized(column_sweeps, walking_columns)
    assert tuple(map(str, graph.sdfg.arrays["B"].strides)) == ("1", "M")
    unchanged = optimized(column_sweeps, walking_columns.without("transient_layouts"))
    assert tuple(map(str, unchanged.sdfg.arrays["B"].strides)) == ("N", "1")
    rng = np.random.default_rng(5)
    A = rng.normal(size=(7, 5))
    got, want = np.zeros(1), np.zeros(1)
    compile_sdfg(graph)(A=A.copy(), S=got, M=7, N=5)
    compile_sdfg(column_sweeps.to_sdfg())(A=A.copy(), S=want, M=7, N=5)
    np.testing.assert_allclose(got, want, rtol=1e-14)


def test_gradients_through_column_major_buffers() -> None:
    grad = gradflow.grad(column_sweeps, wrt="A", of="S")
    assert any(tuple(map(str, d.strides)) == ("1", "M") for n, d in grad.arrays.items() if d.transient)
    plain = gradflow.grad(column_sweeps, wrt="A", of="S", optimize=False)
    A = np.random.default_rng(6).normal(size=(6, 9))
    results = []
    for program in (grad, plain):
        out = {"grad_A": np.zeros_like(A), "S": np.zeros(1)}
        compile_sdfg(program)(A=A.copy(), **out, M=6, N=9)
        results.append(out)
    for k in results[1]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-13, atol=1e-14, err_msg=k)


def test_library_node_operands_keep_their_layout() -> None:
    graph = TransientLayouts()(optimized(column_dots, OPTIMIZE.without("transient_layouts"))).unwrap()
    assert all(tuple(map(str, d.strides))[-1] == "1" for d in graph.sdfg.arrays.values() if len(d.shape) == 2)


K = dace.symbol("K")


@dace.program
def plane_sweep(A: dace.float64[M, N, K], S: dace.float64[1]):
    C = np.zeros((M, N, K), dtype=np.float64)
    C[:, :, 0] = A[:, :, 0]
    for k in range(1, K):  # planes C[:, :, k], as vadv's sweep: k becomes the slowest dimension
        C[:, :, k] = C[:, :, k - 1] * 0.5 + np.sin(A[:, :, k])
    S[0] = np.sum(C * A)


def test_planes_walked_in_a_loop_make_its_variable_the_slowest_dimension() -> None:
    graph = optimized(plane_sweep)
    assert tuple(map(str, graph.sdfg.arrays["C"].strides)) == ("N", "1", "M*N")
    grad = gradflow.grad(plane_sweep, wrt="A", of="S")
    plain = gradflow.grad(plane_sweep, wrt="A", of="S", optimize=False)
    A = np.random.default_rng(7).normal(size=(3, 5, 4))
    results = []
    for program in (grad, plain):
        out = {"grad_A": np.zeros_like(A), "S": np.zeros(1)}
        compile_sdfg(program)(A=A.copy(), **out, M=3, N=5, K=4)
        results.append(out)
    for k in results[1]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-13, atol=1e-14, err_msg=k)
