"""Loop corpus: PolyBench / NPBench-style kernels with Python loops (LoopRegions), data-dependent
conditions (ConditionalBlocks) and data-dependent while loops, each paired with a PyTorch reference
written with Python loops, plus the API-built cases of `unstructured.py` (conditional interstate edges,
symbols assigned on edges). See `case.py` for the conventions of `Case`.

The torch references never write into a tensor that autograd may have saved: every write goes through
`setitem` (a functional copy) or into Python lists of 0-d tensors.
"""

from __future__ import annotations

import dace
import numpy as np
import torch
from dace.libraries.blas import Dot

from gradflow.autodiff.forwarding import Forwarding
from gradflow.core.graph import parse

from .case import BuiltProgram, Case, element_rows, list_dot, setitem, stack_rows
from .case import normal_inputs as _inputs
from .unstructured import CASES as _UNSTRUCTURED

N = dace.symbol("N")
M = dace.symbol("M")
K = dace.symbol("K")
T = dace.symbol("T")

f64 = dace.float64


def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float64)


def _sq_sum(A: torch.Tensor) -> torch.Tensor:
    return (A * A).sum()


# ----------------------------------------------------------------------------------------------------------
# jacobi_1d (PolyBench), T time steps of a 3-point stencil between A and B


@dace.program
def lp_jacobi_1d(A: f64[N], B: f64[N], S: f64[1]):
    for t in range(T):
        B[1:N - 1] = 0.33333 * (A[0:N - 2] + A[1:N - 1] + A[2:N])
        A[1:N - 1] = 0.33333 * (B[0:N - 2] + B[1:N - 1] + B[2:N])
    for i in range(N):
        S[0] += A[i] * A[i] * B[i]


def _t_jacobi_1d(A, B, S, T=3, **_):
    for _t in range(T):
        B = setitem(B, slice(1, -1), 0.33333 * (A[:-2] + A[1:-1] + A[2:]))
        A = setitem(A, slice(1, -1), 0.33333 * (B[:-2] + B[1:-1] + B[2:]))
    return S[0] + (A * A * B).sum()


# ----------------------------------------------------------------------------------------------------------
# jacobi_2d (PolyBench)


@dace.program
def lp_jacobi_2d(A: f64[N, N], B: f64[N, N], S: f64[1]):
    for t in range(1, T):
        B[1:N - 1, 1:N - 1] = 0.2 * (A[1:N - 1, 1:N - 1] + A[1:N - 1, 0:N - 2] + A[1:N - 1, 2:N]
                                     + A[2:N, 1:N - 1] + A[0:N - 2, 1:N - 1])
        A[1:N - 1, 1:N - 1] = 0.2 * (B[1:N - 1, 1:N - 1] + B[1:N - 1, 0:N - 2] + B[1:N - 1, 2:N]
                                     + B[2:N, 1:N - 1] + B[0:N - 2, 1:N - 1])
    for i in range(N):
        for j in range(N):
            S[0] += np.sin(A[i, j]) * B[i, j]


def _t_jacobi_2d(A, B, S, T=3, **_):
    inner = (slice(1, -1), slice(1, -1))
    for _t in range(1, T):
        B = setitem(B, inner, 0.2 * (A[1:-1, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:] + A[2:, 1:-1] + A[:-2, 1:-1]))
        A = setitem(A, inner, 0.2 * (B[1:-1, 1:-1] + B[1:-1, :-2] + B[1:-1, 2:] + B[2:, 1:-1] + B[:-2, 1:-1]))
    return S[0] + (torch.sin(A) * B).sum()


# ----------------------------------------------------------------------------------------------------------
# heat_3d (PolyBench / NPBench)


@dace.program
def lp_heat_3d(A: f64[N, N, N], B: f64[N, N, N], S: f64[1]):
    for t in range(1, T):
        B[1:N - 1, 1:N - 1, 1:N - 1] = (
            0.125 * (A[2:N, 1:N - 1, 1:N - 1] - 2.0 * A[1:N - 1, 1:N - 1, 1:N - 1] + A[0:N - 2, 1:N - 1, 1:N - 1])
            + 0.125 * (A[1:N - 1, 2:N, 1:N - 1] - 2.0 * A[1:N - 1, 1:N - 1, 1:N - 1] + A[1:N - 1, 0:N - 2, 1:N - 1])
            + 0.125 * (A[1:N - 1, 1:N - 1, 2:N] - 2.0 * A[1:N - 1, 1:N - 1, 1:N - 1] + A[1:N - 1, 1:N - 1, 0:N - 2])
            + A[1:N - 1, 1:N - 1, 1:N - 1])
        A[1:N - 1, 1:N - 1, 1:N - 1] = (
            0.125 * (B[2:N, 1:N - 1, 1:N - 1] - 2.0 * B[1:N - 1, 1:N - 1, 1:N - 1] + B[0:N - 2, 1:N - 1, 1:N - 1])
            + 0.125 * (B[1:N - 1, 2:N, 1:N - 1] - 2.0 * B[1:N - 1, 1:N - 1, 1:N - 1] + B[1:N - 1, 0:N - 2, 1:N - 1])
            + 0.125 * (B[1:N - 1, 1:N - 1, 2:N] - 2.0 * B[1:N - 1, 1:N - 1, 1:N - 1] + B[1:N - 1, 1:N - 1, 0:N - 2])
            + B[1:N - 1, 1:N - 1, 1:N - 1])
    for i, j, k in dace.map[0:N, 0:N, 0:N]:
        S[0] += A[i, j, k] * A[i, j, k]


def _heat_step(A):
    c = A[1:-1, 1:-1, 1:-1]
    return (0.125 * (A[2:, 1:-1, 1:-1] - 2.0 * c + A[:-2, 1:-1, 1:-1])
            + 0.125 * (A[1:-1, 2:, 1:-1] - 2.0 * c + A[1:-1, :-2, 1:-1])
            + 0.125 * (A[1:-1, 1:-1, 2:] - 2.0 * c + A[1:-1, 1:-1, :-2]) + c)


def _t_heat_3d(A, B, S, T=3, **_):
    inner = (slice(1, -1),) * 3
    for _t in range(1, T):
        B = setitem(B, inner, _heat_step(A))
        A = setitem(A, inner, _heat_step(B))
    return S[0] + _sq_sum(A)


# ----------------------------------------------------------------------------------------------------------
# seidel_2d (NPBench form: a vectorised row update, then a sequential in-place sweep along the row)


@dace.program
def lp_seidel_2d(A: f64[N, N], S: f64[1]):
    for t in range(0, T - 1):
        for i in range(1, N - 1):
            A[i, 1:N - 1] += (A[i - 1, 0:N - 2] + A[i - 1, 1:N - 1] + A[i - 1, 2:N] + A[i, 2:N]
                              + A[i + 1, 0:N - 2] + A[i + 1, 1:N - 1] + A[i + 1, 2:N])
            for j in range(1, N - 1):
                A[i, j] += A[i, j - 1]
                A[i, j] /= 9.0
    for i in range(N):
        for j in range(N):
            S[0] += A[i, j] * A[i, j]


def _t_seidel_2d(A, S, T=3, **_):
    n = A.shape[0]
    for _t in range(T - 1):
        for i in range(1, n - 1):
            row = A[i, 1:-1] + (A[i - 1, :-2] + A[i - 1, 1:-1] + A[i - 1, 2:] + A[i, 2:]
                                + A[i + 1, :-2] + A[i + 1, 1:-1] + A[i + 1, 2:])
            vals = [A[i, 0]] + list(row.unbind()) + [A[i, n - 1]]
            for j in range(1, n - 1):
                vals[j] = (vals[j] + vals[j - 1]) / 9.0
            A = setitem(A, i, torch.stack(vals))
    return S[0] + _sq_sum(A)


# ----------------------------------------------------------------------------------------------------------
# go_fast (NPBench): tanh of the trace, accumulated in a loop, added to the matrix


@dace.program
def lp_go_fast(A: f64[N, N], B: f64[N, N], S: f64[1]):
    trace = 0.0
    for i in range(N):
        trace += np.tanh(A[i, i])
    B[:] = A + trace
    for i in range(N):
        for j in range(N):
            S[0] += B[i, j] * B[i, j] * A[j, i]


def _t_go_fast(A, S, **_):
    trace = torch.zeros((), dtype=torch.float64)
    for i in range(A.shape[0]):
        trace = trace + torch.tanh(A[i, i])
    B = A + trace
    return S[0] + (B * B * A.T).sum()


# ----------------------------------------------------------------------------------------------------------
# softmax with max-subtraction, everything in explicit loops (scalar max via max())


@dace.program
def lp_softmax(X: f64[N, M], W: f64[N, M], P: f64[N, M], S: f64[1]):
    for i in range(N):
        m = X[i, 0]
        for j in range(1, M):
            m = max(m, X[i, j])
        s = 0.0
        for j in range(M):
            P[i, j] = np.exp(X[i, j] - m)
            s += P[i, j]
        for j in range(M):
            P[i, j] = P[i, j] / s
    for i in range(N):
        for j in range(M):
            S[0] += P[i, j] * W[i, j]


def _t_softmax(X, W, S, **_):
    n, m = X.shape
    total = S[0]
    for i in range(n):
        mx = X[i, 0]
        for j in range(1, m):
            mx = torch.maximum(mx, X[i, j])
        e = [torch.exp(X[i, j] - mx) for j in range(m)]
        s = torch.zeros((), dtype=torch.float64)
        for j in range(m):
            s = s + e[j]
        for j in range(m):
            total = total + e[j] / s * W[i, j]
    return total


def _i_softmax(rng):
    n, m = 5, 6
    X = np.stack([rng.permutation(m) * 0.7 + rng.uniform(0.0, 0.2, m) for _ in range(n)])  # unique row max
    return {"X": X, "W": rng.normal(size=(n, m)), "P": _z(n, m), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# trisolv (PolyBench): forward substitution with a lower-triangular L


@dace.program
def lp_trisolv(L: f64[N, N], x: f64[N], b: f64[N], S: f64[1]):
    for i in range(N):
        acc = b[i]
        for j in range(i):
            acc -= L[i, j] * x[j]
        x[i] = acc / L[i, i]
    for i in range(N):
        S[0] += x[i] * x[i] * (i + 1)


def _t_trisolv(L, b, S, **_):
    n = L.shape[0]
    x: list[torch.Tensor] = []
    for i in range(n):
        acc = b[i]
        for j in range(i):
            acc = acc - L[i, j] * x[j]
        x.append(acc / L[i, i])
    return S[0] + sum(x[i] * x[i] * (i + 1) for i in range(n))


def _i_trisolv(rng):
    n = 7
    L = np.tril(rng.normal(size=(n, n)) * 0.3) + np.diag(rng.uniform(1.5, 2.5, n))
    return {"L": L, "x": _z(n), "b": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# lu (PolyBench): in-place LU decomposition without pivoting


@dace.program
def lp_lu(A: f64[N, N], W: f64[N, N], S: f64[1]):
    for i in range(N):
        for j in range(i):
            for k in range(j):
                A[i, j] -= A[i, k] * A[k, j]
            A[i, j] /= A[j, j]
        for j in range(i, N):
            for k in range(i):
                A[i, j] -= A[i, k] * A[k, j]
    for i in range(N):
        for j in range(N):
            S[0] += A[i, j] * W[i, j]


def _t_lu(A, W, S, **_):
    n = A.shape[0]
    a = element_rows(A)
    for i in range(n):
        for j in range(i):
            for k in range(j):
                a[i][j] = a[i][j] - a[i][k] * a[k][j]
            a[i][j] = a[i][j] / a[j][j]
        for j in range(i, n):
            for k in range(i):
                a[i][j] = a[i][j] - a[i][k] * a[k][j]
    return S[0] + sum(a[i][j] * W[i, j] for i in range(n) for j in range(n))


def _i_lu(rng):
    n = 6
    A = rng.normal(size=(n, n)) * 0.5 + np.diag(np.full(n, 3.0))  # diagonally dominant: stable pivots
    return {"A": A, "W": rng.normal(size=(n, n)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# durbin (PolyBench): Levinson-Durbin recursion with loop-carried scalars alpha, beta


@dace.program
def lp_durbin(r: f64[N], y: f64[N], z: f64[N], S: f64[1]):
    y[0] = -r[0]
    beta = 1.0
    alpha = -r[0]
    for k in range(1, N):
        beta *= 1.0 - alpha * alpha
        s = 0.0
        for i in range(k):
            s += r[k - i - 1] * y[i]
        alpha = -(r[k] + s) / beta
        for i in range(k):
            z[i] = y[i] + alpha * y[k - i - 1]
        for i in range(k):
            y[i] = z[i]
        y[k] = alpha
    for i in range(N):
        S[0] += y[i] * (i + 1)


def _t_durbin(r, S, **_):
    n = r.shape[0]
    y = [-r[0]] + [None] * (n - 1)
    beta = torch.ones((), dtype=torch.float64)
    alpha = -r[0]
    for k in range(1, n):
        beta = beta * (1.0 - alpha * alpha)
        s = torch.zeros((), dtype=torch.float64)
        for i in range(k):
            s = s + r[k - i - 1] * y[i]
        alpha = -(r[k] + s) / beta
        z = [y[i] + alpha * y[k - i - 1] for i in range(k)]
        y[:k] = z
        y[k] = alpha
    return S[0] + sum(y[i] * (i + 1) for i in range(n))


def _i_durbin(rng):
    n = 8
    return {"r": rng.uniform(-0.3, 0.3, n), "y": _z(n), "z": _z(n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# vadv-style tridiagonal solve (Thomas algorithm) along axis 1, vectorised over axis 0:
# a forward sweep (k ascending) then a backward sweep (k descending)


@dace.program
def lp_vadv_sweeps(a: f64[N, K], b: f64[N, K], c: f64[N, K], d: f64[N, K], x: f64[N, K], S: f64[1]):
    cp = np.ndarray([N, K], dtype=np.float64)
    dp = np.ndarray([N, K], dtype=np.float64)
    cp[:, 0] = c[:, 0] / b[:, 0]
    dp[:, 0] = d[:, 0] / b[:, 0]
    for k in range(1, K):
        den = b[:, k] - a[:, k] * cp[:, k - 1]
        cp[:, k] = c[:, k] / den
        dp[:, k] = (d[:, k] - a[:, k] * dp[:, k - 1]) / den
    x[:, K - 1] = dp[:, K - 1]
    for k in range(K - 2, -1, -1):
        x[:, k] = dp[:, k] - cp[:, k] * x[:, k + 1]
    for i, k in dace.map[0:N, 0:K]:
        S[0] += x[i, k] * x[i, k]


def _t_vadv_sweeps(a, b, c, d, S, **_):
    kk = a.shape[1]
    cp = [c[:, 0] / b[:, 0]]
    dp = [d[:, 0] / b[:, 0]]
    for k in range(1, kk):
        den = b[:, k] - a[:, k] * cp[k - 1]
        cp.append(c[:, k] / den)
        dp.append((d[:, k] - a[:, k] * dp[k - 1]) / den)
    x = [None] * kk
    x[kk - 1] = dp[kk - 1]
    for k in range(kk - 2, -1, -1):
        x[k] = dp[k] - cp[k] * x[k + 1]
    return S[0] + sum(_sq_sum(xk) for xk in x)


def _i_vadv_sweeps(rng):
    n, k = 4, 7
    return {"a": rng.uniform(-1.0, 1.0, (n, k)), "b": rng.uniform(3.0, 4.0, (n, k)),
            "c": rng.uniform(-1.0, 1.0, (n, k)), "d": rng.normal(size=(n, k)), "x": _z(n, k), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# Newton iteration for sqrt with a data-dependent while condition (tolerance on the residual).
# DaCe 2.0.0b1 accepts `while <condition on data>:` and builds a LoopRegion for it.


@dace.program
def lp_newton_sqrt(A: f64[N], X: f64[N], S: f64[1]):
    for i in range(N):
        x = A[i]
        while abs(x * x - A[i]) > 1e-10 * A[i]:
            x = 0.5 * (x + A[i] / x)
        X[i] = x
    for i in range(N):
        S[0] += X[i] * (i + 1.0)


def _t_newton_sqrt(A, S, **_):
    total = S[0]
    for i in range(A.shape[0]):
        x = A[i]
        while abs((x * x - A[i]).item()) > 1e-10 * A[i].item():  # condition on data, not differentiated
            x = 0.5 * (x + A[i] / x)
        total = total + x * (i + 1.0)
    return total


def _i_newton_sqrt(rng):
    n = 6
    return {"A": rng.uniform(0.5, 9.0, n), "X": _z(n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# strided loops. `range(0, N, 2)` with N even (N = 10); with N odd (N = 9: the last value 8 is not
# stop - step = 7); `range(1, N, 3)` with N = 9 (values 1, 4, 7; stop - step = 6 is not hit).
# The bodies are loop-carried recurrences on S and update Y in place.


@dace.program
def lp_strided_step2(X: f64[N], Y: f64[N], S: f64[1]):
    for i in range(0, N, 2):
        S[0] = S[0] * np.cos(X[i]) + X[i] * Y[i]
        Y[i] = Y[i] * X[i] + 1.0
    for i in range(N):
        S[0] += Y[i] * Y[i]


def _strided_ref(X, Y, S, start, step):
    s = S[0]
    y = list(Y.unbind())
    for i in range(start, X.shape[0], step):
        s = s * torch.cos(X[i]) + X[i] * y[i]
        y[i] = y[i] * X[i] + 1.0
    return s + sum(v * v for v in y)


def _t_strided_step2(X, Y, S, **_):
    return _strided_ref(X, Y, S, 0, 2)


@dace.program
def lp_strided_step2_odd(X: f64[N], Y: f64[N], S: f64[1]):
    for i in range(0, N, 2):
        S[0] = S[0] * np.cos(X[i]) + X[i] * Y[i]
        Y[i] = Y[i] * X[i] + 1.0
    for i in range(N):
        S[0] += Y[i] * Y[i]


@dace.program
def lp_strided_step3(X: f64[N], Y: f64[N], S: f64[1]):
    for i in range(1, N, 3):
        S[0] = S[0] * np.cos(X[i]) + X[i] * Y[i]
        Y[i] = Y[i] * X[i] + 1.0
    for i in range(N):
        S[0] += Y[i] * Y[i]


def _t_strided_step3(X, Y, S, **_):
    return _strided_ref(X, Y, S, 1, 3)


def _i_strided(n):
    def make(rng):
        return {"X": rng.normal(size=n), "Y": rng.normal(size=n), "S": rng.normal(size=1)}

    return make


# ----------------------------------------------------------------------------------------------------------
# negative step: `for i in range(N-1, -1, -1)`: Horner evaluation and an in-place backward recurrence


@dace.program
def lp_negative_step(C: f64[N], X: f64[N + 1], z: f64[1], S: f64[1]):
    for i in range(N - 1, -1, -1):
        X[i] = X[i] + 0.5 * np.sin(X[i + 1])
        S[0] = S[0] * z[0] + C[i] * X[i]


def _t_negative_step(C, X, z, S, **_):
    n = C.shape[0]
    x = list(X.unbind())
    s = S[0]
    for i in range(n - 1, -1, -1):
        x[i] = x[i] + 0.5 * torch.sin(x[i + 1])
        s = s * z[0] + C[i] * x[i]
    return s


def _i_negative_step(rng):
    n = 8
    return {"C": rng.normal(size=n), "X": rng.normal(size=n + 1), "z": rng.uniform(0.5, 0.9, 1),
            "S": rng.normal(size=1)}


# ----------------------------------------------------------------------------------------------------------
# if/else inside a loop on input data; both branches are taken and feed S differently


@dace.program
def lp_if_else(X: f64[N], Y: f64[N], S: f64[1]):
    for i in range(N):
        if X[i] > 0.0:
            Y[i] = X[i] * X[i]
            S[0] = S[0] * 0.9 + Y[i]
        else:
            Y[i] = np.sin(X[i]) * 3.0
            S[0] = S[0] * 0.8 + Y[i] * X[i]
    for i in range(N):
        S[0] += Y[i] * 0.5


def _t_if_else(X, S, **_):
    s = S[0]
    ys = []
    for i in range(X.shape[0]):
        if X[i] > 0.0:
            y = X[i] * X[i]
            s = s * 0.9 + y
        else:
            y = torch.sin(X[i]) * 3.0
            s = s * 0.8 + y * X[i]
        ys.append(y)
    return s + sum(y * 0.5 for y in ys)


def _i_if_else(rng):
    n = 10
    X = rng.uniform(0.2, 1.5, n) * np.tile([1.0, -1.0], n // 2)  # both signs, away from 0
    return {"X": X, "Y": _z(n), "S": _z(1)}


_i_if_else_in_map = _i_if_else


# ----------------------------------------------------------------------------------------------------------
# if/else on a loop-carried value (S itself): which branch runs depends on earlier iterations


@dace.program
def lp_conditional_accumulate(X: f64[N], S: f64[1]):
    for i in range(N):
        if S[0] > 2.0:
            S[0] = S[0] * 0.5 + X[i]
        else:
            S[0] = S[0] + X[i] * X[i]


def _t_conditional_accumulate(X, S, **_):
    s = S[0]
    for i in range(X.shape[0]):
        if s > 2.0:
            s = s * 0.5 + X[i]
        else:
            s = s + X[i] * X[i]
    return s


def _i_conditional_accumulate(rng):
    n = 10
    return {"X": rng.uniform(0.8, 1.6, n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# triangular loop nest: `for i in range(N): for j in range(i + 1)`


@dace.program
def lp_triangular(A: f64[N, N], x: f64[N], B: f64[N, N], S: f64[1]):
    for i in range(N):
        for j in range(i + 1):
            B[i, j] = A[i, j] * x[j] + B[i, j] * x[i]
            S[0] += B[i, j] * A[j, i]


def _t_triangular(A, x, B, S, **_):
    n = A.shape[0]
    s = S[0]
    for i in range(n):
        for j in range(i + 1):
            bij = A[i, j] * x[j] + B[i, j] * x[i]
            s = s + bij * A[j, i]
    return s


def _i_triangular(rng):
    n = 6
    return {"A": rng.normal(size=(n, n)), "x": rng.normal(size=n), "B": rng.normal(size=(n, n)),
            "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# first-order recurrence, in place: A[i] = f(A[i-1], A[i])


@dace.program
def lp_recurrence(A: f64[N], W: f64[N], S: f64[1]):
    for i in range(1, N):
        A[i] = np.sin(A[i - 1]) * W[i] + 0.5 * A[i]
    for i in range(N):
        S[0] += A[i] * A[i]


def _t_recurrence(A, W, S, **_):
    a = list(A.unbind())
    for i in range(1, A.shape[0]):
        a[i] = torch.sin(a[i - 1]) * W[i] + 0.5 * a[i]
    return S[0] + sum(v * v for v in a)


def _i_recurrence(rng):
    n = 9
    return {"A": rng.normal(size=n), "W": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# whole-array update each iteration: A[:] = g(A)


@dace.program
def lp_whole_array_update(A: f64[N], W: f64[N], S: f64[1]):
    for t in range(T):
        A[:] = np.tanh(A) * W + 0.1 * A
    for i in range(N):
        S[0] += A[i] * (i + 1.0)


def _t_whole_array_update(A, W, S, T=4, **_):
    for _t in range(T):
        A = torch.tanh(A) * W + 0.1 * A
    return S[0] + (A * torch.arange(1, A.shape[0] + 1, dtype=torch.float64)).sum()


def _i_whole_array_update(rng):
    n = 7
    return {"A": rng.normal(size=n), "W": rng.uniform(0.5, 1.5, n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# a sequential loop inside a dace.map body (the map body stays a nested SDFG with a LoopRegion in it)


@dace.program
def lp_map_of_loops(X: f64[N, M], Y: f64[N], S: f64[1]):
    for i in dace.map[0:N]:
        acc = X[i, 0]
        for j in range(1, M):
            acc = acc * 0.5 + np.sin(X[i, j]) * acc
        Y[i] = acc
    for i in dace.map[0:N]:
        S[0] += Y[i] * Y[i]


def _t_map_of_loops(X, S, **_):
    total = S[0]
    for i in range(X.shape[0]):
        acc = X[i, 0]
        for j in range(1, X.shape[1]):
            acc = acc * 0.5 + torch.sin(X[i, j]) * acc
        total = total + acc * acc
    return total


# ----------------------------------------------------------------------------------------------------------
# a data-dependent if/else inside a dace.map body (nested SDFG with a ConditionalBlock in it)


@dace.program
def lp_map_with_branch(X: f64[N], Y: f64[N], S: f64[1]):
    for i in dace.map[0:N]:
        if X[i] > 0.0:
            Y[i] = np.exp(-X[i]) * X[i]
        else:
            Y[i] = X[i] * X[i] * X[i]
    for i in dace.map[0:N]:
        S[0] += Y[i] * (i + 1.0)


def _t_map_with_branch(X, S, **_):
    total = S[0]
    for i in range(X.shape[0]):
        y = torch.exp(-X[i]) * X[i] if X[i] > 0.0 else X[i] * X[i] * X[i]
        total = total + y * (i + 1.0)
    return total


# ----------------------------------------------------------------------------------------------------------
# `break` on data inside a for loop, inside an outer loop (a search that stops at the first large element)


@dace.program
def lp_break_search(X: f64[M, N], S: f64[1]):
    for r in range(M):
        for i in range(N):
            S[0] += X[r, i] * X[r, i]
            if X[r, i] > 1.0:
                break
            S[0] += np.sin(X[r, i]) * X[r, i]


def _t_break_search(X, S, **_):
    total = S[0]
    for r in range(X.shape[0]):
        for i in range(X.shape[1]):
            total = total + X[r, i] * X[r, i]
            if X[r, i] > 1.0:
                break
            total = total + torch.sin(X[r, i]) * X[r, i]
    return total


def _i_break_search(rng):
    X = rng.uniform(-0.9, 0.9, size=(4, 7))
    X[0, 2] = 1.5  # row 0 breaks early, row 2 at its last element, rows 1 and 3 run to the end
    X[2, 6] = 1.7
    return {"X": X, "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# a dace.map body that updates its row in place (a nested SDFG whose connector A is both in and out)


@dace.program
def lp_map_inplace_rows(A: f64[N, M], W: f64[N, M], S: f64[1]):
    for i in dace.map[0:N]:
        for j in range(1, M):
            A[i, j] = A[i, j] + np.sin(A[i, j - 1]) * A[i, j - 1]
    for i in dace.map[0:N]:
        for j in dace.map[0:M]:
            S[0] += A[i, j] * W[i, j]


def _t_map_inplace_rows(A, W, S, **_):
    rows = []
    for i in range(A.shape[0]):
        row = [A[i, 0]]
        for j in range(1, A.shape[1]):
            row.append(A[i, j] + torch.sin(row[-1]) * row[-1])
        rows.append(torch.stack(row))
    return S[0] + (torch.stack(rows) * W).sum()


# ----------------------------------------------------------------------------------------------------------
# a data-dependent while loop inside a dace.map body (values stored per iteration: a growable tape, or a
# fixed one when the user bounds the loop)


@dace.program
def lp_map_of_while(X: f64[N], Y: f64[N], S: f64[1]):
    for i in dace.map[0:N]:
        y = X[i]
        while abs(y * y - X[i]) > 1e-10 * X[i]:
            y = 0.5 * (y + X[i] / y)
        Y[i] = y
    for i in dace.map[0:N]:
        S[0] += Y[i] * Y[i] * (i + 1.0)


def _t_map_of_while(X, S, **_):
    total = S[0]
    for i in range(X.shape[0]):
        y = X[i]
        while abs((y * y - X[i]).item()) > 1e-10 * X[i].item():  # condition on data, not differentiated
            y = 0.5 * (y + X[i] / y)
        total = total + y * y * (i + 1.0)
    return total


def _i_map_of_while(rng):
    n = 6
    return {"X": rng.uniform(0.5, 9.0, n), "Y": _z(n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# a growing prefix updated in place: the temporary `A[i] * A[:i + 1]` has the loop-dependent size i + 1


@dace.program
def lp_growing_prefix(A: f64[N], C: f64[N], S: f64[1]):
    for i in range(N):
        C[:i + 1] += A[i] * A[:i + 1]
    S[0] = np.sum(C * C)


def _t_growing_prefix(A, C, S, **_):
    for i in range(A.shape[0]):
        C = setitem(C, slice(0, i + 1), C[:i + 1] + A[i] * A[:i + 1])
    return (C * C).sum()


# ----------------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------------
# matrix and vector products on slices inside loops (the DaCe forms NPBench uses for cholesky, lu, trisolv,
# doitgen and covariance), and the row-to-column copy of covariance


@dace.program
def lp_cholesky_dot(A: f64[N, N], W: f64[N, N], S: f64[1]):
    A[0, 0] = np.sqrt(A[0, 0])
    for i in range(1, N):
        for j in range(i):
            A[i, j] -= np.dot(A[i, :j], A[j, :j])
            A[i, j] /= A[j, j]
        A[i, i] -= np.dot(A[i, :i], A[i, :i])
        A[i, i] = np.sqrt(A[i, i])
    S[0] = np.sum(A * W)


def _t_cholesky_dot(A, W, **_):
    n = A.shape[0]
    a = element_rows(A)
    a[0][0] = torch.sqrt(a[0][0])
    for i in range(1, n):
        for j in range(i):
            a[i][j] = (a[i][j] - list_dot(a[i][:j], a[j][:j])) / a[j][j]
        a[i][i] = torch.sqrt(a[i][i] - list_dot(a[i][:i], a[i][:i]))
    return (stack_rows(a) * W).sum()


def _i_cholesky_dot(rng):
    n = 5
    B = rng.normal(size=(n, n))
    return {"A": B @ B.T / n + np.eye(n), "W": rng.normal(size=(n, n)), "S": _z(1)}


@dace.program
def lp_lu_slices(A: f64[N, N], W: f64[N, N], S: f64[1]):
    for i in range(N):
        for j in range(i):
            A[i, j] -= A[i, :j] @ A[:j, j]
            A[i, j] /= A[j, j]
        for j in range(i, N):
            A[i, j] -= A[i, :i] @ A[:i, j]
    S[0] = np.sum(A * W)


def _t_lu_slices(A, W, **_):
    return _t_lu(A, W, torch.zeros(1, dtype=torch.float64))


@dace.program
def _trisolv_dot(L: f64[N, N], x: f64[N], b: f64[N], S: f64[1]):
    for i in range(N):
        x[i] = np.dot(L[i, :i], x[:i])
        x[i] = (b[i] - x[i]) / L[i, i]
    for i in range(N):
        S[0] += x[i] * x[i] * (i + 1)


def lp_trisolv_dot() -> dace.SDFG:
    """trisolv whose Dot writes its result straight into x[i], one element of a larger array. The frontend
    stores np.dot's result in a scalar that a tasklet assigns to x[i]; the builder drops both."""
    sdfg = parse(_trisolv_dot)
    sdfg.name = "lp_trisolv_dot"
    for state in sdfg.states():
        for dot in [n for n in state.nodes() if isinstance(n, Dot)]:
            (out,) = state.out_edges(dot)
            scalar = out.dst  # dot -> scalar -> assignment tasklet -> x[i]
            (read,) = state.out_edges(scalar)
            (write,) = state.out_edges(read.dst)
            state.add_edge(dot, "_result", write.dst, None, dace.Memlet(data=write.dst.data, subset=write.data.subset))
            state.remove_nodes_from([scalar, read.dst])
    return sdfg


def _t_trisolv_dot(L, b, S, **_):
    n = L.shape[0]
    x: list[torch.Tensor] = []
    for i in range(n):
        x.append((b[i] - list_dot([L[i, j] for j in range(i)], x)) / L[i, i])
    return S[0] + sum(x[i] * x[i] * (i + 1) for i in range(n))


def _i_trisolv_dot(rng):
    out = _i_trisolv(rng)
    out["L"], out["b"], out["x"] = out["L"][:6, :6], out["b"][:6], out["x"][:6]
    return out


@dace.program
def lp_doitgen(A: f64[N, M, K], C4: f64[K, K], W: f64[N, M, K], S: f64[1]):
    for r in range(N):
        A[r, :, :] = np.reshape(np.reshape(A[r], (M, K)) @ C4, (M, K))
    S[0] = np.sum(A * W)


def _t_doitgen(A, C4, W, **_):
    return (torch.stack([A[r] @ C4 for r in range(A.shape[0])]) * W).sum()


@dace.program
def lp_covariance(data: f64[N, M], W: f64[M, M], S: f64[1]):
    mean = np.mean(data, axis=0)
    d = data - mean
    cov = np.zeros((M, M), dtype=data.dtype)
    for i in range(M):
        cov[i, i:M] = d[:, i] @ d[:, i:M] / (np.float64(N) - 1.0)
        cov[i:M, i] = cov[i, i:M]
    S[0] = np.sum(cov * W)


def _t_covariance(data, W, **_):
    d = data - data.mean(0)
    return (d.T @ d / (data.shape[0] - 1.0) * W).sum()


def _with_t(fn, t):
    """Bind the time-step count (a DaCe symbol) into a torch reference."""

    def ref(**kw):
        return fn(T=t, **kw)

    ref.__name__ = fn.__name__
    return ref


# ----------------------------------------------------------------------------------------------------------
# correlation-style normalisation: a masked assignment `sd[sd <= 0.5] = 1.0` (a conditional write), then the
# columns divided by sd in place inside a loop, and a data-dependent gather inside the loop


@dace.program
def lp_masked_normalise(X: f64[N, M], W: f64[N, M], idx: dace.int64[M], S: f64[1]):
    sd = np.sqrt(np.sum(X * X, axis=0) / N)
    sd[sd <= 0.5] = 1.0
    for i in range(N):
        X[i, :] = X[i, :] / sd
    for i in range(N):
        for j in dace.map[0:M]:
            S[0] += X[i, idx[j]] * W[i, j]


def _t_masked_normalise(X, W, idx, S, **_):
    sd = torch.sqrt((X * X).mean(0))
    sd = torch.where(sd <= 0.5, torch.ones_like(sd), sd)
    X = X / sd
    return S[0] + (X[:, idx.long()] * W).sum()


def _i_masked_normalise(rng):
    n, m = 6, 4
    X = rng.normal(size=(n, m))
    X[:, 1] *= 0.1  # a column with sd <= 0.5: the mask writes 1.0 there
    X[:, 2] += 2.0 * np.sign(X[:, 2])  # sd well above 0.5
    idx = rng.integers(0, m, m).astype(np.int64)
    idx[0] = 1
    return {"X": X, "W": rng.normal(size=(n, m)), "idx": idx, "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# gather and in-place scatter through an index array inside a sequential loop (duplicate indices: a later
# iteration reads what an earlier one wrote)


@dace.program
def lp_indexed_updates(A: f64[N], idx: dace.int64[M], V: f64[M], S: f64[1]):
    for i in range(M):
        S[0] += A[idx[i]] * V[i]
        A[idx[i]] = A[idx[i]] * 0.5 + np.sin(V[i])
    S[0] += np.sum(A * A)


def _t_indexed_updates(A, idx, V, S, **_):
    total = S[0]
    for i, k in enumerate(idx.long().tolist()):
        total = total + A[k] * V[i]
        A = setitem(A, k, A[k] * 0.5 + torch.sin(V[i]))
    return total + (A * A).sum()


def _i_indexed_updates(rng):
    n, m = 6, 7
    idx = rng.integers(0, n, m).astype(np.int64)
    idx[3] = idx[1]  # a duplicate
    return {"A": rng.normal(size=n), "idx": idx, "V": rng.normal(size=m), "S": _z(1)}


CASES: list[Case] = [
    Case("lp_cholesky_dot", lp_cholesky_dot, _t_cholesky_dot, ("A", "W"), "S", _i_cholesky_dot, {"N": 5},
         "cholesky with np.dot of row slices A[i, :j], A[j, :j] (Dot on 2-D subsets), in place"),
    Case("lp_lu_slices", lp_lu_slices, _t_lu_slices, ("A", "W"), "S", _i_lu, {"N": 6},
         "lu with row-slice @ column-slice products A[i, :j] @ A[:j, j], in place"),
    Case("lp_trisolv_dot", BuiltProgram(lp_trisolv_dot, ("L", "x", "b", "S")), _t_trisolv_dot, ("L", "b"), "S",
         _i_trisolv_dot, {"N": 6}, "trisolv with a Dot writing x[i], one element of the vector it reads"),
    Case("lp_doitgen", lp_doitgen, _t_doitgen, ("A", "C4", "W"), "S",
         _inputs(A=(3, 4, 3), C4=(3, 3), W=(3, 4, 3)), {"N": 3, "M": 4, "K": 3},
         "doitgen: A[r] = reshape(reshape(A[r]) @ C4), a 3-D slice as a matrix, in place"),
    Case("lp_covariance", lp_covariance, _t_covariance, ("data", "W"), "S", _inputs(data=(6, 4), W=(4, 4)),
         {"N": 6, "M": 4}, "covariance: column @ column block into a row, mirrored by cov[i:M, i] = cov[i, i:M]"),
    Case("lp_jacobi_1d", lp_jacobi_1d, _with_t(_t_jacobi_1d, 3), ("A", "B"), "S",
         _inputs(A=(10,), B=(10,)), {"N": 10, "T": 3}, "PolyBench jacobi_1d, slices inside a time loop"),
    Case("lp_jacobi_2d", lp_jacobi_2d, _with_t(_t_jacobi_2d, 3), ("A", "B"), "S",
         _inputs(A=(7, 7), B=(7, 7)), {"N": 7, "T": 3}, "PolyBench jacobi_2d, loop from 1"),
    Case("lp_heat_3d", lp_heat_3d, _with_t(_t_heat_3d, 3), ("A", "B"), "S",
         _inputs(A=(5, 5, 5), B=(5, 5, 5)), {"N": 5, "T": 3}, "PolyBench heat_3d, 3-D slices in a loop"),
    Case("lp_seidel_2d", lp_seidel_2d, _with_t(_t_seidel_2d, 3), ("A",), "S",
         _inputs(A=(6, 6)), {"N": 6, "T": 3}, "NPBench seidel_2d, in-place Gauss-Seidel sweeps"),
    Case("lp_go_fast", lp_go_fast, _t_go_fast, ("A",), "S",
         _inputs(A=(6, 6), B=(6, 6)), {"N": 6}, "NPBench go_fast, tanh of trace by a scalar loop"),
    Case("lp_softmax", lp_softmax, _t_softmax, ("X", "W"), "S", _i_softmax, {"N": 5, "M": 6},
         "row softmax with max-subtraction in explicit loops (max())"),
    Case("lp_trisolv", lp_trisolv, _t_trisolv, ("L", "b"), "S", _i_trisolv, {"N": 7},
         "PolyBench trisolv, forward substitution with a scalar accumulator"),
    Case("lp_lu", lp_lu, _t_lu, ("A", "W"), "S", _i_lu, {"N": 6}, "PolyBench lu, in place"),
    Case("lp_durbin", lp_durbin, _t_durbin, ("r",), "S", _i_durbin, {"N": 8},
         "PolyBench durbin, loop-carried scalars alpha/beta, reversed indexing"),
    Case("lp_vadv_sweeps", lp_vadv_sweeps, _t_vadv_sweeps, ("a", "b", "c", "d"), "S", _i_vadv_sweeps,
         {"N": 4, "K": 7}, "vadv-style tridiagonal solve: forward sweep, backward sweep"),
    Case("lp_newton_sqrt", lp_newton_sqrt, _t_newton_sqrt, ("A",), "S", _i_newton_sqrt, {"N": 6},
         "Newton sqrt, while loop with a data-dependent tolerance condition (growable tape, no bound)"),
    Case("lp_newton_sqrt_capped", lp_newton_sqrt, _t_newton_sqrt, ("A",), "S", _i_newton_sqrt, {"N": 6},
         "Newton sqrt with a user bound of 64 iterations: a fixed-size tape", loop_bounds={"*": 64}),
    Case("lp_strided_step2", lp_strided_step2, _t_strided_step2, ("X", "Y"), "S", _i_strided(10),
         {"N": 10}, "for i in range(0, N, 2), N even, loop-carried S"),
    Case("lp_strided_step2_odd", lp_strided_step2_odd, _t_strided_step2, ("X", "Y"), "S", _i_strided(9),
         {"N": 9}, "for i in range(0, N, 2), N odd: last value N-1 != stop - step"),
    Case("lp_strided_step3", lp_strided_step3, _t_strided_step3, ("X", "Y"), "S", _i_strided(9),
         {"N": 9}, "for i in range(1, N, 3), N = 9: last value 7 != stop - step"),
    Case("lp_negative_step", lp_negative_step, _t_negative_step, ("C", "X", "z"), "S", _i_negative_step,
         {"N": 8}, "for i in range(N-1, -1, -1): Horner + in-place backward recurrence"),
    Case("lp_if_else", lp_if_else, _t_if_else, ("X",), "S", _i_if_else, {"N": 10},
         "if/else on input data inside a loop, both branches taken"),
    Case("lp_conditional_accumulate", lp_conditional_accumulate, _t_conditional_accumulate, ("X", "S"), "S",
         _i_conditional_accumulate, {"N": 10}, "if/else on the loop-carried accumulator"),
    Case("lp_conditional_accumulate_checkpointed", lp_conditional_accumulate, _t_conditional_accumulate,
         ("X", "S"), "S", _i_conditional_accumulate, {"N": 10},
         "the same, checkpointed (2 snapshots): the step branches on a symbol it computes from data",
         forwarding=Forwarding.checkpoint(snapshots=2, sizes={"N": 10})),
    Case("lp_triangular", lp_triangular, _t_triangular, ("A", "x", "B"), "S", _i_triangular, {"N": 6},
         "triangular nest for j in range(i + 1)"),
    Case("lp_recurrence", lp_recurrence, _t_recurrence, ("A", "W"), "S", _i_recurrence, {"N": 9},
         "in-place recurrence A[i] = f(A[i-1], A[i])"),
    Case("lp_whole_array_update", lp_whole_array_update, _with_t(_t_whole_array_update, 4), ("A", "W"), "S",
         _i_whole_array_update, {"N": 7, "T": 4}, "A[:] = g(A) every iteration"),
    Case("lp_whole_array_update_checkpointed", lp_whole_array_update, _with_t(_t_whole_array_update, 4), ("A", "W"),
         "S", _i_whole_array_update, {"N": 7, "T": 4}, "the same, reversed by binomial checkpointing (2 snapshots)",
         forwarding=Forwarding.checkpoint(snapshots=2, sizes={"N": 7, "T": 4})),
    Case("lp_map_of_loops", lp_map_of_loops, _t_map_of_loops, ("X",), "S",
         _inputs(X=(5, 6), Y=(5,)), {"N": 5, "M": 6}, "sequential loop inside a dace.map body"),
    Case("lp_map_with_branch", lp_map_with_branch, _t_map_with_branch, ("X",), "S", _i_if_else_in_map,
         {"N": 10}, "data-dependent if/else inside a dace.map body"),
    Case("lp_break_search", lp_break_search, _t_break_search, ("X",), "S", _i_break_search,
         {"M": 4, "N": 7}, "break on data inside a for loop nested in another loop"),
    Case("lp_growing_prefix", lp_growing_prefix, _t_growing_prefix, ("A", "C"), "S", _inputs(A=(6,), C=(6,)),
         {"N": 6}, "C[:i+1] += A[i] * A[:i+1]: a temporary of loop-dependent size (i + 1)"),
    Case("lp_map_inplace_rows", lp_map_inplace_rows, _t_map_inplace_rows, ("A", "W"), "S",
         _inputs(A=(4, 6), W=(4, 6)), {"N": 4, "M": 6}, "a dace.map body updating its row in place (in/out)"),
    Case("lp_map_of_while", lp_map_of_while, _t_map_of_while, ("X",), "S", _i_map_of_while, {"N": 6},
         "a data-dependent while loop inside a dace.map body (growable tape in the nested SDFG)"),
    Case("lp_map_of_while_capped", lp_map_of_while, _t_map_of_while, ("X",), "S", _i_map_of_while, {"N": 6},
         "a data-dependent while loop inside a dace.map body, bounded by the user", loop_bounds={"*": 64}),
    Case("lp_masked_normalise", lp_masked_normalise, _t_masked_normalise, ("X", "W"), "S", _i_masked_normalise,
         {"N": 6, "M": 4}, "sd[sd <= 0.5] = 1.0, columns divided in place in a loop, a gather X[i, idx[j]] in a map"),
    Case("lp_indexed_updates", lp_indexed_updates, _t_indexed_updates, ("A", "V"), "S", _i_indexed_updates,
         {"N": 6, "M": 7}, "S += A[idx[i]] * V[i]; A[idx[i]] = f(A[idx[i]], V[i]) in a for loop, duplicates"),
    *_UNSTRUCTURED,
]

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}
