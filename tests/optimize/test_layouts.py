"""`column_layouts`: transient matrices that the loops walk down their columns are stored column-major,
and the program computes what it did (values and gradients against the unoptimized build)."""

from __future__ import annotations

import dace
import numpy as np

import gradflow
from gradflow.optimize import OPTIMIZE, ColumnLayouts, optimized
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
    graph = optimized(column_sweeps)
    assert tuple(map(str, graph.sdfg.arrays["B"].strides)) == ("1", "M")
    unchanged = optimized(column_sweeps, OPTIMIZE.without("column_layouts"))
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
    graph = ColumnLayouts()(optimized(column_dots, OPTIMIZE.without("column_layouts"))).unwrap()
    assert all(tuple(map(str, d.strides))[-1] == "1" for d in graph.sdfg.arrays.values() if len(d.shape) == 2)
