"""Programs built around one library node each, with torch references (see tests/verify/test_library.py).

Every program writes `S[0]`: the node's result weighted by a random array and summed. Sizes are symbols
so one compiled SDFG serves every drawn size; an input's shape may be an expression of them ("M+1").
Inputs of max/min cases are drawn from a few integers so that ties (split equally among the extremal
elements, as torch.amax does) are common. The product cases read and write subsets of larger arrays
(columns, rows, sub-blocks, a slice of a 3-D array, one element), as NPBench's kernels do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import dace
import numpy as np
import sympy
import torch
from dace.libraries.blas import Dot, Gemm, Gemv, MatMul

from gradflow.verify.corpus.case import BuiltProgram

N, M, K, B = (dace.symbol(s) for s in "NMKB")
f64 = dace.float64


@dataclasses.dataclass(frozen=True)
class LibCase:
    name: str
    node: str  # class name of the library node the case is about
    program: Any
    torch_fn: Callable[..., torch.Tensor]
    wrt: tuple[str, ...]
    shapes: dict[str, tuple[str, ...]]  # input name -> shape in symbol names
    symbols: tuple[str, ...]
    ties: bool = False

    def make_inputs(self, rng: np.random.Generator, sizes: dict[str, int]) -> dict[str, np.ndarray]:
        out = {}
        for name, shape in self.shapes.items():
            dims = tuple(int(sympy.sympify(s, locals=dict(sizes))) for s in shape)
            if self.ties and name != "W":
                out[name] = rng.integers(-2, 3, size=dims).astype(np.float64)
            else:
                out[name] = rng.normal(size=dims)
        return out


# --- Reduce ------------------------------------------------------------------------------------------------

@dace.program
def sum_all(A: f64[N, M], W: f64[1], S: f64[1]):
    S[0] = np.sum(np.sin(A)) * W[0]


@dace.program
def sum_axis0(A: f64[N, M], W: f64[M], S: f64[1]):
    r = np.sum(A, axis=0)
    S[0] = np.sum(r * r * W)


@dace.program
def sum_axes02(A: f64[N, M, K], W: f64[M], S: f64[1]):
    r = np.sum(A, axis=(0, 2))
    S[0] = np.sum(np.sin(r) * W)


@dace.program
def mean_axis1(A: f64[N, M], W: f64[N], S: f64[1]):
    r = np.mean(A, axis=1)
    S[0] = np.sum(r * W)


@dace.program
def max_axis1(A: f64[N, M], W: f64[N], S: f64[1]):
    r = np.max(A, axis=1)
    S[0] = np.sum(r * W)


@dace.program
def min_all(A: f64[N, M], W: f64[1], S: f64[1]):
    S[0] = np.min(A) * W[0]


@dace.program
def amax_axis0_keepdims(A: f64[N, M, K], W: f64[1, M, K], S: f64[1]):
    r = np.maximum.reduce(A, axis=0, keepdims=True)
    S[0] = np.sum(r * W)


@dace.program
def min_axes12(A: f64[N, M, K], W: f64[N], S: f64[1]):
    r = np.minimum.reduce(A, axis=(1, 2))
    S[0] = np.sum(r * W)


# --- matrix products ---------------------------------------------------------------------------------------

@dace.program
def matmul_mm(A: f64[N, K], X: f64[K, M], W: f64[N, M], S: f64[1]):
    C = A @ X
    S[0] = np.sum(C * W)


@dace.program
def matmul_transposed(A: f64[N, K], X: f64[M, K], W: f64[N, M], S: f64[1]):
    C = A @ X.T
    S[0] = np.sum(C * W)


@dace.program
def matmul_same(A: f64[N, N], W: f64[N, N], S: f64[1]):
    C = A @ A
    S[0] = np.sum(C * W)


@dace.program
def matmul_mv(A: f64[N, K], x: f64[K], W: f64[N], S: f64[1]):
    y = A @ x
    S[0] = np.sum(y * W)


@dace.program
def matmul_vm(x: f64[N], A: f64[N, K], W: f64[K], S: f64[1]):
    y = x @ A
    S[0] = np.sum(y * W)


@dace.program
def matmul_vv(x: f64[N], z: f64[N], W: f64[1], S: f64[1]):
    S[0] = (x @ z) * W[0]


@dace.program
def dot_vv(x: f64[N], z: f64[N], W: f64[1], S: f64[1]):
    S[0] = np.dot(x, z) * W[0]


@dace.program
def matmul_batched(A: f64[B, N, K], X: f64[B, K, M], W: f64[B, N, M], S: f64[1]):
    C = A @ X
    S[0] = np.sum(C * W)


@dace.program
def matmul_broadcast(A: f64[B, N, K], X: f64[K, M], W: f64[B, N, M], S: f64[1]):
    C = A @ X
    S[0] = np.sum(C * W)


# --- products on subsets of larger arrays -------------------------------------------------------------------

@dace.program
def dot_columns(A: f64[N, M + 1], W: f64[1], S: f64[1]):
    S[0] = np.dot(A[:, 0], A[:, M]) * W[0]


@dace.program
def matmul_row_col(A: f64[N, K], X: f64[K, M], W: f64[1], S: f64[1]):
    S[0] = (A[N - 1, :] @ X[:, 0]) * W[0]


@dace.program
def matmul_col_mat(A: f64[N, M + 1], W: f64[M], S: f64[1]):
    r = A[:, 0] @ A[:, 1:M + 1]
    S[0] = np.sum(r * W)


@dace.program
def matmul_slice3d(A: f64[B, N, K], X: f64[K, M], W: f64[N, M], S: f64[1]):
    C = A[B - 1, :, :] @ X
    S[0] = np.sum(C * W)




@dace.program
def matmul_strided_rows(A: f64[2 * N, K], X: f64[K, M], W: f64[N, M], S: f64[1]):
    C = A[1::2, :] @ X
    S[0] = np.sum(C * W)


def _arrays(name: str, shapes: dict) -> dace.SDFG:
    """An empty SDFG with float64 arguments of the given shapes."""
    sdfg = dace.SDFG(name)
    for array, shape in shapes.items():
        sdfg.add_array(array, shape, f64)
    return sdfg


def _wire(state: dace.SDFGState, node, reads: dict[str, str], writes: dict[str, str]) -> None:
    """Add library node `node` to `state`, reading and writing the memlets ("A[0:N, 1]") given per connector."""
    state.add_node(node)
    for conn, memlet in reads.items():
        state.add_edge(state.add_read(memlet.split("[")[0]), None, node, conn, dace.Memlet(memlet))
    for conn, memlet in writes.items():
        state.add_edge(node, conn, state.add_write(memlet.split("[")[0]), None, dace.Memlet(memlet))


def _weighted_sum(state: dace.SDFGState, array: str, ranges: dict[str, str], index: str) -> None:
    """S[0] += sum over `ranges` of array[index] * W[index], as one map."""
    state.add_mapped_tasklet("weigh", ranges, {"a": dace.Memlet(f"{array}[{index}]"), "w": dace.Memlet(f"W[{index}]")},
                             "s = a * w", {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)


def dot_into_element() -> dace.SDFG:
    """R[1, 2] = dot(A[:, 1], X[2, :]): a Dot whose operands are a column and a row and whose result is one
    element of a larger array (the other elements of R keep their values)."""
    sdfg = _arrays("dot_into_element", {"A": [N, 3], "X": [3, N], "R": [3, 3], "W": [3, 3], "S": [1]})
    state = sdfg.add_state("dot", is_start_block=True)
    _wire(state, Dot("dot"), {"_x": "A[0:N, 1]", "_y": "X[2, 0:N]"}, {"_result": "R[1, 2]"})
    _weighted_sum(sdfg.add_state_after(state, "total"), "R", {"i": "0:3", "j": "0:3"}, "i, j")
    return sdfg


def _gemv(beta: float, name: str) -> dace.SDFG:
    """Y[0:K, 2] = 1.5 * A[1:N+1, 2:K+2]^T @ X[1:N+1, 1] (+ beta * Y[0:K, 2]): a transposed sub-block of a
    larger matrix times a column, into a column of another matrix."""
    sdfg = _arrays(name, {"A": [N + 1, K + 2], "X": [N + 1, 2], "Y": [K, 3], "W": [K, 3], "S": [1]})
    state = sdfg.add_state("gemv", is_start_block=True)
    reads = {"_A": "A[1:N + 1, 2:K + 2]", "_x": "X[1:N + 1, 1]"}
    if beta:
        reads["_y"] = "Y[0:K, 2]"
    _wire(state, Gemv("gemv", transA=True, alpha=1.5, beta=beta), reads, {"_y": "Y[0:K, 2]"})
    _weighted_sum(sdfg.add_state_after(state, "total"), "Y", {"i": "0:K", "j": "0:3"}, "i, j")
    return sdfg


def gemv_transposed_slice() -> dace.SDFG:
    return _gemv(0, "gemv_transposed_slice")


def gemv_beta_inplace() -> dace.SDFG:
    return _gemv(0.5, "gemv_beta_inplace")


def matmul_outer_slices() -> dace.SDFG:
    """C = A[:, 0:1] @ X[K-1:K, :]: a MatMul of an N x 1 by a 1 x M slice, which DaCe computes as a Gemm of
    those two-dimensional subsets as they are (the frontend would read the slices as vectors and refuse)."""
    sdfg = _arrays("matmul_outer_slices", {"A": [N, K], "X": [K, M], "W": [N, M], "S": [1]})
    sdfg.add_array("C", [N, M], f64, transient=True)
    state = sdfg.add_state("outer", is_start_block=True)
    _wire(state, MatMul("outer"), {"_a": "A[0:N, 0:1]", "_b": "X[K - 1:K, 0:M]"}, {"_c": "C[0:N, 0:M]"})
    _weighted_sum(sdfg.add_state_after(state, "total"), "C", {"i": "0:N", "j": "0:M"}, "i, j")
    return sdfg


def gemm_subblocks() -> dace.SDFG:
    """C[1:N+1, 0:M] = 2 * A[1:K+1, 0:N]^T @ X[0:M, 1:K+1]^T: transposed sub-blocks in, a sub-block out."""
    sdfg = _arrays("gemm_subblocks", {"A": [K + 1, N + 1], "X": [M, K + 2], "C": [N + 1, M], "W": [N + 1, M],
                                      "S": [1]})
    state = sdfg.add_state("gemm", is_start_block=True)
    _wire(state, Gemm("gemm", transA=True, transB=True, alpha=2.0, beta=0, cin=False),
          {"_a": "A[1:K + 1, 0:N]", "_b": "X[0:M, 1:K + 1]"}, {"_c": "C[1:N + 1, 0:M]"})
    _weighted_sum(sdfg.add_state_after(state, "total"), "C", {"i": "0:N + 1", "j": "0:M"}, "i, j")
    return sdfg


def gemm_padded_operand() -> dace.SDFG:
    """C = T @ X with T a copy of A in a transient whose rows are padded (strides (K + 3, 1)): BLAS could
    read T, but a backward that stores T reads it through gradflow's map fallback for operands whose array
    is not packed (`_contract`); `STORE_ALL` rebuilds the copy into a packed buffer instead."""
    sdfg = _arrays("gemm_padded_operand", {"A": [N, K], "X": [K, M], "W": [N, M], "S": [1]})
    sdfg.add_array("T", [N, K], f64, strides=[K + 3, 1], total_size=N * (K + 3), transient=True)
    sdfg.add_array("C", [N, M], f64, transient=True)
    fill = sdfg.add_state("fill", is_start_block=True)
    fill.add_mapped_tasklet("fill", {"i": "0:N", "k": "0:K"}, {"a": dace.Memlet("A[i, k]")}, "t = a",
                            {"t": dace.Memlet("T[i, k]")}, external_edges=True)
    state = sdfg.add_state_after(fill, "gemm")
    _wire(state, Gemm("gemm", alpha=1, beta=0, cin=False), {"_a": "T[0:N, 0:K]", "_b": "X[0:K, 0:M]"},
          {"_c": "C[0:N, 0:M]"})
    _weighted_sum(sdfg.add_state_after(state, "total"), "C", {"i": "0:N", "j": "0:M"}, "i, j")
    return sdfg


def _dot_into_element(A, X, R, W):
    R = R.clone()
    R[1, 2] = torch.dot(A[:, 1], X[2, :])
    return _w(R, W)


def _gemv_ref(beta):
    def ref(A, X, Y, W):
        Y = Y.clone()
        Y[:, 2] = 1.5 * A[1:, 2:].T @ X[1:, 1] + beta * Y[:, 2]
        return _w(Y, W)
    return ref


def _gemm_subblocks(A, X, C, W):
    C = C.clone()
    C[1:, :] = 2.0 * A[1:, :-1].T @ X[:, 1:-1].T
    return _w(C, W)


# --- products (zeros common: ties draw integers in -2..2) ----------------------------------------------------

@dace.program
def prod_axis1(A: f64[N, M], W: f64[N], S: f64[1]):
    r = np.prod(A, axis=1)
    S[0] = np.sum(r * W)


@dace.program
def prod_all(A: f64[N, M], W: f64[1], S: f64[1]):
    S[0] = np.multiply.reduce(A, axis=None) * W[0]


# --- contractions ------------------------------------------------------------------------------------------

@dace.program
def tensordot_axes2(A: f64[N, M, K], X: f64[M, K], W: f64[N], S: f64[1]):
    C = np.tensordot(A, X, axes=([1, 2], [0, 1]))
    S[0] = np.sum(C * W)


@dace.program
def tensordot_axes1(A: f64[N, K], X: f64[K, M], W: f64[N, M], S: f64[1]):
    C = np.tensordot(A, X, axes=1)
    S[0] = np.sum(C * C * W)


@dace.program
def tensordot_permuted(A: f64[N, M, K], X: f64[B, K], W: f64[B, N, M], S: f64[1]):
    C = np.tensordot(A, X, axes=([2], [1]), out_axes=[2, 0, 1])  # out_axes: DaCe's extension
    S[0] = np.sum(C * W)


def _einsum_node(name: str, spec: str, operands: dict, result: tuple, alpha: float = 1.0):
    """An SDFG computing S[0] = sum(einsum(spec, operands...) * W) with DaCe's Einsum library node."""
    from dace.libraries.blas import Einsum

    def build() -> dace.SDFG:
        sdfg = dace.SDFG(name)
        for array, shape in operands.items():
            sdfg.add_array(array, list(shape), f64)
        sdfg.add_array("W", list(result), f64)
        sdfg.add_array("S", [1], f64)
        sdfg.add_transient("R", list(result), f64)
        state = sdfg.add_state("contract", is_start_block=True)
        node = Einsum("einsum")
        node.einsum_str = spec
        node.alpha = alpha
        state.add_node(node)
        for k, (array, shape) in reversed(list(enumerate(operands.items()))):  # edges out of connector order
            node.add_in_connector(f"in{k}")
            state.add_edge(state.add_read(array), None, node, f"in{k}",
                           dace.Memlet(f"{array}[{', '.join(f'0:{d}' for d in shape)}]"))
        node.add_out_connector("out")
        index = ", ".join(f"0:{d}" for d in result)
        state.add_edge(node, "out", state.add_write("R"), None, dace.Memlet(f"R[{index}]"))
        total = sdfg.add_state_after(state, "total")
        params = {f"__i{d}": f"0:{n}" for d, n in enumerate(result)}
        element = ", ".join(params)
        total.add_mapped_tasklet("t", params, {"r": dace.Memlet(f"R[{element}]"), "w": dace.Memlet(f"W[{element}]")},
                                 "s = r * w", {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")},
                                 external_edges=True)
        return sdfg

    build.__name__ = name
    return BuiltProgram(build, (*operands, "W", "S"))


einsum_matmul = _einsum_node("einsum_matmul", "ij,jk->ik", {"A": (N, K), "X": (K, M)}, (N, M), alpha=2.0)
einsum_chain = _einsum_node("einsum_chain", "ij,jk,kl->il", {"A": (N, K), "X": (K, M), "Y": (M, B)}, (N, B))


# --- transposes --------------------------------------------------------------------------------------------

@dace.program
def transpose_2d(A: f64[N, M], W: f64[M, N], S: f64[1]):
    T = np.transpose(A)
    S[0] = np.sum(T * W)


@dace.program
def transpose_3d(A: f64[N, M, K], W: f64[K, N, M], S: f64[1]):
    T = np.transpose(A, (2, 0, 1))
    S[0] = np.sum(T * W)


@dace.program
def transpose_of_a_slice(A: f64[3, N, M], W: f64[M, N], S: f64[1]):
    T = np.transpose(A[1])  # the node's memlet is A[1, 0:N, 0:M]: three dimensions for a matrix
    S[0] = np.sum(T * W)


@dace.program
def transpose_3d_of_a_slice(A: f64[2, N, M, K], W: f64[K, N, M], S: f64[1]):
    T = np.transpose(A[1], (2, 0, 1))
    S[0] = np.sum(T * W)


def _convolution(name: str, x_shape: list, f_shape: list, y_shape: list, strides, dilations,
                 squares: bool = False, pads=(0, 0)) -> BuiltProgram:
    """S = sum(conv(X, F) * W) through gradflow's `Convolution` node (`pads` zeros before X's rows and
    columns, as many after as the output's extent reaches), plus sum(X * X) with `squares` (so the input's
    gradient holds a value when the node's gradient adds to it)."""
    from gradflow.library.convolution import Convolution, wire

    def build() -> dace.SDFG:
        sdfg = _arrays(name, {"X": x_shape, "F": f_shape, "W": y_shape, "S": [1]})
        sdfg.add_transient("Y", y_shape, f64)
        state = sdfg.add_state("conv", is_start_block=True)
        index = lambda shape: ", ".join(f"0:{d}" for d in shape)  # noqa: E731
        wire(state, Convolution("conv", strides=strides, dilations=dilations, pads=pads),
             {"_x": dace.Memlet(f"X[{index(x_shape)}]"), "_w": dace.Memlet(f"F[{index(f_shape)}]")},
             ("_y", dace.Memlet(f"Y[{index(y_shape)}]")))
        total = sdfg.add_state_after(state, "total")
        _weighted_sum(total, "Y", {f"i{d}": f"0:{n}" for d, n in enumerate(y_shape)},
                      ", ".join(f"i{d}" for d in range(len(y_shape))))
        if squares:
            ranges = {f"j{d}": f"0:{n}" for d, n in enumerate(x_shape)}
            sdfg.add_state_after(total, "squares").add_mapped_tasklet(
                "square", ranges, {"x": dace.Memlet(f"X[{', '.join(ranges)}]")}, "s = x * x",
                {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)
        return sdfg

    build.__name__ = name
    return BuiltProgram(build, ("X", "F", "W", "S"))


# strided and dilated 3x2 kernel over a 7x8 input: a 3x6 output
conv_strided_dilated = _convolution("conv_strided_dilated", [N, 2, 7, 8], [3, 2, 3, 2], [N, 3, 3, 6], (2, 1), (1, 2))
# zeros around a 5x6 input (1 before and after its rows, 2 before its columns, none after), a 3x3 kernel with
# column stride 2: a 5x3 output whose windows leave the input on three sides
conv_padded = _convolution("conv_padded", [N, 2, 5, 6], [3, 2, 3, 3], [N, 3, 5, 3], (1, 2), (1, 1), squares=True,
                           pads=(1, 2))
# a 1x1 kernel with stride 1: the compiled kernel reads each image as its own unfolded matrix
conv_pointwise = _convolution("conv_pointwise", [N, 3, 4, 5], [2, 3, 1, 1], [N, 2, 4, 5], (1, 1), (1, 1),
                              squares=True)


def _w(expr, W):
    return (expr * W).sum()


# --- Gemm with beta: C = alpha * A @ B + beta * C, in place (built with the API) ----------------------------

def gemm_beta_inplace() -> dace.SDFG:
    sdfg = _arrays("gemm_beta_inplace", {"A": [N, K], "X": [K, M], "C": [N, M], "W": [N, M], "S": [1]})
    state = sdfg.add_state("gemm", is_start_block=True)
    _wire(state, Gemm("gemm", alpha=1.5, beta=0.5, cin=True),
          {"_a": "A[0:N, 0:K]", "_b": "X[0:K, 0:M]", "_c": "C[0:N, 0:M]"}, {"_c": "C[0:N, 0:M]"})
    _weighted_sum(sdfg.add_state_after(state, "total"), "C", {"i": "0:N", "j": "0:M"}, "i, j")
    return sdfg


CASES = [
    LibCase("sum_all", "Reduce", sum_all, lambda A, W: torch.sin(A).sum() * W[0], ("A", "W"),
            {"A": ("N", "M"), "W": ("1",)}, ("N", "M")),
    LibCase("sum_axis0", "Reduce", sum_axis0, lambda A, W: (A.sum(0) ** 2 * W).sum(), ("A", "W"),
            {"A": ("N", "M"), "W": ("M",)}, ("N", "M")),
    LibCase("sum_axes02", "Reduce", sum_axes02, lambda A, W: (torch.sin(A.sum((0, 2))) * W).sum(), ("A",),
            {"A": ("N", "M", "K"), "W": ("M",)}, ("N", "M", "K")),
    LibCase("mean_axis1", "Reduce", mean_axis1, lambda A, W: _w(A.mean(1), W), ("A", "W"),
            {"A": ("N", "M"), "W": ("N",)}, ("N", "M")),
    LibCase("max_axis1", "Reduce", max_axis1, lambda A, W: _w(torch.amax(A, 1), W), ("A", "W"),
            {"A": ("N", "M"), "W": ("N",)}, ("N", "M"), ties=True),
    LibCase("min_all", "Reduce", min_all, lambda A, W: torch.amin(A) * W[0], ("A",),
            {"A": ("N", "M"), "W": ("1",)}, ("N", "M"), ties=True),
    LibCase("amax_axis0_keepdims", "Reduce", amax_axis0_keepdims, lambda A, W: _w(torch.amax(A, 0, keepdim=True), W),
            ("A",), {"A": ("N", "M", "K"), "W": ("1", "M", "K")}, ("N", "M", "K"), ties=True),
    LibCase("min_axes12", "Reduce", min_axes12, lambda A, W: _w(torch.amin(A, (1, 2)), W), ("A",),
            {"A": ("N", "M", "K"), "W": ("N",)}, ("N", "M", "K"), ties=True),
    LibCase("matmul_mm", "MatMul", matmul_mm, lambda A, X, W: _w(A @ X, W), ("A", "X"),
            {"A": ("N", "K"), "X": ("K", "M"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("matmul_transposed", "MatMul", matmul_transposed, lambda A, X, W: _w(A @ X.T, W), ("A", "X"),
            {"A": ("N", "K"), "X": ("M", "K"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("matmul_same", "MatMul", matmul_same, lambda A, W: _w(A @ A, W), ("A",),
            {"A": ("N", "N"), "W": ("N", "N")}, ("N",)),
    LibCase("matmul_mv", "MatMul", matmul_mv, lambda A, x, W: _w(A @ x, W), ("A", "x"),
            {"A": ("N", "K"), "x": ("K",), "W": ("N",)}, ("N", "K")),
    LibCase("matmul_vm", "MatMul", matmul_vm, lambda x, A, W: _w(x @ A, W), ("x", "A"),
            {"x": ("N",), "A": ("N", "K"), "W": ("K",)}, ("N", "K")),
    LibCase("matmul_vv", "MatMul", matmul_vv, lambda x, z, W: (x @ z) * W[0], ("x", "z"),
            {"x": ("N",), "z": ("N",), "W": ("1",)}, ("N",)),
    LibCase("dot_vv", "Dot", dot_vv, lambda x, z, W: torch.dot(x, z) * W[0], ("x", "z"),
            {"x": ("N",), "z": ("N",), "W": ("1",)}, ("N",)),
    LibCase("matmul_batched", "MatMul", matmul_batched, lambda A, X, W: _w(A @ X, W), ("A", "X"),
            {"A": ("B", "N", "K"), "X": ("B", "K", "M"), "W": ("B", "N", "M")}, ("B", "N", "M", "K")),
    LibCase("matmul_broadcast", "MatMul", matmul_broadcast, lambda A, X, W: _w(A @ X, W), ("A", "X"),
            {"A": ("B", "N", "K"), "X": ("K", "M"), "W": ("B", "N", "M")}, ("B", "N", "M", "K")),
    LibCase("gemm_beta_inplace", "Gemm", BuiltProgram(gemm_beta_inplace, ("A", "X", "C", "W", "S")),
            lambda A, X, C, W: _w(1.5 * A @ X + 0.5 * C, W), ("A", "X", "C"),
            {"A": ("N", "K"), "X": ("K", "M"), "C": ("N", "M"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("dot_columns", "Dot", dot_columns, lambda A, W: torch.dot(A[:, 0], A[:, -1]) * W[0], ("A", "W"),
            {"A": ("N", "M+1"), "W": ("1",)}, ("N", "M")),
    LibCase("dot_into_element", "Dot", BuiltProgram(dot_into_element, ("A", "X", "R", "W", "S")), _dot_into_element,
            ("A", "X", "R"), {"A": ("N", "3"), "X": ("3", "N"), "R": ("3", "3"), "W": ("3", "3")}, ("N",)),
    LibCase("matmul_row_col", "MatMul", matmul_row_col, lambda A, X, W: (A[-1, :] @ X[:, 0]) * W[0], ("A", "X"),
            {"A": ("N", "K"), "X": ("K", "M"), "W": ("1",)}, ("N", "M", "K")),
    LibCase("matmul_col_mat", "MatMul", matmul_col_mat, lambda A, W: _w(A[:, 0] @ A[:, 1:], W), ("A",),
            {"A": ("N", "M+1"), "W": ("M",)}, ("N", "M")),
    LibCase("matmul_slice3d", "MatMul", matmul_slice3d, lambda A, X, W: _w(A[-1] @ X, W), ("A", "X"),
            {"A": ("B", "N", "K"), "X": ("K", "M"), "W": ("N", "M")}, ("B", "N", "M", "K")),
    LibCase("matmul_outer_slices", "MatMul", BuiltProgram(matmul_outer_slices, ("A", "X", "W", "S")),
            lambda A, X, W: _w(A[:, 0:1] @ X[-1:, :], W), ("A", "X"),
            {"A": ("N", "K"), "X": ("K", "M"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("matmul_strided_rows", "MatMul", matmul_strided_rows, lambda A, X, W: _w(A[1::2, :] @ X, W), ("A", "X"),
            {"A": ("2*N", "K"), "X": ("K", "M"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("gemv_transposed_slice", "Gemv", BuiltProgram(gemv_transposed_slice, ("A", "X", "Y", "W", "S")),
            _gemv_ref(0.0), ("A", "X", "Y"), {"A": ("N+1", "K+2"), "X": ("N+1", "2"), "Y": ("K", "3"), "W": ("K", "3")},
            ("N", "K")),
    LibCase("gemv_beta_inplace", "Gemv", BuiltProgram(gemv_beta_inplace, ("A", "X", "Y", "W", "S")),
            _gemv_ref(0.5), ("A", "X", "Y"), {"A": ("N+1", "K+2"), "X": ("N+1", "2"), "Y": ("K", "3"), "W": ("K", "3")},
            ("N", "K")),
    LibCase("gemm_subblocks", "Gemm", BuiltProgram(gemm_subblocks, ("A", "X", "C", "W", "S")), _gemm_subblocks,
            ("A", "X", "C"), {"A": ("K+1", "N+1"), "X": ("M", "K+2"), "C": ("N+1", "M"), "W": ("N+1", "M")},
            ("N", "M", "K")),
    LibCase("gemm_padded_operand", "Gemm", BuiltProgram(gemm_padded_operand, ("A", "X", "W", "S")),
            lambda A, X, W: _w(A @ X, W), ("A", "X"), {"A": ("N", "K"), "X": ("K", "M"), "W": ("N", "M")},
            ("N", "M", "K")),
    LibCase("conv_strided_dilated", "Convolution", conv_strided_dilated,
            lambda X, F, W: _w(torch.nn.functional.conv2d(X, F, stride=(2, 1), dilation=(1, 2)), W), ("X", "F"),
            {"X": ("N", "2", "7", "8"), "F": ("3", "2", "3", "2"), "W": ("N", "3", "3", "6")}, ("N",)),
    LibCase("conv_padded", "Convolution", conv_padded,
            lambda X, F, W: _w(torch.nn.functional.conv2d(torch.nn.functional.pad(X, (2, 0, 1, 1)), F, stride=(1, 2)),
                               W) + (X * X).sum(), ("X", "F"),
            {"X": ("N", "2", "5", "6"), "F": ("3", "2", "3", "3"), "W": ("N", "3", "5", "3")}, ("N",)),
    LibCase("conv_pointwise", "Convolution", conv_pointwise,
            lambda X, F, W: _w(torch.nn.functional.conv2d(X, F), W) + (X * X).sum(), ("X", "F"),
            {"X": ("N", "3", "4", "5"), "F": ("2", "3", "1", "1"), "W": ("N", "2", "4", "5")}, ("N",)),
    LibCase("transpose_2d", "Transpose", transpose_2d, lambda A, W: _w(A.T, W), ("A",),
            {"A": ("N", "M"), "W": ("M", "N")}, ("N", "M")),
    LibCase("transpose_3d", "TensorTranspose", transpose_3d, lambda A, W: _w(A.permute(2, 0, 1), W), ("A",),
            {"A": ("N", "M", "K"), "W": ("K", "N", "M")}, ("N", "M", "K")),
    LibCase("transpose_of_a_slice", "Transpose", transpose_of_a_slice, lambda A, W: _w(A[1].T, W), ("A",),
            {"A": ("3", "N", "M"), "W": ("M", "N")}, ("N", "M")),
    LibCase("transpose_3d_of_a_slice", "TensorTranspose", transpose_3d_of_a_slice,
            lambda A, W: _w(A[1].permute(2, 0, 1), W), ("A",),
            {"A": ("2", "N", "M", "K"), "W": ("K", "N", "M")}, ("N", "M", "K")),
    LibCase("prod_axis1", "Reduce", prod_axis1, lambda A, W: _w(A.prod(1), W), ("A", "W"),
            {"A": ("N", "M"), "W": ("N",)}, ("N", "M"), ties=True),
    LibCase("prod_all", "Reduce", prod_all, lambda A, W: A.prod() * W[0], ("A", "W"),
            {"A": ("N", "M"), "W": ("1",)}, ("N", "M"), ties=True),
    LibCase("tensordot_axes2", "TensorDot", tensordot_axes2,
            lambda A, X, W: _w(torch.tensordot(A, X, dims=([1, 2], [0, 1])), W), ("A", "X", "W"),
            {"A": ("N", "M", "K"), "X": ("M", "K"), "W": ("N",)}, ("N", "M", "K")),
    LibCase("tensordot_axes1", "TensorDot", tensordot_axes1,
            lambda A, X, W: _w(torch.tensordot(A, X, dims=1) ** 2, W), ("A", "X"),
            {"A": ("N", "K"), "X": ("K", "M"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("tensordot_permuted", "TensorDot", tensordot_permuted,
            lambda A, X, W: _w(torch.tensordot(A, X, dims=([2], [1])).permute(2, 0, 1), W), ("A", "X"),
            {"A": ("N", "M", "K"), "X": ("B", "K"), "W": ("B", "N", "M")}, ("B", "N", "M", "K")),
    LibCase("einsum_matmul", "Einsum", einsum_matmul, lambda A, X, W: _w(2.0 * torch.einsum("ij,jk->ik", A, X), W),
            ("A", "X"), {"A": ("N", "K"), "X": ("K", "M"), "W": ("N", "M")}, ("N", "M", "K")),
    LibCase("einsum_chain", "Einsum", einsum_chain, lambda A, X, Y, W: _w(torch.einsum("ij,jk,kl->il", A, X, Y), W),
            ("A", "X", "Y"), {"A": ("N", "K"), "X": ("K", "M"), "Y": ("M", "B"), "W": ("N", "B")}, ("N", "M", "K", "B")),
]
CASES_BY_NAME = {c.name: c for c in CASES}
