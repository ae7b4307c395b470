"""NPBench AD corpus: the 37 NPBench kernels that upstream DaCe's AD suite differentiates
(`tests/npbench/**` of spcl/dace, each with a `test_autodiff`), at small sizes, in float64.

Each kernel keeps NPBench's structure (loops, slices, matrix products on slices, in-place updates,
helper programs for the deep-learning kernels) and ends by writing a scalar summary of its outputs into
the one-element array `S` (`of`): `np.sum(x * ct_x)` over its outputs x, with random cotangents `ct_*`
(program inputs), so the gradient is a vector-Jacobian product with a random vector rather than the
all-ones one of a plain sum. Two shapes are avoided because upstream's AD fails on them for reasons
unrelated to the kernels, which would hide its other results: a sum of squares (`x * x`, a map reading
one array twice) and an array named `out` (it clashes with a connector of DaCe's pure BLAS expansions).
`wrt` is what upstream's `test_autodiff` differentiates with respect to. NPBench's scalar parameters
(alpha, beta, dt, ...) are module constants; time-step counts are symbols. See `case.py` for the
conventions of `Case`; torch references never write into a tensor autograd may have saved (`setitem`,
lists of 0-d tensors).

Deviations from NPBench are stated in each kernel's comment.
"""

from __future__ import annotations

import dace
import numpy as np
import torch
import torch.nn.functional as F

from gradflow.verify.corpus import loops
from gradflow.verify.corpus.case import Case, element_rows, list_dot, setitem, stack_rows
from gradflow.verify.corpus.case import normal_inputs as _inputs

f64 = dace.float64

N, M, K, T = (dace.symbol(s) for s in ("N", "M", "K", "T"))
NI, NJ, NK, NL, NM = (dace.symbol(s) for s in ("NI", "NJ", "NK", "NL", "NM"))
NR, NQ, NP = (dace.symbol(s) for s in ("NR", "NQ", "NP"))
I, J, H, W = (dace.symbol(s) for s in ("I", "J", "H", "W"))
C_in, C_out, C1, C2 = (dace.symbol(s) for s in ("C_in", "C_out", "C1", "C2"))
S0, S1, S2 = (dace.symbol(s) for s in ("S0", "S1", "S2"))
NX, NY, NIT, SM, CB = (dace.symbol(s) for s in ("NX", "NY", "NIT", "SM", "CB"))
D0, D1, D2, D3, D4, D5 = (dace.symbol(s) for s in ("D0", "D1", "D2", "D3", "D4", "D5"))  # helper programs

ALPHA = 1.5
BETA = 1.2


def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float64)


def _wsum(x: torch.Tensor, ct: torch.Tensor) -> torch.Tensor:
    """The summary `np.sum(x * ct)`: a vector-Jacobian product with the random cotangent `ct`."""
    return (x * ct).sum()


def _with(fn, **bound):
    """Bind sizes that are DaCe symbols (time steps, iteration counts) into a torch reference."""

    def ref(**kw):
        return fn(**bound, **kw)

    ref.__name__ = fn.__name__
    return ref


# ----------------------------------------------------------------------------------------------------------
# atax: y = (A x) A


@dace.program
def nb_atax(A: f64[M, N], x: f64[N], ct_y: f64[N], S: f64[1]):
    y = (A @ x) @ A
    S[0] = np.sum(y * ct_y)


def _t_atax(A, x, ct_y, **_):
    return _wsum((A @ x) @ A, ct_y)


# ----------------------------------------------------------------------------------------------------------
# bicg: s = r A, q = A p (both outputs summarised; upstream sums q only)


@dace.program
def nb_bicg(A: f64[N, M], p: f64[M], r: f64[N], ct_s: f64[M], ct_q: f64[N], S: f64[1]):
    s = r @ A
    q = A @ p
    S[0] = np.sum(s * ct_s) + np.sum(q * ct_q)


def _t_bicg(A, p, r, ct_s, ct_q, **_):
    return _wsum(r @ A, ct_s) + _wsum(A @ p, ct_q)


# ----------------------------------------------------------------------------------------------------------
# gemm: C = alpha A B + beta C, in place


@dace.program
def nb_gemm(C: f64[NI, NJ], A: f64[NI, NK], B: f64[NK, NJ], ct_C: f64[NI, NJ], S: f64[1]):
    C[:] = ALPHA * A @ B + BETA * C
    S[0] = np.sum(C * ct_C)


def _t_gemm(C, A, B, ct_C, **_):
    return _wsum(ALPHA * A @ B + BETA * C, ct_C)


# ----------------------------------------------------------------------------------------------------------
# gemver: rank-2 update of A, then two matrix-vector products, all in place


@dace.program
def nb_gemver(A: f64[N, N], u1: f64[N], v1: f64[N], u2: f64[N], v2: f64[N], w: f64[N], x: f64[N], y: f64[N],
              z: f64[N], ct_w: f64[N], S: f64[1]):
    A += np.multiply.outer(u1, v1) + np.multiply.outer(u2, v2)
    x += BETA * y @ A + z
    w += ALPHA * A @ x
    S[0] = np.sum(w * ct_w)


def _t_gemver(A, u1, v1, u2, v2, w, x, y, z, ct_w, **_):
    A = A + torch.outer(u1, v1) + torch.outer(u2, v2)
    x = x + BETA * y @ A + z
    return _wsum(w + ALPHA * A @ x, ct_w)


# ----------------------------------------------------------------------------------------------------------
# gesummv: alpha A x + beta B x


@dace.program
def nb_gesummv(A: f64[N, N], B: f64[N, N], x: f64[N], ct_res: f64[N], S: f64[1]):
    res = ALPHA * A @ x + BETA * B @ x
    S[0] = np.sum(res * ct_res)


def _t_gesummv(A, B, x, ct_res, **_):
    return _wsum(ALPHA * A @ x + BETA * B @ x, ct_res)


# ----------------------------------------------------------------------------------------------------------
# k2mm: D = alpha A B C + beta D, in place


@dace.program
def nb_k2mm(A: f64[NI, NK], B: f64[NK, NJ], C: f64[NJ, NL], D: f64[NI, NL], ct_D: f64[NI, NL], S: f64[1]):
    D[:] = ALPHA * A @ B @ C + BETA * D
    S[0] = np.sum(D * ct_D)


def _t_k2mm(A, B, C, D, ct_D, **_):
    return _wsum(ALPHA * A @ B @ C + BETA * D, ct_D)


# ----------------------------------------------------------------------------------------------------------
# k3mm: A B C D


@dace.program
def nb_k3mm(A: f64[NI, NK], B: f64[NK, NJ], C: f64[NJ, NM], D: f64[NM, NL], ct_E: f64[NI, NL], S: f64[1]):
    E = A @ B @ C @ D
    S[0] = np.sum(E * ct_E)


def _t_k3mm(A, B, C, D, ct_E, **_):
    return _wsum(A @ B @ C @ D, ct_E)


# ----------------------------------------------------------------------------------------------------------
# mvt: x1 += A y1, x2 += y2 A


@dace.program
def nb_mvt(x1: f64[N], x2: f64[N], y_1: f64[N], y_2: f64[N], A: f64[N, N], ct_x1: f64[N], ct_x2: f64[N],
           S: f64[1]):
    x1 += A @ y_1
    x2 += y_2 @ A
    S[0] = np.sum(x1 * ct_x1) + np.sum(x2 * ct_x2)


def _t_mvt(x1, x2, y_1, y_2, A, ct_x1, ct_x2, **_):
    return _wsum(x1 + A @ y_1, ct_x1) + _wsum(x2 + y_2 @ A, ct_x2)


# ----------------------------------------------------------------------------------------------------------
# doitgen: for each r, A[r] = A[r] C4 through reshapes (NPBench's DaCe form: a loop, since MatMul of rank > 3
# is not supported)


@dace.program
def nb_doitgen(A: f64[NR, NQ, NP], C4: f64[NP, NP], ct_A: f64[NR, NQ, NP], S: f64[1]):
    for r in range(NR):
        A[r, :, :] = np.reshape(np.reshape(A[r], (NQ, NP)) @ C4, (NQ, NP))
    S[0] = np.sum(A * ct_A)


def _t_doitgen(A, C4, ct_A, **_):
    return _wsum(torch.stack([A[r] @ C4 for r in range(A.shape[0])]), ct_A)


# ----------------------------------------------------------------------------------------------------------
# go_fast: tanh of the trace by a scalar loop, added to the matrix


@dace.program
def nb_go_fast(a: f64[N, N], ct_res: f64[N, N], S: f64[1]):
    trace = 0.0
    for i in range(N):
        trace += np.tanh(a[i, i])
    res = a + trace
    S[0] = np.sum(res * ct_res)


def _t_go_fast(a, ct_res, **_):
    trace = torch.zeros((), dtype=torch.float64)
    for i in range(a.shape[0]):
        trace = trace + torch.tanh(a[i, i])
    return _wsum(a + trace, ct_res)


# ----------------------------------------------------------------------------------------------------------
# cholesky: in place, dot products of row slices (NPBench's DaCe form): the loop corpus's
# `lp_cholesky_dot`, whose cotangent is named W (deviation from the `ct_*` names)


def _spd(rng, n):
    """A well-conditioned symmetric positive definite matrix."""
    B = rng.normal(size=(n, n))
    return B @ B.T / n + np.eye(n)


def _i_cholesky(rng):
    return {"A": _spd(rng, 6), "W": rng.normal(size=(6, 6)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# lu: in place, row-slice times column-slice products: the loop corpus's `lp_lu_slices` (cotangent W);
# the element-wise reference below serves ludcmp


def _t_lu_rows(A):
    n = A.shape[0]
    a = element_rows(A)
    for i in range(n):
        for j in range(i):
            a[i][j] = (a[i][j] - list_dot(a[i][:j], [a[k][j] for k in range(j)])) / a[j][j]
        for j in range(i, n):
            a[i][j] = a[i][j] - list_dot(a[i][:i], [a[k][j] for k in range(i)])
    return a


def _dominant(rng, n):
    """A diagonally dominant matrix: stable pivots without pivoting."""
    return rng.normal(size=(n, n)) * 0.5 + np.diag(np.full(n, 3.0))


def _i_lu(rng):
    return {"A": _dominant(rng, 6), "W": rng.normal(size=(6, 6)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# ludcmp: lu, then forward and backward substitution with slice products (x and y summarised)


@dace.program
def nb_ludcmp(A: f64[N, N], b: f64[N], ct_x: f64[N], ct_y: f64[N], S: f64[1]):
    x = np.zeros_like(b)
    y = np.zeros_like(b)
    for i in range(N):
        for j in range(i):
            A[i, j] -= A[i, :j] @ A[:j, j]
            A[i, j] /= A[j, j]
        for j in range(i, N):
            A[i, j] -= A[i, :i] @ A[:i, j]
    for i in range(N):
        y[i] = b[i] - A[i, :i] @ y[:i]
    for i in range(N - 1, -1, -1):
        x[i] = (y[i] - A[i, i + 1:] @ x[i + 1:]) / A[i, i]
    S[0] = np.sum(x * ct_x) + np.sum(y * ct_y)


def _t_ludcmp(A, b, ct_x, ct_y, **_):
    n = A.shape[0]
    a = _t_lu_rows(A)
    y: list[torch.Tensor] = []
    for i in range(n):
        y.append(b[i] - list_dot(a[i][:i], y[:i]))
    x: list[torch.Tensor] = [torch.zeros((), dtype=torch.float64)] * n
    for i in range(n - 1, -1, -1):
        x[i] = (y[i] - list_dot(a[i][i + 1:], x[i + 1:])) / a[i][i]
    return _wsum(torch.stack(x), ct_x) + _wsum(torch.stack(y), ct_y)


def _i_ludcmp(rng):
    return {"A": _dominant(rng, 6), "b": rng.normal(size=6), "ct_x": rng.normal(size=6), "ct_y": rng.normal(size=6),
            "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# trisolv: forward substitution, a row slice times the solved prefix of x


@dace.program
def nb_trisolv(L: f64[N, N], x: f64[N], b: f64[N], ct_x: f64[N], S: f64[1]):
    for i in range(N):
        x[i] = (b[i] - L[i, :i] @ x[:i]) / L[i, i]
    S[0] = np.sum(x * ct_x)


def _t_trisolv(L, b, ct_x, **_):
    x: list[torch.Tensor] = []
    for i in range(L.shape[0]):
        x.append((b[i] - list_dot([L[i, j] for j in range(i)], x)) / L[i, i])
    return _wsum(torch.stack(x), ct_x)


def _i_trisolv(rng):
    n = 7
    L = np.tril(rng.normal(size=(n, n)) * 0.3) + np.diag(rng.uniform(1.5, 2.5, n))
    return {"L": L, "x": _z(n), "b": rng.normal(size=n), "ct_x": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# durbin: Levinson-Durbin with NPBench's `flip` helper program (a map), dot product and in-place y[:k] update


@dace.program
def _flip(A: f64[M]):
    B = np.ndarray((M,), dtype=np.float64)
    for i in dace.map[0:M]:
        B[i] = A[M - 1 - i]
    return B


@dace.program
def nb_durbin(r: f64[N], ct_y: f64[N], S: f64[1]):
    y = np.empty_like(r)
    alpha = -r[0]
    beta = 1.0
    y[0] = -r[0]
    for k in range(1, N):
        beta *= 1.0 - alpha * alpha
        alpha = -(r[k] + np.dot(_flip(r[:k]), y[:k])) / beta
        y[:k] += alpha * _flip(y[:k])
        y[k] = alpha
    S[0] = np.sum(y * ct_y)


def _t_durbin(r, ct_y, **_):
    n = r.shape[0]
    y = setitem(torch.zeros(n, dtype=torch.float64), 0, -r[0])
    alpha = -r[0]
    beta = torch.ones((), dtype=torch.float64)
    for k in range(1, n):
        beta = beta * (1.0 - alpha * alpha)
        alpha = -(r[k] + torch.dot(torch.flip(r[:k], (0,)), y[:k])) / beta
        y = setitem(y, slice(0, k), y[:k] + alpha * torch.flip(y[:k], (0,)))
        y = setitem(y, k, alpha)
    return _wsum(y, ct_y)


def _i_durbin(rng):
    n = 8
    return {"r": rng.uniform(-0.3, 0.3, n), "ct_y": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# gramschmidt: modified Gram-Schmidt on columns, in place on A; Q, R and the final A are summarised.


@dace.program
def nb_gramschmidt(A: f64[M, N], ct_Q: f64[M, N], ct_R: f64[N, N], ct_A: f64[M, N], S: f64[1]):
    Q = np.zeros_like(A)
    R = np.zeros((N, N), dtype=A.dtype)
    for k in range(N):
        nrm = np.dot(A[:, k], A[:, k])
        R[k, k] = np.sqrt(nrm)
        Q[:, k] = A[:, k] / R[k, k]
        for j in range(k + 1, N):
            R[k, j] = np.dot(Q[:, k], A[:, j])
            A[:, j] -= Q[:, k] * R[k, j]
    S[0] = np.sum(Q * ct_Q) + np.sum(R * ct_R) + np.sum(A * ct_A)


def _t_gramschmidt(A, ct_Q, ct_R, ct_A, **_):
    n = A.shape[1]
    cols = list(A.unbind(1))
    q: list[torch.Tensor] = []
    r_sum = torch.zeros((), dtype=torch.float64)  # sum(R * ct_R), R upper triangular
    for k in range(n):
        rkk = torch.sqrt(torch.dot(cols[k], cols[k]))
        q.append(cols[k] / rkk)
        r_sum = r_sum + rkk * ct_R[k, k]
        for j in range(k + 1, n):
            rkj = torch.dot(q[k], cols[j])
            r_sum = r_sum + rkj * ct_R[k, j]
            cols[j] = cols[j] - q[k] * rkj
    return _wsum(torch.stack(q, 1), ct_Q) + r_sum + _wsum(torch.stack(cols, 1), ct_A)


# ----------------------------------------------------------------------------------------------------------
# symm: C = alpha A B + beta C with A symmetric (lower part read), column-slice updates and slice products


@dace.program
def nb_symm(C: f64[M, N], A: f64[M, M], B: f64[M, N], ct_C: f64[M, N], S: f64[1]):
    temp2 = np.empty((N,), dtype=C.dtype)
    C *= BETA
    for i in range(M):
        for j in range(N):
            C[:i, j] += ALPHA * B[i, j] * A[i, :i]
            temp2[j] = B[:i, j] @ A[i, :i]
        C[i, :] += ALPHA * B[i, :] * A[i, i] + ALPHA * temp2
    S[0] = np.sum(C * ct_C)


def _t_symm(C, A, B, ct_C, **_):
    m, n = C.shape
    C = C * BETA
    for i in range(m):
        temp2 = []
        for j in range(n):
            C = setitem(C, (slice(0, i), j), C[:i, j] + ALPHA * B[i, j] * A[i, :i])
            temp2.append(list_dot(list(B[:i, j].unbind()), list(A[i, :i].unbind())))
        C = setitem(C, i, C[i, :] + ALPHA * B[i, :] * A[i, i] + ALPHA * torch.stack(temp2))
    return _wsum(C, ct_C)


# ----------------------------------------------------------------------------------------------------------
# syr2k / syrk: lower-triangular rank-2k / rank-k updates, row prefixes C[i, :i+1] updated in place


@dace.program
def nb_syr2k(C: f64[N, N], A: f64[N, M], B: f64[N, M], ct_C: f64[N, N], S: f64[1]):
    for i in range(N):
        C[i, :i + 1] *= BETA
        for k in range(M):
            C[i, :i + 1] += A[:i + 1, k] * ALPHA * B[i, k] + B[:i + 1, k] * ALPHA * A[i, k]
    S[0] = np.sum(C * ct_C)


def _t_syr2k(C, A, B, ct_C, **_):
    n, m = A.shape
    for i in range(n):
        row = C[i, :i + 1] * BETA
        for k in range(m):
            row = row + A[:i + 1, k] * ALPHA * B[i, k] + B[:i + 1, k] * ALPHA * A[i, k]
        C = setitem(C, (i, slice(0, i + 1)), row)
    return _wsum(C, ct_C)


@dace.program
def nb_syrk(C: f64[N, N], A: f64[N, M], ct_C: f64[N, N], S: f64[1]):
    for i in range(N):
        C[i, :i + 1] *= BETA
        for k in range(M):
            C[i, :i + 1] += ALPHA * A[i, k] * A[:i + 1, k]
    S[0] = np.sum(C * ct_C)


def _t_syrk(C, A, ct_C, **_):
    n, m = A.shape
    for i in range(n):
        row = C[i, :i + 1] * BETA
        for k in range(m):
            row = row + ALPHA * A[i, k] * A[:i + 1, k]
        C = setitem(C, (i, slice(0, i + 1)), row)
    return _wsum(C, ct_C)


# ----------------------------------------------------------------------------------------------------------
# trmm: B = alpha A^T B with A unit lower triangular, dot products of column suffixes, in place


@dace.program
def nb_trmm(A: f64[M, M], B: f64[M, N], ct_B: f64[M, N], S: f64[1]):
    for i in range(M):
        for j in range(N):
            B[i, j] += np.dot(A[i + 1:, i], B[i + 1:, j])
    B *= ALPHA
    S[0] = np.sum(B * ct_B)


def _t_trmm(A, B, ct_B, **_):
    m, n = B.shape
    b = element_rows(B)
    for i in range(m):
        for j in range(n):
            b[i][j] = b[i][j] + list_dot([A[k, i] for k in range(i + 1, m)], [b[k][j] for k in range(i + 1, m)])
    return _wsum(stack_rows(b) * ALPHA, ct_B)


# ----------------------------------------------------------------------------------------------------------
# covariance / correlation: column statistics, in-place centring of `data`, triangular products of column
# slices mirrored by `cov[i:M, i] = cov[i, i:M]`. float_n = N as in NPBench (a float of the symbol).


@dace.program
def nb_covariance(data: f64[N, M], ct_cov: f64[M, M], S: f64[1]):
    float_n = np.float64(N)
    mean = np.mean(data, axis=0)
    np.subtract(data, mean, out=data)
    cov = np.zeros((M, M), dtype=data.dtype)
    for i in range(M):
        cov[i, i:M] = data[:, i] @ data[:, i:M] / (float_n - 1.0)
        cov[i:M, i] = cov[i, i:M]
    S[0] = np.sum(cov * ct_cov)


def _t_covariance(data, ct_cov, **_):
    n = data.shape[0]
    d = data - data.mean(0)
    return _wsum(d.T @ d / (n - 1.0), ct_cov)


@dace.program
def nb_correlation(data: f64[N, M], ct_corr: f64[M, M], S: f64[1]):
    float_n = np.float64(N)
    mean = np.mean(data, axis=0)
    stddev = np.sqrt(np.mean(np.subtract(data, mean) ** 2, axis=0))
    stddev[stddev <= 0.1] = 1.0
    np.subtract(data, mean, out=data)
    np.divide(data, np.sqrt(float_n) * stddev, out=data)
    corr = np.eye(M, dtype=data.dtype)
    for i in range(M - 1):
        corr[i, i + 1:M] = data[:, i] @ data[:, i + 1:M]
        corr[i + 1:M, i] = corr[i, i + 1:M]
    S[0] = np.sum(corr * ct_corr)


def _t_correlation(data, ct_corr, **_):
    n, m = data.shape
    mean = data.mean(0)
    stddev = torch.sqrt(((data - mean) ** 2).mean(0))
    stddev = torch.where(stddev <= 0.1, torch.ones_like(stddev), stddev)
    d = (data - mean) / (np.sqrt(float(n)) * stddev)
    eye = torch.eye(m, dtype=torch.float64)
    corr = (d.T @ d) * (1.0 - eye) + eye  # the diagonal stays 1 (np.eye)
    return _wsum(corr, ct_corr)


def _i_correlation(rng):
    n, m = 8, 5
    data = rng.normal(size=(n, m))
    data[:, 1] = 2.0 + 0.01 * rng.normal(size=n)  # a near-constant column: stddev <= 0.1 takes the mask branch
    return {"data": data, "ct_corr": rng.normal(size=(m, m)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# Stencils in a time loop: jacobi_1d, jacobi_2d, heat_3d (ping-pong between A and B, `range(1, T)` as NPBench),
# seidel_2d (vectorised row update then an in-place sweep along the row), fdtd_2d (in-place field updates
# driven by `fict`, NPBench's `_fict_`).


@dace.program
def nb_jacobi_1d(A: f64[N], B: f64[N], ct_A: f64[N], ct_B: f64[N], S: f64[1]):
    for t in range(1, T):
        B[1:-1] = 0.33333 * (A[:-2] + A[1:-1] + A[2:])
        A[1:-1] = 0.33333 * (B[:-2] + B[1:-1] + B[2:])
    S[0] = np.sum(A * ct_A) + np.sum(B * ct_B)


def _t_jacobi_1d(A, B, ct_A, ct_B, T, **_):
    for _t in range(1, T):
        B = setitem(B, slice(1, -1), 0.33333 * (A[:-2] + A[1:-1] + A[2:]))
        A = setitem(A, slice(1, -1), 0.33333 * (B[:-2] + B[1:-1] + B[2:]))
    return _wsum(A, ct_A) + _wsum(B, ct_B)


@dace.program
def nb_jacobi_2d(A: f64[N, N], B: f64[N, N], ct_A: f64[N, N], ct_B: f64[N, N], S: f64[1]):
    for t in range(1, T):
        B[1:-1, 1:-1] = 0.2 * (A[1:-1, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:] + A[2:, 1:-1] + A[:-2, 1:-1])
        A[1:-1, 1:-1] = 0.2 * (B[1:-1, 1:-1] + B[1:-1, :-2] + B[1:-1, 2:] + B[2:, 1:-1] + B[:-2, 1:-1])
    S[0] = np.sum(A * ct_A) + np.sum(B * ct_B)


def _jacobi_2d_step(A):
    return 0.2 * (A[1:-1, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:] + A[2:, 1:-1] + A[:-2, 1:-1])


def _t_jacobi_2d(A, B, ct_A, ct_B, T, **_):
    inner = (slice(1, -1), slice(1, -1))
    for _t in range(1, T):
        B = setitem(B, inner, _jacobi_2d_step(A))
        A = setitem(A, inner, _jacobi_2d_step(B))
    return _wsum(A, ct_A) + _wsum(B, ct_B)


@dace.program
def nb_heat_3d(A: f64[N, N, N], B: f64[N, N, N], ct_A: f64[N, N, N], ct_B: f64[N, N, N], S: f64[1]):
    for t in range(1, T):
        B[1:-1, 1:-1, 1:-1] = (
            0.125 * (A[2:, 1:-1, 1:-1] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[:-2, 1:-1, 1:-1])
            + 0.125 * (A[1:-1, 2:, 1:-1] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[1:-1, :-2, 1:-1])
            + 0.125 * (A[1:-1, 1:-1, 2:] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[1:-1, 1:-1, 0:-2])
            + A[1:-1, 1:-1, 1:-1])
        A[1:-1, 1:-1, 1:-1] = (
            0.125 * (B[2:, 1:-1, 1:-1] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[:-2, 1:-1, 1:-1])
            + 0.125 * (B[1:-1, 2:, 1:-1] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[1:-1, :-2, 1:-1])
            + 0.125 * (B[1:-1, 1:-1, 2:] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[1:-1, 1:-1, 0:-2])
            + B[1:-1, 1:-1, 1:-1])
    S[0] = np.sum(A * ct_A) + np.sum(B * ct_B)


def _heat_step(A):
    c = A[1:-1, 1:-1, 1:-1]
    return (0.125 * (A[2:, 1:-1, 1:-1] - 2.0 * c + A[:-2, 1:-1, 1:-1])
            + 0.125 * (A[1:-1, 2:, 1:-1] - 2.0 * c + A[1:-1, :-2, 1:-1])
            + 0.125 * (A[1:-1, 1:-1, 2:] - 2.0 * c + A[1:-1, 1:-1, :-2]) + c)


def _t_heat_3d(A, B, ct_A, ct_B, T, **_):
    inner = (slice(1, -1),) * 3
    for _t in range(1, T):
        B = setitem(B, inner, _heat_step(A))
        A = setitem(A, inner, _heat_step(B))
    return _wsum(A, ct_A) + _wsum(B, ct_B)


@dace.program
def nb_seidel_2d(A: f64[N, N], ct_A: f64[N, N], S: f64[1]):
    for t in range(0, T - 1):
        for i in range(1, N - 1):
            A[i, 1:-1] += (A[i - 1, :-2] + A[i - 1, 1:-1] + A[i - 1, 2:] + A[i, 2:] + A[i + 1, :-2]
                           + A[i + 1, 1:-1] + A[i + 1, 2:])
            for j in range(1, N - 1):
                A[i, j] += A[i, j - 1]
                A[i, j] /= 9.0
    S[0] = np.sum(A * ct_A)


def _t_seidel_2d(A, ct_A, T, **_):
    n = A.shape[0]
    for _t in range(T - 1):
        for i in range(1, n - 1):
            row = A[i, 1:-1] + (A[i - 1, :-2] + A[i - 1, 1:-1] + A[i - 1, 2:] + A[i, 2:]
                                + A[i + 1, :-2] + A[i + 1, 1:-1] + A[i + 1, 2:])
            vals = [A[i, 0]] + list(row.unbind()) + [A[i, n - 1]]
            for j in range(1, n - 1):
                vals[j] = (vals[j] + vals[j - 1]) / 9.0
            A = setitem(A, i, torch.stack(vals))
    return _wsum(A, ct_A)


@dace.program
def nb_fdtd_2d(ex: f64[NX, NY], ey: f64[NX, NY], hz: f64[NX, NY], fict: f64[T], ct_ex: f64[NX, NY],
               ct_ey: f64[NX, NY], ct_hz: f64[NX, NY], S: f64[1]):
    for t in range(T):
        ey[0, :] = fict[t]
        ey[1:, :] -= 0.5 * (hz[1:, :] - hz[:-1, :])
        ex[:, 1:] -= 0.5 * (hz[:, 1:] - hz[:, :-1])
        hz[:-1, :-1] -= 0.7 * (ex[:-1, 1:] - ex[:-1, :-1] + ey[1:, :-1] - ey[:-1, :-1])
    S[0] = np.sum(ex * ct_ex) + np.sum(ey * ct_ey) + np.sum(hz * ct_hz)


def _t_fdtd_2d(ex, ey, hz, fict, ct_ex, ct_ey, ct_hz, **_):
    for t in range(fict.shape[0]):
        ey = setitem(ey, 0, fict[t].expand(ey.shape[1]))
        ey = setitem(ey, slice(1, None), ey[1:, :] - 0.5 * (hz[1:, :] - hz[:-1, :]))
        ex = setitem(ex, (slice(None), slice(1, None)), ex[:, 1:] - 0.5 * (hz[:, 1:] - hz[:, :-1]))
        hz = setitem(hz, (slice(None, -1), slice(None, -1)),
                     hz[:-1, :-1] - 0.7 * (ex[:-1, 1:] - ex[:-1, :-1] + ey[1:, :-1] - ey[:-1, :-1]))
    return _wsum(ex, ct_ex) + _wsum(ey, ct_ey) + _wsum(hz, ct_hz)


# ----------------------------------------------------------------------------------------------------------
# adi: alternating-direction implicit solver; per time step two tridiagonal sweeps (forward recurrences on
# columns of p, q, backward substitution into v, then u), all in place on u


@dace.program
def nb_adi(u: f64[N, N], ct_u: f64[N, N], S: f64[1]):
    v = np.empty(u.shape, dtype=u.dtype)
    p = np.empty(u.shape, dtype=u.dtype)
    q = np.empty(u.shape, dtype=u.dtype)

    DX = 1.0 / np.float64(N)
    DY = 1.0 / np.float64(N)
    DT = 1.0 / np.float64(T)
    B1 = 2.0
    B2 = 1.0
    mul1 = B1 * DT / (DX * DX)
    mul2 = B2 * DT / (DY * DY)
    a = -mul1 / 2.0
    b = 1.0 + mul2
    c = a
    d = -mul2 / 2.0
    e = 1.0 + mul2
    f = d

    for t in range(0, T):
        v[0, 1:N - 1] = 1.0
        p[1:N - 1, 0] = 0.0
        q[1:N - 1, 0] = v[0, 1:N - 1]
        for j in range(1, N - 1):
            p[1:N - 1, j] = -c / (a * p[1:N - 1, j - 1] + b)
            q[1:N - 1, j] = (-d * u[j, 0:N - 2] + (1.0 + 2.0 * d) * u[j, 1:N - 1] - f * u[j, 2:N]
                             - a * q[1:N - 1, j - 1]) / (a * p[1:N - 1, j - 1] + b)
        v[N - 1, 1:N - 1] = 1.0
        for j in range(N - 2, 0, -1):
            v[j, 1:N - 1] = p[1:N - 1, j] * v[j + 1, 1:N - 1] + q[1:N - 1, j]

        u[1:N - 1, 0] = 1.0
        p[1:N - 1, 0] = 0.0
        q[1:N - 1, 0] = u[1:N - 1, 0]
        for j in range(1, N - 1):
            p[1:N - 1, j] = -f / (d * p[1:N - 1, j - 1] + e)
            q[1:N - 1, j] = (-a * v[0:N - 2, j] + (1.0 + 2.0 * a) * v[1:N - 1, j] - c * v[2:N, j]
                             - d * q[1:N - 1, j - 1]) / (d * p[1:N - 1, j - 1] + e)
        u[1:N - 1, N - 1] = 1.0
        for j in range(N - 2, 0, -1):
            u[1:N - 1, j] = p[1:N - 1, j] * u[1:N - 1, j + 1] + q[1:N - 1, j]
    S[0] = np.sum(u * ct_u)


def _t_adi(u, ct_u, T, **_):
    n = u.shape[0]
    dx = dy = 1.0 / n
    dt = 1.0 / T
    mul1 = 2.0 * dt / (dx * dx)
    mul2 = 1.0 * dt / (dy * dy)
    a, b = -mul1 / 2.0, 1.0 + mul2
    c = a
    d, e = -mul2 / 2.0, 1.0 + mul2
    f = d
    inner = slice(1, n - 1)
    one = torch.ones(n - 2, dtype=torch.float64)
    for _t in range(T):
        # column sweep: p, q as lists of columns (rows 1..n-2), v as a list of rows (columns 1..n-2)
        p, q = [one * 0.0], [one]
        for j in range(1, n - 1):
            den = a * p[j - 1] + b
            p.append(-c / den)
            q.append((-d * u[j, 0:n - 2] + (1.0 + 2.0 * d) * u[j, 1:n - 1] - f * u[j, 2:n] - a * q[j - 1]) / den)
        v = [None] * n
        v[n - 1] = one
        for j in range(n - 2, 0, -1):
            v[j] = p[j] * v[j + 1] + q[j]
        v[0] = one  # row 0 of v holds 1.0 from the start of the step
        vm = torch.stack([torch.cat([torch.zeros(1, dtype=torch.float64), r, torch.zeros(1, dtype=torch.float64)])
                          for r in v])  # v[:, 0] and v[:, n-1] are never read
        # row sweep into u
        p, q = [one * 0.0], [one]
        for j in range(1, n - 1):
            den = d * p[j - 1] + e
            p.append(-f / den)
            q.append((-a * vm[0:n - 2, j] + (1.0 + 2.0 * a) * vm[1:n - 1, j] - c * vm[2:n, j] - d * q[j - 1]) / den)
        cols = [None] * n
        cols[n - 1] = one
        for j in range(n - 2, 0, -1):
            cols[j] = p[j] * cols[j + 1] + q[j]
        cols[0] = one
        u = setitem(u, (inner, slice(None)), torch.stack(cols, dim=1))
    return _wsum(u, ct_u)


def _i_adi(rng):
    return {"u": rng.uniform(0.0, 1.0, (6, 6)), "ct_u": rng.normal(size=(6, 6)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# deriche: recursive (IIR) edge filter: causal and anti-causal recurrences along columns then rows.
# alpha = 0.25 is a constant (NPBench's default), the coefficients are computed in the program as NPBench does.

ALPHA_DERICHE = 0.25


@dace.program
def nb_deriche(imgIn: f64[W, H], ct_imgOut: f64[W, H], S: f64[1]):
    alpha = ALPHA_DERICHE
    k = (1.0 - np.exp(-alpha)) * (1.0 - np.exp(-alpha)) / (1.0 + alpha * np.exp(-alpha) - np.exp(2.0 * alpha))
    a1 = k
    a5 = k
    a2 = k * np.exp(-alpha) * (alpha - 1.0)
    a6 = k * np.exp(-alpha) * (alpha - 1.0)
    a3 = k * np.exp(-alpha) * (alpha + 1.0)
    a7 = k * np.exp(-alpha) * (alpha + 1.0)
    a4 = -k * np.exp(-2.0 * alpha)
    a8 = -k * np.exp(-2.0 * alpha)
    b1 = 2.0 ** (-alpha)
    b2 = -np.exp(-2.0 * alpha)
    c1 = 1
    c2 = 1

    y1 = np.empty_like(imgIn)
    y1[:, 0] = a1 * imgIn[:, 0]
    y1[:, 1] = a1 * imgIn[:, 1] + a2 * imgIn[:, 0] + b1 * y1[:, 0]
    for j in range(2, H):
        y1[:, j] = a1 * imgIn[:, j] + a2 * imgIn[:, j - 1] + b1 * y1[:, j - 1] + b2 * y1[:, j - 2]

    y2 = np.empty_like(imgIn)
    y2[:, -1] = 0.0
    y2[:, -2] = a3 * imgIn[:, -1]
    for j in range(H - 3, -1, -1):
        y2[:, j] = a3 * imgIn[:, j + 1] + a4 * imgIn[:, j + 2] + b1 * y2[:, j + 1] + b2 * y2[:, j + 2]

    imgOut = c1 * (y1 + y2)

    y1[0, :] = a5 * imgOut[0, :]
    y1[1, :] = a5 * imgOut[1, :] + a6 * imgOut[0, :] + b1 * y1[0, :]
    for i in range(2, W):
        y1[i, :] = a5 * imgOut[i, :] + a6 * imgOut[i - 1, :] + b1 * y1[i - 1, :] + b2 * y1[i - 2, :]

    y2[-1, :] = 0.0
    y2[-2, :] = a7 * imgOut[-1, :]
    for i in range(W - 3, -1, -1):
        y2[i, :] = a7 * imgOut[i + 1, :] + a8 * imgOut[i + 2, :] + b1 * y2[i + 1, :] + b2 * y2[i + 2, :]

    imgOut[:] = c2 * (y1 + y2)
    S[0] = np.sum(imgOut * ct_imgOut)


def _iir(x, a_0, a_1, a_2, a_3, b1, b2):
    """Deriche's causal + anti-causal recurrences along dim 0 of x (a list of slices)."""
    n = len(x)
    y1 = [a_0 * x[0], a_0 * x[1] + a_1 * x[0]]
    y1[1] = y1[1] + b1 * y1[0]
    for j in range(2, n):
        y1.append(a_0 * x[j] + a_1 * x[j - 1] + b1 * y1[j - 1] + b2 * y1[j - 2])
    y2 = [None] * n
    y2[n - 1] = x[n - 1] * 0.0
    y2[n - 2] = a_2 * x[n - 1]
    for j in range(n - 3, -1, -1):
        y2[j] = a_2 * x[j + 1] + a_3 * x[j + 2] + b1 * y2[j + 1] + b2 * y2[j + 2]
    return [p + q for p, q in zip(y1, y2)]


def _t_deriche(imgIn, ct_imgOut, **_):
    al = ALPHA_DERICHE
    ea, e2a = np.exp(-al), np.exp(-2.0 * al)
    k = (1.0 - ea) * (1.0 - ea) / (1.0 + al * ea - np.exp(2.0 * al))
    a1, a2, a3, a4 = k, k * ea * (al - 1.0), k * ea * (al + 1.0), -k * e2a
    b1, b2 = 2.0 ** (-al), -e2a
    cols = _iir(list(imgIn.unbind(1)), a1, a2, a3, a4, b1, b2)  # along j (columns)
    out = torch.stack(cols, dim=1)
    rows = _iir(list(out.unbind(0)), a1, a2, a3, a4, b1, b2)  # along i (rows); a5..a8 equal a1..a4
    return _wsum(torch.stack(rows, dim=0), ct_imgOut)


# ----------------------------------------------------------------------------------------------------------
# cavity_flow: 2-D Navier-Stokes lid-driven cavity. NPBench's helper programs build_up_b and pressure_poisson,
# boundary conditions written with negative indices, `x[:] = y.copy()` copies. rho, nu, dx, dy, dt are
# constants (NPBench's values for nx = ny = 5); nt and nit are symbols (T, NIT).

RHO, NU = 1.0, 0.1
DX_C = DY_C = 2.0 / (5 - 1)
DT_C = 0.1 / ((5 - 1) * (5 - 1))


@dace.program
def _build_up_b(b: f64[NY, NX], u: f64[NY, NX], v: f64[NY, NX]):
    b[1:-1, 1:-1] = (RHO * (1 / DT_C * ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * DX_C)
                                        + (v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * DY_C))
                            - ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * DX_C)) ** 2
                            - 2 * ((u[2:, 1:-1] - u[0:-2, 1:-1]) / (2 * DY_C)
                                   * (v[1:-1, 2:] - v[1:-1, 0:-2]) / (2 * DX_C))
                            - ((v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * DY_C)) ** 2))


@dace.program
def _pressure_poisson(p: f64[NY, NX], b: f64[NY, NX]):
    pn = np.empty_like(p)
    pn[:] = p.copy()
    for q in range(NIT):
        pn[:] = p.copy()
        p[1:-1, 1:-1] = (((pn[1:-1, 2:] + pn[1:-1, 0:-2]) * DY_C ** 2 + (pn[2:, 1:-1] + pn[0:-2, 1:-1]) * DX_C ** 2)
                         / (2 * (DX_C ** 2 + DY_C ** 2))
                         - DX_C ** 2 * DY_C ** 2 / (2 * (DX_C ** 2 + DY_C ** 2)) * b[1:-1, 1:-1])
        p[:, -1] = p[:, -2]
        p[0, :] = p[1, :]
        p[:, 0] = p[:, 1]
        p[-1, :] = 0


@dace.program
def nb_cavity_flow(u: f64[NY, NX], v: f64[NY, NX], p: f64[NY, NX], ct_u: f64[NY, NX], ct_v: f64[NY, NX],
                   S: f64[1]):
    un = np.empty_like(u)
    vn = np.empty_like(v)
    b = np.zeros((NY, NX))
    for n in range(T):
        un[:] = u.copy()
        vn[:] = v.copy()
        _build_up_b(b, u, v)
        _pressure_poisson(p, b, NIT=NIT)
        u[1:-1, 1:-1] = (un[1:-1, 1:-1] - un[1:-1, 1:-1] * DT_C / DX_C * (un[1:-1, 1:-1] - un[1:-1, 0:-2])
                         - vn[1:-1, 1:-1] * DT_C / DY_C * (un[1:-1, 1:-1] - un[0:-2, 1:-1])
                         - DT_C / (2 * RHO * DX_C) * (p[1:-1, 2:] - p[1:-1, 0:-2])
                         + NU * (DT_C / DX_C ** 2 * (un[1:-1, 2:] - 2 * un[1:-1, 1:-1] + un[1:-1, 0:-2])
                                 + DT_C / DY_C ** 2 * (un[2:, 1:-1] - 2 * un[1:-1, 1:-1] + un[0:-2, 1:-1])))
        v[1:-1, 1:-1] = (vn[1:-1, 1:-1] - un[1:-1, 1:-1] * DT_C / DX_C * (vn[1:-1, 1:-1] - vn[1:-1, 0:-2])
                         - vn[1:-1, 1:-1] * DT_C / DY_C * (vn[1:-1, 1:-1] - vn[0:-2, 1:-1])
                         - DT_C / (2 * RHO * DY_C) * (p[2:, 1:-1] - p[0:-2, 1:-1])
                         + NU * (DT_C / DX_C ** 2 * (vn[1:-1, 2:] - 2 * vn[1:-1, 1:-1] + vn[1:-1, 0:-2])
                                 + DT_C / DY_C ** 2 * (vn[2:, 1:-1] - 2 * vn[1:-1, 1:-1] + vn[0:-2, 1:-1])))
        u[0, :] = 0
        u[:, 0] = 0
        u[:, -1] = 0
        u[-1, :] = 1
        v[0, :] = 0
        v[-1, :] = 0
        v[:, 0] = 0
        v[:, -1] = 0
    S[0] = np.sum(u * ct_u) + np.sum(v * ct_v)


def _t_cavity_flow(u, v, p, ct_u, ct_v, T, NIT, **_):
    dx, dy, dt, rho, nu = DX_C, DY_C, DT_C, RHO, NU
    i = (slice(1, -1), slice(1, -1))
    b = torch.zeros_like(u)
    for _n in range(T):
        un, vn = u, v
        b = setitem(b, i, rho * (1 / dt * ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * dx)
                                           + (v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * dy))
                                 - ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * dx)) ** 2
                                 - 2 * ((u[2:, 1:-1] - u[0:-2, 1:-1]) / (2 * dy)
                                        * (v[1:-1, 2:] - v[1:-1, 0:-2]) / (2 * dx))
                                 - ((v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * dy)) ** 2))
        for _q in range(NIT):
            pn = p
            p = setitem(p, i, ((pn[1:-1, 2:] + pn[1:-1, 0:-2]) * dy ** 2 + (pn[2:, 1:-1] + pn[0:-2, 1:-1]) * dx ** 2)
                        / (2 * (dx ** 2 + dy ** 2)) - dx ** 2 * dy ** 2 / (2 * (dx ** 2 + dy ** 2)) * b[1:-1, 1:-1])
            p = setitem(p, (slice(None), -1), p[:, -2])
            p = setitem(p, 0, p[1, :])
            p = setitem(p, (slice(None), 0), p[:, 1])
            p = setitem(p, -1, 0.0)
        u = setitem(un, i, un[1:-1, 1:-1] - un[1:-1, 1:-1] * dt / dx * (un[1:-1, 1:-1] - un[1:-1, 0:-2])
                    - vn[1:-1, 1:-1] * dt / dy * (un[1:-1, 1:-1] - un[0:-2, 1:-1])
                    - dt / (2 * rho * dx) * (p[1:-1, 2:] - p[1:-1, 0:-2])
                    + nu * (dt / dx ** 2 * (un[1:-1, 2:] - 2 * un[1:-1, 1:-1] + un[1:-1, 0:-2])
                            + dt / dy ** 2 * (un[2:, 1:-1] - 2 * un[1:-1, 1:-1] + un[0:-2, 1:-1])))
        v = setitem(vn, i, vn[1:-1, 1:-1] - un[1:-1, 1:-1] * dt / dx * (vn[1:-1, 1:-1] - vn[1:-1, 0:-2])
                    - vn[1:-1, 1:-1] * dt / dy * (vn[1:-1, 1:-1] - vn[0:-2, 1:-1])
                    - dt / (2 * rho * dy) * (p[2:, 1:-1] - p[0:-2, 1:-1])
                    + nu * (dt / dx ** 2 * (vn[1:-1, 2:] - 2 * vn[1:-1, 1:-1] + vn[1:-1, 0:-2])
                            + dt / dy ** 2 * (vn[2:, 1:-1] - 2 * vn[1:-1, 1:-1] + vn[0:-2, 1:-1])))
        u = setitem(u, 0, 0.0)
        u = setitem(u, (slice(None), 0), 0.0)
        u = setitem(u, (slice(None), -1), 0.0)
        u = setitem(u, -1, 1.0)
        v = setitem(v, 0, 0.0)
        v = setitem(v, -1, 0.0)
        v = setitem(v, (slice(None), 0), 0.0)
        v = setitem(v, (slice(None), -1), 0.0)
    return _wsum(u, ct_u) + _wsum(v, ct_v)


def _i_cavity_flow(rng):
    shape = (5, 5)
    return {"u": rng.uniform(-0.5, 0.5, shape), "v": rng.uniform(-0.5, 0.5, shape),
            "p": rng.uniform(-0.5, 0.5, shape), "ct_u": rng.normal(size=shape), "ct_v": rng.normal(size=shape),
            "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# hdiff: horizontal diffusion (weather stencil): Laplacian, flux limiters by np.where on data, out of place


@dace.program
def nb_hdiff(in_field: f64[I + 4, J + 4, K], out_field: f64[I, J, K], coeff: f64[I, J, K], ct_res: f64[I, J, K],
             S: f64[1]):
    lap_field = 4.0 * in_field[1:I + 3, 1:J + 3, :] - (in_field[2:I + 4, 1:J + 3, :] + in_field[0:I + 2, 1:J + 3, :]
                                                       + in_field[1:I + 3, 2:J + 4, :] + in_field[1:I + 3, 0:J + 2, :])
    res1 = lap_field[1:, 1:J + 1, :] - lap_field[:I + 1, 1:J + 1, :]
    flx_field = np.where((res1 * (in_field[2:I + 3, 2:J + 2, :] - in_field[1:I + 2, 2:J + 2, :])) > 0, 0, res1)
    res2 = lap_field[1:I + 1, 1:, :] - lap_field[1:I + 1, :J + 1, :]
    fly_field = np.where((res2 * (in_field[2:I + 2, 2:J + 3, :] - in_field[2:I + 2, 1:J + 2, :])) > 0, 0, res2)
    out_field[:, :, :] = in_field[2:I + 2, 2:J + 2, :] - coeff[:, :, :] * (
        flx_field[1:, :, :] - flx_field[:-1, :, :] + fly_field[:, 1:, :] - fly_field[:, :-1, :])
    S[0] = np.sum(out_field * ct_res)


def _t_hdiff(in_field, coeff, ct_res, **_):
    i, j = coeff.shape[0], coeff.shape[1]
    f = in_field
    lap = 4.0 * f[1:i + 3, 1:j + 3] - (f[2:i + 4, 1:j + 3] + f[0:i + 2, 1:j + 3]
                                       + f[1:i + 3, 2:j + 4] + f[1:i + 3, 0:j + 2])
    res1 = lap[1:, 1:j + 1] - lap[:i + 1, 1:j + 1]
    flx = torch.where(res1 * (f[2:i + 3, 2:j + 2] - f[1:i + 2, 2:j + 2]) > 0, torch.zeros_like(res1), res1)
    res2 = lap[1:i + 1, 1:] - lap[1:i + 1, :j + 1]
    fly = torch.where(res2 * (f[2:i + 2, 2:j + 3] - f[2:i + 2, 1:j + 2]) > 0, torch.zeros_like(res2), res2)
    out = f[2:i + 2, 2:j + 2] - coeff * (flx[1:] - flx[:-1] + fly[:, 1:] - fly[:, :-1])
    return _wsum(out, ct_res)


def _i_hdiff(rng):
    i, j, k = 4, 4, 3
    return {"in_field": rng.normal(size=(i + 4, j + 4, k)), "out_field": _z(i, j, k),
            "coeff": rng.uniform(0.0, 1.0, (i, j, k)), "ct_res": rng.normal(size=(i, j, k)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# vadv: vertical advection (weather stencil): a Thomas tridiagonal solve along K with a forward sweep in
# three loops (first level, interior, last level) and a backward substitution; utens_stage is overwritten.
# dtr_stage, BET_M, BET_P are constants as in NPBench.

BET_M = 0.5
BET_P = 0.5
DTR_STAGE = 3.0 / 20.0


@dace.program
def nb_vadv(utens_stage: f64[I, J, K], u_stage: f64[I, J, K], wcon: f64[I + 1, J, K], u_pos: f64[I, J, K],
            utens: f64[I, J, K], ct_res: f64[I, J, K], S: f64[1]):
    dtr_stage = DTR_STAGE
    ccol = np.ndarray((I, J, K), dtype=utens_stage.dtype)
    dcol = np.ndarray((I, J, K), dtype=utens_stage.dtype)
    data_col = np.ndarray((I, J), dtype=utens_stage.dtype)

    for k in range(1):
        gcv = 0.25 * (wcon[1:, :, k + 1] + wcon[:-1, :, k + 1])
        cs = gcv * BET_M
        ccol[:, :, k] = gcv * BET_P
        bcol = dtr_stage - ccol[:, :, k]
        correction_term = -cs * (u_stage[:, :, k + 1] - u_stage[:, :, k])
        dcol[:, :, k] = dtr_stage * u_pos[:, :, k] + utens[:, :, k] + utens_stage[:, :, k] + correction_term
        divided = 1.0 / bcol
        ccol[:, :, k] = ccol[:, :, k] * divided
        dcol[:, :, k] = dcol[:, :, k] * divided

    for k in range(1, K - 1):
        gav = -0.25 * (wcon[1:, :, k] + wcon[:-1, :, k])
        gcv[:] = 0.25 * (wcon[1:, :, k + 1] + wcon[:-1, :, k + 1])
        as_ = gav * BET_M
        cs[:] = gcv * BET_M
        acol = gav * BET_P
        ccol[:, :, k] = gcv * BET_P
        bcol[:] = dtr_stage - acol - ccol[:, :, k]
        correction_term[:] = (-as_ * (u_stage[:, :, k - 1] - u_stage[:, :, k])
                              - cs * (u_stage[:, :, k + 1] - u_stage[:, :, k]))
        dcol[:, :, k] = dtr_stage * u_pos[:, :, k] + utens[:, :, k] + utens_stage[:, :, k] + correction_term
        divided[:] = 1.0 / (bcol - ccol[:, :, k - 1] * acol)
        ccol[:, :, k] = ccol[:, :, k] * divided
        dcol[:, :, k] = (dcol[:, :, k] - dcol[:, :, k - 1] * acol) * divided

    for k in range(K - 1, K):
        gav[:] = -0.25 * (wcon[1:, :, k] + wcon[:-1, :, k])
        as_[:] = gav * BET_M
        acol[:] = gav * BET_P
        bcol[:] = dtr_stage - acol
        correction_term[:] = -as_ * (u_stage[:, :, k - 1] - u_stage[:, :, k])
        dcol[:, :, k] = dtr_stage * u_pos[:, :, k] + utens[:, :, k] + utens_stage[:, :, k] + correction_term
        divided[:] = 1.0 / (bcol - ccol[:, :, k - 1] * acol)
        dcol[:, :, k] = (dcol[:, :, k] - dcol[:, :, k - 1] * acol) * divided

    for k in range(K - 1, K - 2, -1):
        datacol = dcol[:, :, k]
        data_col[:] = datacol
        utens_stage[:, :, k] = dtr_stage * (datacol - u_pos[:, :, k])

    for k in range(K - 2, -1, -1):
        data_col[:] = dcol[:, :, k] - ccol[:, :, k] * data_col[:, :]
        utens_stage[:, :, k] = dtr_stage * (data_col - u_pos[:, :, k])
    S[0] = np.sum(utens_stage * ct_res)


def _t_vadv(utens_stage, u_stage, wcon, u_pos, utens, ct_res, **_):
    kk = u_stage.shape[2]
    dtr = DTR_STAGE
    us, up, ut, uts = u_stage, u_pos, utens, utens_stage
    ccol: list[torch.Tensor] = []
    dcol: list[torch.Tensor] = []
    for k in range(kk):
        gcv = 0.25 * (wcon[1:, :, k + 1] + wcon[:-1, :, k + 1]) if k < kk - 1 else None
        if k == 0:
            c = gcv * BET_P
            bcol = dtr - c
            corr = -(gcv * BET_M) * (us[:, :, k + 1] - us[:, :, k])
            d = dtr * up[:, :, k] + ut[:, :, k] + uts[:, :, k] + corr
            div = 1.0 / bcol
            ccol.append(c * div)
            dcol.append(d * div)
            continue
        gav = -0.25 * (wcon[1:, :, k] + wcon[:-1, :, k])
        acol = gav * BET_P
        corr = -(gav * BET_M) * (us[:, :, k - 1] - us[:, :, k])
        if k < kk - 1:
            c = gcv * BET_P
            bcol = dtr - acol - c
            corr = corr - (gcv * BET_M) * (us[:, :, k + 1] - us[:, :, k])
        else:
            c = None
            bcol = dtr - acol
        d = dtr * up[:, :, k] + ut[:, :, k] + uts[:, :, k] + corr
        div = 1.0 / (bcol - ccol[k - 1] * acol)
        ccol.append(c * div if c is not None else None)
        dcol.append((d - dcol[k - 1] * acol) * div)
    out = [None] * kk
    data = dcol[kk - 1]
    out[kk - 1] = dtr * (data - up[:, :, kk - 1])
    for k in range(kk - 2, -1, -1):
        data = dcol[k] - ccol[k] * data
        out[k] = dtr * (data - up[:, :, k])
    return _wsum(torch.stack(out, dim=2), ct_res)


def _i_vadv(rng):
    i, j, k = 3, 4, 5
    u = lambda *s: rng.uniform(0.0, 1.0, s)  # noqa: E731  (NPBench draws uniform [0, 1))
    return {"utens_stage": u(i, j, k), "u_stage": u(i, j, k), "wcon": u(i + 1, j, k), "u_pos": u(i, j, k),
            "utens": u(i, j, k), "ct_res": rng.normal(size=(i, j, k)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# Deep learning (NPBench `deep_learning/`): NHWC tensors, convolutions as NPBench writes them (a loop over
# output pixels, a broadcast product with np.newaxis and np.sum over three axes), helper programs for relu,
# softmax, max-pooling and batch normalisation (their sizes are the helper symbols D0..D5).


@dace.program
def _conv2d(input: f64[D0, D1, D2, D3], weights: f64[D4, D4, D3, D5]):
    output = np.ndarray((D0, D1 - D4 + 1, D2 - D4 + 1, D5), dtype=np.float64)
    for i in range(D1 - D4 + 1):
        for j in range(D2 - D4 + 1):
            output[:, i, j, :] = np.sum(input[:, i:i + D4, j:j + D4, :, np.newaxis] * weights[np.newaxis, :, :, :],
                                        axis=(1, 2, 3))
    return output


@dace.program
def _relu2(x: f64[D0, D1]):
    return np.maximum(x, 0)


@dace.program
def _relu4(x: f64[D0, D1, D2, D3]):
    return np.maximum(x, 0)


@dace.program
def _maxpool2d(x: f64[D0, D1, D2, D3]):
    output = np.ndarray([D0, D1 // 2, D2 // 2, D3], dtype=np.float64)
    for i in range(D1 // 2):
        for j in range(D2 // 2):
            output[:, i, j, :] = np.max(x[:, 2 * i:2 * i + 2, 2 * j:2 * j + 2, :], axis=(1, 2))
    return output


@dace.program
def _softmax2(x: f64[D0, D1]):
    tmp_max = np.maximum.reduce(x, axis=-1, keepdims=True)
    tmp_out = np.exp(x - tmp_max)
    tmp_sum = np.add.reduce(tmp_out, axis=-1, keepdims=True)
    return tmp_out / tmp_sum


@dace.program
def _batchnorm2d(x: f64[D0, D1, D2, D3]):
    mean = np.ndarray((1, D1, D2, D3), dtype=np.float64)
    mean[:] = np.mean(x, axis=0)
    std = np.ndarray((1, D1, D2, D3), dtype=np.float64)
    std[:] = np.sqrt(np.sum((x - mean) * (x - mean), axis=0) / np.float64(D0))
    return (x - mean) / np.sqrt(std + 1e-5)


def _t_conv2d(x, w):
    """NHWC input, (K, K, C_in, C_out) weights, stride 1, no padding."""
    return F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1)).permute(0, 2, 3, 1)


def _t_batchnorm2d(x):
    mean = x.mean(0, keepdim=True)
    std = torch.sqrt(((x - mean) * (x - mean)).sum(0, keepdim=True) / x.shape[0])
    return (x - mean) / torch.sqrt(std + 1e-5)


# conv2d_bias


@dace.program
def nb_conv2d_bias(input: f64[N, H, W, C_in], weights: f64[K, K, C_in, C_out], bias: f64[C_out],
                   ct_res: f64[N, H - K + 1, W - K + 1, C_out], S: f64[1]):
    res = _conv2d(input, weights) + bias
    S[0] = np.sum(res * ct_res)


def _t_conv2d_bias(input, weights, bias, ct_res, **_):
    return _wsum(_t_conv2d(input, weights) + bias, ct_res)


# lenet: LeNet-5 (inference), C_before_fc1 is the symbol CB = 16 * ((H - 12) // 4) * ((W - 12) // 4)


@dace.program
def nb_lenet(input: f64[N, H, W, 1], conv1: f64[5, 5, 1, 6], conv1bias: f64[6], conv2: f64[5, 5, 6, 16],
             conv2bias: f64[16], fc1w: f64[CB, 120], fc1b: f64[120], fc2w: f64[120, 84], fc2b: f64[84],
             fc3w: f64[84, 10], fc3b: f64[10], ct_res: f64[N, 10], S: f64[1]):
    x1 = _relu4(_conv2d(input, conv1) + conv1bias)
    x2 = _maxpool2d(x1)
    x3 = _relu4(_conv2d(x2, conv2) + conv2bias)
    x4 = _maxpool2d(x3)
    x5 = np.reshape(x4, (N, CB))
    x6 = _relu2(x5 @ fc1w + fc1b)
    x7 = _relu2(x6 @ fc2w + fc2b)
    res = x7 @ fc3w + fc3b
    S[0] = np.sum(res * ct_res)


def _t_lenet(input, conv1, conv1bias, conv2, conv2bias, fc1w, fc1b, fc2w, fc2b, fc3w, fc3b, ct_res, **_):
    def pool(x):  # NHWC 2x2 max-pooling
        return F.max_pool2d(x.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)

    x = pool(torch.relu(_t_conv2d(input, conv1) + conv1bias))
    x = pool(torch.relu(_t_conv2d(x, conv2) + conv2bias))
    x = x.reshape(x.shape[0], -1)
    x = torch.relu(x @ fc1w + fc1b)
    x = torch.relu(x @ fc2w + fc2b)
    return _wsum(x @ fc3w + fc3b, ct_res)


def _i_lenet(rng):
    n, h, w = 2, 16, 16
    cb = 16 * ((h - 12) // 4) * ((w - 12) // 4)
    g = lambda *s: rng.normal(size=s) / np.sqrt(np.prod(s[:-1]))  # noqa: E731  (fan-in scaling)
    return {"input": rng.normal(size=(n, h, w, 1)), "conv1": g(5, 5, 1, 6), "conv1bias": g(6),
            "conv2": g(5, 5, 6, 16), "conv2bias": g(16), "fc1w": g(cb, 120), "fc1b": g(120),
            "fc2w": g(120, 84), "fc2b": g(84), "fc3w": g(84, 10), "fc3b": g(10),
            "ct_res": rng.normal(size=(n, 10)), "S": _z(1)}


# mlp: three layers, relu, relu, softmax. NPBench's numpy version reduces with np.max / np.sum(keepdims=True),
# which DaCe's frontend rejects (no keepdims): np.maximum.reduce / np.add.reduce(keepdims=True) as its DaCe version.


@dace.program
def nb_mlp(input: f64[N, C_in], w1: f64[C_in, S0], b1: f64[S0], w2: f64[S0, S1], b2: f64[S1], w3: f64[S1, S2],
           b3: f64[S2], ct_res: f64[N, S2], S: f64[1]):
    x1 = _relu2(input @ w1 + b1)
    x2 = _relu2(x1 @ w2 + b2)
    x3 = _softmax2(x2 @ w3 + b3)
    S[0] = np.sum(x3 * ct_res)


def _t_mlp(input, w1, b1, w2, b2, w3, b3, ct_res, **_):
    x = torch.relu(input @ w1 + b1)
    x = torch.relu(x @ w2 + b2)
    return _wsum(torch.softmax(x @ w3 + b3, dim=-1), ct_res)


# resnet: a bottleneck residual block with batch normalisation over the batch axis (NPBench's form: the first
# convolution is written into a zero-padded array)


@dace.program
def nb_resnet(input: f64[N, H, W, C1], conv1: f64[1, 1, C1, C2], conv2: f64[3, 3, C2, C2],
              conv3: f64[1, 1, C2, C1], ct_res: f64[N, H, W, C1], S: f64[1]):
    padded = np.zeros((N, H + 2, W + 2, C2), dtype=np.float64)
    padded[:, 1:-1, 1:-1, :] = _conv2d(input, conv1)
    x = _batchnorm2d(padded)
    x1 = _relu4(x)
    x2 = _conv2d(x1, conv2)
    x3 = _batchnorm2d(x2)
    x4 = _relu4(x3)
    x5 = _conv2d(x4, conv3)
    x6 = _batchnorm2d(x5)
    res = _relu4(x6 + input)
    S[0] = np.sum(res * ct_res)


def _t_resnet(input, conv1, conv2, conv3, ct_res, **_):
    x = F.pad(_t_conv2d(input, conv1), (0, 0, 1, 1, 1, 1))  # zero padding of H and W (NHWC)
    x = torch.relu(_t_batchnorm2d(x))
    x = torch.relu(_t_batchnorm2d(_t_conv2d(x, conv2)))
    x = _t_batchnorm2d(_t_conv2d(x, conv3))
    return _wsum(torch.relu(x + input), ct_res)


# softmax over the last axis of a 4-D tensor; reductions as NPBench's DaCe version (np.maximum.reduce with
# initial=-9999, np.add.reduce, both keepdims=True), since DaCe's np.max / np.sum take no keepdims.


@dace.program
def nb_softmax(x: f64[N, H, SM, SM], ct_res: f64[N, H, SM, SM], S: f64[1]):
    tmp_max = np.maximum.reduce(x, axis=-1, keepdims=True, initial=-9999)
    tmp_out = np.exp(x - tmp_max)
    tmp_sum = np.add.reduce(tmp_out, axis=-1, keepdims=True)
    res = tmp_out / tmp_sum
    S[0] = np.sum(res * ct_res)


def _t_softmax(x, ct_res, **_):
    return _wsum(torch.softmax(x, dim=-1), ct_res)


# ----------------------------------------------------------------------------------------------------------

CASES: list[Case] = [
    Case("nb_atax", nb_atax, _t_atax, ("A",), "S", _inputs(A=(6, 5), x=(5,), ct_y=(5,)), {"M": 6, "N": 5},
         "PolyBench atax: two matrix-vector products"),
    Case("nb_bicg", nb_bicg, _t_bicg, ("A",), "S", _inputs(A=(6, 5), p=(5,), r=(6,), ct_s=(5,), ct_q=(6,)),
         {"N": 6, "M": 5},
         "PolyBench bicg: r A and A p"),
    Case("nb_gemm", nb_gemm, _t_gemm, ("A",), "S", _inputs(C=(5, 6), A=(5, 4), B=(4, 6), ct_C=(5, 6)),
         {"NI": 5, "NJ": 6, "NK": 4}, "PolyBench gemm, C updated in place"),
    Case("nb_gemver", nb_gemver, _t_gemver, ("A",), "S",
         _inputs(A=(6, 6), u1=(6,), v1=(6,), u2=(6,), v2=(6,), w=(6,), x=(6,), y=(6,), z=(6,), ct_w=(6,)), {"N": 6},
         "PolyBench gemver: outer products, in-place A, x, w"),
    Case("nb_gesummv", nb_gesummv, _t_gesummv, ("A",), "S", _inputs(A=(6, 6), B=(6, 6), x=(6,), ct_res=(6,)),
         {"N": 6},
         "PolyBench gesummv"),
    Case("nb_k2mm", nb_k2mm, _t_k2mm, ("A",), "S", _inputs(A=(4, 5), B=(5, 6), C=(6, 3), D=(4, 3), ct_D=(4, 3)),
         {"NI": 4, "NK": 5, "NJ": 6, "NL": 3}, "PolyBench 2mm, D updated in place"),
    Case("nb_k3mm", nb_k3mm, _t_k3mm, ("A",), "S", _inputs(A=(4, 5), B=(5, 6), C=(6, 3), D=(3, 5), ct_E=(4, 5)),
         {"NI": 4, "NK": 5, "NJ": 6, "NM": 3, "NL": 5}, "PolyBench 3mm: a chain of three products"),
    Case("nb_mvt", nb_mvt, _t_mvt, ("A",), "S",
         _inputs(x1=(6,), x2=(6,), y_1=(6,), y_2=(6,), A=(6, 6), ct_x1=(6,), ct_x2=(6,)),
         {"N": 6}, "PolyBench mvt, x1 and x2 updated in place"),
    Case("nb_doitgen", nb_doitgen, _t_doitgen, ("A",), "S", _inputs(A=(3, 4, 5), C4=(5, 5), ct_A=(3, 4, 5)),
         {"NR": 3, "NQ": 4, "NP": 5}, "PolyBench doitgen: per-slice product through reshapes, in place"),
    Case("nb_go_fast", nb_go_fast, _t_go_fast, ("a",), "S", _inputs(a=(6, 6), ct_res=(6, 6)), {"N": 6},
         "NPBench go_fast: tanh of the trace by a scalar loop"),
    Case("nb_cholesky", loops.lp_cholesky_dot, loops._t_cholesky_dot, ("A",), "S", _i_cholesky, {"N": 6},
         "PolyBench cholesky, np.dot of row slices, in place"),
    Case("nb_lu", loops.lp_lu_slices, loops._t_lu_slices, ("A",), "S", _i_lu, {"N": 6},
         "PolyBench lu, slice products, in place"),
    Case("nb_ludcmp", nb_ludcmp, _t_ludcmp, ("A",), "S", _i_ludcmp, {"N": 6},
         "PolyBench ludcmp: lu then two substitutions with slice products"),
    Case("nb_trisolv", nb_trisolv, _t_trisolv, ("L",), "S", _i_trisolv, {"N": 7},
         "PolyBench trisolv: row slice times solved prefix into one element"),
    Case("nb_durbin", nb_durbin, _t_durbin, ("r",), "S", _i_durbin, {"N": 8},
         "PolyBench durbin: flip helper program, dot, in-place y[:k] update, loop-carried scalars"),
    Case("nb_gramschmidt", nb_gramschmidt, _t_gramschmidt, ("A",), "S",
         _inputs(A=(7, 5), ct_Q=(7, 5), ct_R=(5, 5), ct_A=(7, 5)),
         {"M": 7, "N": 5},
         "PolyBench gramschmidt: column dots, in-place column updates"),
    Case("nb_symm", nb_symm, _t_symm, ("A",), "S", _inputs(C=(5, 4), A=(5, 5), B=(5, 4), ct_C=(5, 4)),
         {"M": 5, "N": 4},
         "PolyBench symm: column-slice updates and slice products"),
    Case("nb_syr2k", nb_syr2k, _t_syr2k, ("A",), "S", _inputs(C=(5, 5), A=(5, 4), B=(5, 4), ct_C=(5, 5)),
         {"N": 5, "M": 4},
         "PolyBench syr2k: in-place row-prefix updates"),
    Case("nb_syrk", nb_syrk, _t_syrk, ("A",), "S", _inputs(C=(5, 5), A=(5, 4), ct_C=(5, 5)), {"N": 5, "M": 4},
         "PolyBench syrk: in-place row-prefix updates"),
    Case("nb_trmm", nb_trmm, _t_trmm, ("A",), "S", _inputs(A=(5, 5), B=(5, 4), ct_B=(5, 4)), {"M": 5, "N": 4},
         "PolyBench trmm: dot products of column suffixes, in place"),
    Case("nb_covariance", nb_covariance, _t_covariance, ("data",), "S", _inputs(data=(8, 5), ct_cov=(5, 5)),
         {"N": 8, "M": 5},
         "PolyBench covariance: in-place centring, triangular slice products, mirrored copy"),
    Case("nb_correlation", nb_correlation, _t_correlation, ("data",), "S", _i_correlation, {"N": 8, "M": 5},
         "PolyBench correlation: masked stddev, in-place normalisation, triangular slice products"),
    Case("nb_jacobi_1d", nb_jacobi_1d, _with(_t_jacobi_1d, T=3), ("A",), "S",
         _inputs(A=(10,), B=(10,), ct_A=(10,), ct_B=(10,)),
         {"N": 10, "T": 3}, "PolyBench jacobi_1d: 1-D stencil ping-pong in a time loop"),
    Case("nb_jacobi_2d", nb_jacobi_2d, _with(_t_jacobi_2d, T=3), ("A",), "S",
         _inputs(A=(6, 6), B=(6, 6), ct_A=(6, 6), ct_B=(6, 6)),
         {"N": 6, "T": 3}, "PolyBench jacobi_2d: 2-D stencil ping-pong in a time loop"),
    Case("nb_heat_3d", nb_heat_3d, _with(_t_heat_3d, T=3), ("A",), "S",
         _inputs(A=(5, 5, 5), B=(5, 5, 5), ct_A=(5, 5, 5), ct_B=(5, 5, 5)),
         {"N": 5, "T": 3}, "PolyBench heat_3d: 3-D stencil ping-pong in a time loop"),
    Case("nb_seidel_2d", nb_seidel_2d, _with(_t_seidel_2d, T=3), ("A",), "S", _inputs(A=(6, 6), ct_A=(6, 6)),
         {"N": 6, "T": 3}, "PolyBench seidel_2d: vectorised row update then in-place sweep"),
    Case("nb_fdtd_2d", nb_fdtd_2d, _t_fdtd_2d, ("ex",), "S",
         _inputs(ex=(5, 6), ey=(5, 6), hz=(5, 6), fict=(3,), ct_ex=(5, 6), ct_ey=(5, 6), ct_hz=(5, 6)),
         {"NX": 5, "NY": 6, "T": 3}, "PolyBench fdtd_2d: in-place field updates in a time loop"),
    Case("nb_adi", nb_adi, _with(_t_adi, T=2), ("u",), "S", _i_adi, {"N": 6, "T": 2},
         "PolyBench adi: tridiagonal sweeps, forward and reversed loops, in place on u"),
    Case("nb_deriche", nb_deriche, _t_deriche, ("imgIn",), "S", _inputs(imgIn=(6, 5), ct_imgOut=(6, 5)),
         {"W": 6, "H": 5},
         "PolyBench deriche: causal and anti-causal recurrences along both axes"),
    Case("nb_cavity_flow", nb_cavity_flow, _with(_t_cavity_flow, T=2, NIT=2), ("u",), "S", _i_cavity_flow,
         {"NY": 5, "NX": 5, "T": 2, "NIT": 2}, "NPBench cavity_flow: nested helper programs, boundary copies"),
    Case("nb_hdiff", nb_hdiff, _t_hdiff, ("in_field",), "S", _i_hdiff, {"I": 4, "J": 4, "K": 3},
         "NPBench hdiff: Laplacian and np.where flux limiters"),
    Case("nb_vadv", nb_vadv, _t_vadv, ("utens",), "S", _i_vadv, {"I": 3, "J": 4, "K": 5},
         "NPBench vadv: Thomas solve along K, forward sweep and backward substitution"),
    Case("nb_conv2d_bias", nb_conv2d_bias, _t_conv2d_bias, ("input",), "S",
         _inputs(input=(2, 5, 5, 2), weights=(2, 2, 2, 3), bias=(3,), ct_res=(2, 4, 4, 3)),
         {"N": 2, "H": 5, "W": 5, "C_in": 2, "C_out": 3, "K": 2}, "NPBench conv2d_bias: loop convolution + bias"),
    Case("nb_lenet", nb_lenet, _t_lenet, ("input",), "S", _i_lenet, {"N": 2, "H": 16, "W": 16, "CB": 16},
         "NPBench lenet: LeNet-5 with loop convolutions, max-pooling, dense layers"),
    Case("nb_mlp", nb_mlp, _t_mlp, ("input",), "S",
         _inputs(input=(4, 3), w1=(3, 8), b1=(8,), w2=(8, 6), b2=(6,), w3=(6, 5), b3=(5,), ct_res=(4, 5)),
         {"N": 4, "C_in": 3, "S0": 8, "S1": 6, "S2": 5}, "NPBench mlp: dense, relu, softmax with keepdims"),
    Case("nb_resnet", nb_resnet, _t_resnet, ("input",), "S",
         _inputs(input=(2, 4, 4, 3), conv1=(1, 1, 3, 2), conv2=(3, 3, 2, 2), conv3=(1, 1, 2, 3), ct_res=(2, 4, 4, 3)),
         {"N": 2, "H": 4, "W": 4, "C1": 3, "C2": 2}, "NPBench resnet: bottleneck block with batch normalisation"),
    Case("nb_softmax", nb_softmax, _t_softmax, ("x",), "S", _inputs(x=(2, 2, 4, 4), ct_res=(2, 2, 4, 4)),
         {"N": 2, "H": 2, "SM": 4},
         "NPBench softmax over the last axis, keepdims reductions"),
]

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}
