"""Dataflow corpus: loop-free `@dace.program`s (no Python loops except `dace.map`, no program-level if/else),
each paired with a PyTorch reference. See `case.py` for the conventions of `Case`.

Most cases reduce into `S` through write-conflict resolution (`S[0] += ...` inside a `dace.map`); the
`df_lib_*` cases use `np.sum` / `np.mean` / `np.max` (DaCe library nodes) on purpose.
"""

from __future__ import annotations

import dace
import numpy as np
import torch

from .case import BuiltProgram, Case, setitem

N = dace.symbol("N")
M = dace.symbol("M")
H = dace.symbol("H")
W = dace.symbol("W")
CB = dace.symbol("CB")

f64 = dace.float64

_SIZES = {"N": 7, "M": 5, "H": 4}


def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float64)


def _sum_into(S: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Value of S[0] after `S[0] += value` (accumulation into the caller-provided S)."""
    return S[0] + value


# ----------------------------------------------------------------------------------------------------------
# 1. elementwise chain: exp, sin, tanh, sqrt


@dace.program
def df_elementwise_chain(X: f64[N], S: f64[1]):
    T = np.exp(np.sin(X)) * np.tanh(X) + np.sqrt(X * X + 1.0)
    for i in dace.map[0:N]:
        S[0] += T[i]


def _t_elementwise_chain(X, S, **_):
    T = torch.exp(torch.sin(X)) * torch.tanh(X) + torch.sqrt(X * X + 1.0)
    return _sum_into(S, T.sum())


def _i_elementwise_chain(rng):
    n = _SIZES["N"]
    return {"X": rng.uniform(-2.0, 2.0, n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 2. log and powers (integer, fractional, array ** array) on positive inputs


@dace.program
def df_log_pow(X: f64[N], Y: f64[N], S: f64[1]):
    T = np.log(X) * X**3 + X**1.5 - np.log(Y + X) / Y + X**Y
    for i in dace.map[0:N]:
        S[0] += T[i]


def _t_log_pow(X, Y, S, **_):
    T = torch.log(X) * X**3 + X**1.5 - torch.log(Y + X) / Y + X**Y
    return _sum_into(S, T.sum())


def _i_log_pow(rng):
    n = _SIZES["N"]
    return {"X": rng.uniform(0.5, 2.0, n), "Y": rng.uniform(0.5, 2.0, n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 3. non-smooth elementwise functions away from their kinks: abs, maximum, minimum, relu


@dace.program
def df_abs_max_min(X: f64[N], Y: f64[N], S: f64[1]):
    T = np.abs(X - Y) + 2.0 * np.maximum(X, Y) + np.minimum(X, Y) ** 2 + np.maximum(X, 0.0) * Y
    for i in dace.map[0:N]:
        S[0] += T[i]


def _t_abs_max_min(X, Y, S, **_):
    T = torch.abs(X - Y) + 2.0 * torch.maximum(X, Y) + torch.minimum(X, Y) ** 2 + torch.clamp(X, min=0.0) * Y
    return _sum_into(S, T.sum())


def _i_abs_max_min(rng):
    n = _SIZES["N"]
    # |X| >= 0.3 (relu kink), |X - Y| >= 0.3 (abs/max/min kinks)
    X = rng.uniform(0.3, 1.5, n) * rng.choice([-1.0, 1.0], n)
    Y = X + rng.uniform(0.3, 1.0, n) * rng.choice([-1.0, 1.0], n)
    return {"X": X, "Y": Y, "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 4. division, subtraction, negation, sigmoid


@dace.program
def df_div_sigmoid(A: f64[N], B: f64[N], S: f64[1]):
    T = (A - B) / (A * A + B * B + 1.0) + 1.0 / (1.0 + np.exp(-A)) - B / 3.0
    for i in dace.map[0:N]:
        S[0] += T[i]


def _t_div_sigmoid(A, B, S, **_):
    T = (A - B) / (A * A + B * B + 1.0) + 1.0 / (1.0 + torch.exp(-A)) - B / 3.0
    return _sum_into(S, T.sum())


def _i_div_sigmoid(rng):
    n = _SIZES["N"]
    return {"A": rng.normal(size=n), "B": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 5. 2-D map with a WCR reduction straight from a tasklet (no intermediate array)


@dace.program
def df_wcr_2d(A: f64[N, M], B: f64[N, M], S: f64[1]):
    for i, j in dace.map[0:N, 0:M]:
        S[0] += A[i, j] * B[i, j] + A[i, j] * A[i, j] * 0.5


def _t_wcr_2d(A, B, S, **_):
    return _sum_into(S, (A * B + A * A * 0.5).sum())


def _i_wcr_2d(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=(n, m)), "B": rng.normal(size=(n, m)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 6. broadcasting: vector + matrix rows, matrix * column vector, scalar (1-element array) * array


@dace.program
def df_broadcast(A: f64[N, M], v: f64[M], w: f64[N], alpha: f64[1], S: f64[1]):
    C = alpha[0] * (A + v)
    D = C * w[:, np.newaxis] + 2.5 * C
    for i, j in dace.map[0:N, 0:M]:
        S[0] += D[i, j] * C[i, j]


def _t_broadcast(A, v, w, alpha, S, **_):
    C = alpha[0] * (A + v)
    D = C * w[:, None] + 2.5 * C
    return _sum_into(S, (D * C).sum())


def _i_broadcast(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=(n, m)), "v": rng.normal(size=m), "w": rng.normal(size=n),
            "alpha": rng.uniform(0.5, 1.5, 1), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 7. slices: shifted 1-D windows and matrix columns


@dace.program
def df_slices(A: f64[N], B: f64[N, M], S: f64[1]):
    U = A[1:N - 1] * A[0:N - 2] + np.sin(A[2:N])
    c = B[:, 0] * B[:, M - 1] + A
    for i in dace.map[0:N - 2]:
        S[0] += U[i]
    for i in dace.map[0:N]:
        S[0] += c[i] * c[i]


def _t_slices(A, B, S, **_):
    n = A.shape[0]
    U = A[1:n - 1] * A[0:n - 2] + torch.sin(A[2:n])
    c = B[:, 0] * B[:, -1] + A
    return _sum_into(S, U.sum() + (c * c).sum())


def _i_slices(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=n), "B": rng.normal(size=(n, m)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 8. strided slices: X[::2], X[1::2] (X has 2*H elements) and a strided write Y[::3] (Y has 3*H)
# (sizes are multiples of the stride: DaCe 2.0.0b1 emits `i < ceil((2*H)/3)` for X[::3], which g++ rejects
# as an OpenMP loop predicate, and cannot broadcast X[::2] with X[1::2] when X has a symbolic size N)


@dace.program
def df_strided(X: f64[2 * H], Y: f64[3 * H], S: f64[1]):
    T = X[::2] * np.cos(X[1::2])
    Y[::3] = np.exp(X[1::2])
    for i in dace.map[0:H]:
        S[0] += T[i]
    for i in dace.map[0:3 * H]:
        S[0] += Y[i] * Y[i]


def _t_strided(X, Y, S, **_):
    T = X[::2] * torch.cos(X[1::2])
    Y2 = Y.clone()
    Y2[::3] = torch.exp(X[1::2])
    return _sum_into(S, T.sum() + (Y2 * Y2).sum())


def _i_strided(rng):
    h = _SIZES["H"]
    # Y is an in/out array: the entries not on the stride keep their (nonzero) initial values.
    return {"X": rng.normal(size=2 * h), "Y": rng.normal(size=3 * h), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 9. a transient written, read, overwritten, read again


@dace.program
def df_overwrite_transient(X: f64[N], S: f64[1]):
    T = X * 2.0
    U = np.sin(T)
    T[:] = U * X
    V = T * U + T
    for i in dace.map[0:N]:
        S[0] += V[i]


def _t_overwrite_transient(X, S, **_):
    T = X * 2.0
    U = torch.sin(T)
    T = U * X
    V = T * U + T
    return _sum_into(S, V.sum())


def _i_overwrite_transient(rng):
    return {"X": rng.normal(size=_SIZES["N"]), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 10. an output (non-transient) array written, read, overwritten, read again


@dace.program
def df_overwrite_output(X: f64[N], Y: f64[N], S: f64[1]):
    Y[:] = np.exp(X)
    Z = Y * X
    Y[:] = Z + np.cos(Y)
    for i in dace.map[0:N]:
        S[0] += Y[i] * Z[i]


def _t_overwrite_output(X, S, **_):
    Y = torch.exp(X)
    Z = Y * X
    Y = Z + torch.cos(Y)
    return _sum_into(S, (Y * Z).sum())


def _i_overwrite_output(rng):
    return {"X": rng.uniform(-1.0, 1.0, _SIZES["N"]), "Y": _z(_SIZES["N"]), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 11. an input array updated in place before (and after) being used; gradient w.r.t. its initial value


@dace.program
def df_inplace_input(X: f64[N], W: f64[N], S: f64[1]):
    X[:] = X * 2.0
    T = np.tanh(X) * X
    X[:] = T + X * W
    for i in dace.map[0:N]:
        S[0] += X[i] * W[i]


def _t_inplace_input(X, W, S, **_):
    X1 = X * 2.0
    T = torch.tanh(X1) * X1
    X2 = T + X1 * W
    return _sum_into(S, (X2 * W).sum())


def _i_inplace_input(rng):
    n = _SIZES["N"]
    return {"X": rng.normal(size=n), "W": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 12. explicit tasklets with two outputs


@dace.program
def df_multi_output_tasklet(X: f64[N], Y: f64[N], P: f64[N], Q: f64[N], S: f64[1]):
    for i in dace.map[0:N]:
        with dace.tasklet:
            a << X[i]
            b << Y[i]
            c >> P[i]
            d >> Q[i]
            c = a * b
            d = a + sin(b)
    for i in dace.map[0:N]:
        with dace.tasklet:
            p << P[i]
            q << Q[i]
            s >> S(1, lambda x, y: x + y)[0]
            s = p * q + exp(q) * 0.25


def _t_multi_output_tasklet(X, Y, S, **_):
    P = X * Y
    Q = X + torch.sin(Y)
    return _sum_into(S, (P * Q + torch.exp(Q) * 0.25).sum())


def _i_multi_output_tasklet(rng):
    n = _SIZES["N"]
    return {"X": rng.normal(size=n), "Y": rng.normal(size=n), "P": _z(n), "Q": _z(n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 13. several states in sequence: a reduced value is read back by later computations; S is reset first


@dace.program
def df_states_sequence(X: f64[N], Y: f64[N], s: f64[1], S: f64[1]):
    for i in dace.map[0:N]:
        s[0] += X[i] * X[i]
    Y[:] = X / np.sqrt(s[0] + 1.0)
    Y[0] = Y[N - 1] * Y[1] + Y[0]
    Y[1:N] = Y[0:N - 1] * 0.5 + Y[1:N]
    s[0] = Y[0] + s[0]
    S[0] = 0.0
    for i in dace.map[0:N]:
        S[0] += np.sin(Y[i]) * X[i]
    S[0] = S[0] * s[0]


def _t_states_sequence(X, Y, s, S, **_):
    s1 = s[0] + (X * X).sum()
    Y1 = X / torch.sqrt(s1 + 1.0)
    Y2 = torch.cat([(Y1[-1] * Y1[1] + Y1[0]).reshape(1), Y1[1:]])
    Y3 = torch.cat([Y2[0:1], Y2[:-1] * 0.5 + Y2[1:]])
    s2 = Y3[0] + s1
    return (torch.sin(Y3) * X).sum() * s2


def _i_states_sequence(rng):
    n = _SIZES["N"]
    # S holds garbage on entry (it is reset by the program); s starts at zero.
    return {"X": rng.normal(size=n), "Y": _z(n), "s": _z(1), "S": rng.normal(size=1)}


# ----------------------------------------------------------------------------------------------------------
# 14. one array read many times, in many expressions


@dace.program
def df_read_many(X: f64[N], S: f64[1]):
    T = X * X + X * np.sin(X) + X / (1.0 + X * X) + np.exp(-X * X) * X
    for i in dace.map[0:N]:
        S[0] += T[i] * X[i] + X[i]


def _t_read_many(X, S, **_):
    T = X * X + X * torch.sin(X) + X / (1.0 + X * X) + torch.exp(-X * X) * X
    return _sum_into(S, (T * X + X).sum())


def _i_read_many(rng):
    return {"X": rng.normal(size=_SIZES["N"]), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 15. explicitly allocated transients filled by maps


@dace.program
def df_transients(A: f64[N, M], S: f64[1]):
    T = np.ndarray([N, M], dtype=np.float64)
    U = np.ndarray([N], dtype=np.float64)
    for i, j in dace.map[0:N, 0:M]:
        T[i, j] = np.tanh(A[i, j]) * A[i, j]
    for i in dace.map[0:N]:
        U[i] = T[i, 0] + T[i, M - 1] * 2.0
    for i, j in dace.map[0:N, 0:M]:
        S[0] += T[i, j] * U[i]


def _t_transients(A, S, **_):
    T = torch.tanh(A) * A
    U = T[:, 0] + T[:, -1] * 2.0
    return _sum_into(S, (T * U[:, None]).sum())


def _i_transients(rng):
    return {"A": rng.normal(size=(_SIZES["N"], _SIZES["M"])), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 16. nested dace.map: matrix-vector product with WCR into y, then a nonlinear reduction


@dace.program
def df_nested_map(A: f64[N, M], x: f64[M], y: f64[N], S: f64[1]):
    for i in dace.map[0:N]:
        for j in dace.map[0:M]:
            y[i] += A[i, j] * x[j]
    for i in dace.map[0:N]:
        S[0] += np.tanh(y[i])


def _t_nested_map(A, x, y, S, **_):
    return _sum_into(S, torch.tanh(y + A @ x).sum())


def _i_nested_map(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=(n, m)) * 0.5, "x": rng.normal(size=m), "y": _z(n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 17. 2-D five-point stencil written with shifted slices (no loops), applied twice


@dace.program
def df_stencil_2d(A: f64[N, M], B: f64[N, M], S: f64[1]):
    B[1:N - 1, 1:M - 1] = 0.2 * (A[1:N - 1, 1:M - 1] + A[0:N - 2, 1:M - 1] + A[2:N, 1:M - 1]
                                 + A[1:N - 1, 0:M - 2] + A[1:N - 1, 2:M])
    C = np.sin(B)
    for i, j in dace.map[1:N - 1, 1:M - 1]:
        S[0] += C[i, j] * (C[i - 1, j] + C[i + 1, j] + C[i, j - 1] + C[i, j + 1])


def _t_stencil_2d(A, B, S, **_):
    inner = 0.2 * (A[1:-1, 1:-1] + A[:-2, 1:-1] + A[2:, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:])
    B2 = B.clone()
    B2[1:-1, 1:-1] = inner
    C = torch.sin(B2)
    val = C[1:-1, 1:-1] * (C[:-2, 1:-1] + C[2:, 1:-1] + C[1:-1, :-2] + C[1:-1, 2:])
    return _sum_into(S, val.sum())


def _i_stencil_2d(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    # B's border is never written by the program: it keeps its (nonzero) initial values.
    return {"A": rng.normal(size=(n, m)), "B": rng.normal(size=(n, m)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 18. row softmax without library nodes: max via a WCR-max tasklet, sum via WCR-sum


@dace.program
def df_softmax_wcr(X: f64[N, M], W: f64[N, M], S: f64[1]):
    mx = np.ndarray([N], dtype=np.float64)
    den = np.ndarray([N], dtype=np.float64)
    for i in dace.map[0:N]:
        mx[i] = -1e300
        den[i] = 0.0
    for i, j in dace.map[0:N, 0:M]:
        with dace.tasklet:
            a << X[i, j]
            o >> mx(1, lambda x, y: max(x, y))[i]
            o = a
    E = np.ndarray([N, M], dtype=np.float64)
    for i, j in dace.map[0:N, 0:M]:
        E[i, j] = np.exp(X[i, j] - mx[i])
    for i, j in dace.map[0:N, 0:M]:
        den[i] += E[i, j]
    for i, j in dace.map[0:N, 0:M]:
        S[0] += E[i, j] / den[i] * W[i, j]


def _t_softmax_wcr(X, W, S, **_):
    E = torch.exp(X - X.max(dim=1, keepdim=True).values)
    P = E / E.sum(dim=1, keepdim=True)
    return _sum_into(S, (P * W).sum())


def _i_softmax_wcr(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    # distinct entries per row: the row maximum is unique
    X = np.stack([rng.permutation(m) * 0.7 + rng.uniform(0.0, 0.2, m) for _ in range(n)])
    return {"X": X, "W": rng.normal(size=(n, m)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 19. `of` depends on X and Y only; Z feeds another output. d S / d Z must be all zeros.


@dace.program
def df_partial_dependence(X: f64[N], Y: f64[N], Z: f64[N], Out: f64[N], S: f64[1]):
    Out[:] = np.exp(Z) * X
    T = X * Y + np.sin(Y)
    for i in dace.map[0:N]:
        S[0] += T[i]


def _t_partial_dependence(X, Y, S, **_):
    return _sum_into(S, (X * Y + torch.sin(Y)).sum())


def _i_partial_dependence(rng):
    n = _SIZES["N"]
    return {"X": rng.normal(size=n), "Y": rng.normal(size=n), "Z": rng.normal(size=n), "Out": _z(n),
            "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# 20-23. library nodes: np.sum, np.mean, np.sum(axis=...), np.max


@dace.program
def df_lib_sum(X: f64[N], Y: f64[N], S: f64[1]):
    S[0] = np.sum(np.exp(X) * Y)


def _t_lib_sum(X, Y, **_):
    return (torch.exp(X) * Y).sum()


def _i_lib_sum(rng):
    n = _SIZES["N"]
    return {"X": rng.normal(size=n), "Y": rng.normal(size=n), "S": _z(1)}


@dace.program
def df_lib_mean(A: f64[N, M], S: f64[1]):
    S[0] = np.mean(A * np.sin(A))


def _t_lib_mean(A, **_):
    return (A * torch.sin(A)).mean()


def _i_lib_mean(rng):
    return {"A": rng.normal(size=(_SIZES["N"], _SIZES["M"])), "S": _z(1)}


@dace.program
def df_lib_sum_axis(A: f64[N, M], v: f64[M], S: f64[1]):
    r = np.sum(A * A, axis=0)
    c = np.sum(A, axis=1)
    S[0] = np.sum(r * v) + np.sum(np.tanh(c))


def _t_lib_sum_axis(A, v, **_):
    return ((A * A).sum(dim=0) * v).sum() + torch.tanh(A.sum(dim=1)).sum()


def _i_lib_sum_axis(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=(n, m)), "v": rng.normal(size=m), "S": _z(1)}


@dace.program
def df_lib_softmax(X: f64[N, M], W: f64[N, M], S: f64[1]):
    mx = np.max(X, axis=1)
    E = np.exp(X - mx[:, np.newaxis])
    den = np.sum(E, axis=1)
    P = E / den[:, np.newaxis]
    S[0] = np.sum(P * W)


def _t_lib_softmax(X, W, **_):
    return (torch.softmax(X, dim=1) * W).sum()


_i_lib_softmax = _i_softmax_wcr


# ----------------------------------------------------------------------------------------------------------

_N = {"N": _SIZES["N"]}
_NM = {"N": _SIZES["N"], "M": _SIZES["M"]}
_NMH = {"N": _SIZES["N"], "M": _SIZES["M"], "H": _SIZES["H"]}

# ----------------------------------------------------------------------------------------------------------
# a call of a two-state nested SDFG (built with the API: the frontend inlines calls it can)


def df_nested_call() -> dace.SDFG:
    inner = dace.SDFG("df_nested_call_body")
    inner.add_array("x", [N], f64)
    inner.add_array("y", [N], f64)
    inner.add_transient("t", [N], f64)
    first = inner.add_state("exp", is_start_block=True)
    first.add_mapped_tasklet("e", {"i": "0:N"}, {"a": dace.Memlet("x[i]")}, "b = exp(a)",
                             {"b": dace.Memlet("t[i]")}, external_edges=True)
    second = inner.add_state_after(first, "combine")
    second.add_mapped_tasklet("m", {"i": "0:N"}, {"a": dace.Memlet("t[i]"), "c": dace.Memlet("x[i]")},
                              "b = a * c + sin(c)", {"b": dace.Memlet("y[i]")}, external_edges=True)
    outer = dace.SDFG("df_nested_call")
    for name in ("X", "Y", "W"):
        outer.add_array(name, [N], f64)
    outer.add_array("S", [1], f64)
    call = outer.add_state("call", is_start_block=True)
    node = call.add_nested_sdfg(inner, {"x"}, {"y"}, {"N": "N"})
    call.add_edge(call.add_read("X"), None, node, "x", dace.Memlet("X[0:N]"))
    call.add_edge(node, "y", call.add_write("Y"), None, dace.Memlet("Y[0:N]"))
    total = outer.add_state_after(call, "total")
    total.add_mapped_tasklet("r", {"i": "0:N"}, {"a": dace.Memlet("Y[i]"), "w": dace.Memlet("W[i]")}, "s = a * w",
                             {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)
    return outer


def _t_nested_call(X, W, S, **_):
    return S[0] + ((torch.exp(X) * X + torch.sin(X)) * W).sum()


def _i_nested_call(rng):
    n = _SIZES["N"]
    return {"X": rng.normal(size=n), "Y": _z(n), "W": rng.normal(size=n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# reshapes: views that remove_views materializes (np.reshape, .flatten()), and copies that reshape


@dace.program
def df_flatten_matmul(X: f64[N, (H - 4) // 2, (W - 4) // 2, 2], Wt: f64[CB, M], V: f64[N, M], S: f64[1]):
    x5 = np.reshape(np.tanh(X), (N, CB))  # lenet's flatten: CB is a symbol (= its extents' product)
    S[0] = np.sum((x5 @ Wt) * V)


def _t_flatten_matmul(X, Wt, V, **_):
    return ((torch.tanh(X).reshape(X.shape[0], -1) @ Wt) * V).sum()


_FLATTEN = {"N": 2, "H": 8, "W": 10, "M": 3, "CB": 2 * ((8 - 4) // 2) * ((10 - 4) // 2)}


def _i_flatten_matmul(rng):
    n, h, w, m, cb = (_FLATTEN[k] for k in ("N", "H", "W", "M", "CB"))
    return {"X": rng.normal(size=(n, (h - 4) // 2, (w - 4) // 2, 2)), "Wt": rng.normal(size=(cb, m)),
            "V": rng.normal(size=(n, m)), "S": _z(1)}


@dace.program
def df_flatten(X: f64[N, M, H], V: f64[N * M * H], S: f64[1]):
    S[0] = np.sum(np.sin(X.flatten()) * V)


def _t_flatten(X, V, **_):
    return (torch.sin(X.flatten()) * V).sum()


def _i_flatten(rng):
    n, m, h = _SIZES["N"], _SIZES["M"], _SIZES["H"]
    return {"X": rng.normal(size=(n, m, h)), "V": rng.normal(size=n * m * h), "S": _z(1)}


@dace.program
def df_reshape_same_rank(A: f64[N, M], V: f64[M, N], S: f64[1]):
    R = np.reshape(A, (M, N))
    S[0] = np.sum(R * R * V)


def _t_reshape_same_rank(A, V, **_):
    R = A.reshape(A.shape[1], A.shape[0])
    return (R * R * V).sum()


def _i_reshape_same_rank(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=(n, m)), "V": rng.normal(size=(m, n)), "S": _z(1)}


@dace.program
def df_reshape_memlet_path(inp: f64[N * M], bias: f64[M], S: f64[1]):
    reshaped = np.reshape(inp, (N, M))
    Z = reshaped + bias  # the view sits on the memlet path into the broadcast map
    S[0] = np.sum(np.log(Z + 10.0))


def _t_reshape_memlet_path(inp, bias, **_):
    return torch.log(inp.reshape(-1, bias.shape[0]) + bias + 10.0).sum()


def _i_reshape_memlet_path(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"inp": rng.uniform(-1.0, 1.0, n * m), "bias": rng.uniform(-1.0, 1.0, m), "S": _z(1)}


def df_reshape_copy() -> dace.SDFG:
    """Two copies that reshape (built with the API; the frontend makes views): a strided 2-D block of A into
    a vector B, B into an M x N matrix C."""
    sdfg = dace.SDFG("df_reshape_copy")
    sdfg.add_array("A", [N + 1, M + 2], f64)
    sdfg.add_array("V", [M, N], f64)
    sdfg.add_array("S", [1], f64)
    sdfg.add_transient("B", [N * M], f64)
    sdfg.add_transient("C", [M, N], f64)
    state = sdfg.add_state("reshape", is_start_block=True)
    b = state.add_access("B")
    state.add_nedge(state.add_read("A"), b, dace.Memlet(data="A", subset="1:N + 1, 1:M + 1", other_subset="0:N*M"))
    state.add_nedge(b, state.add_write("C"), dace.Memlet(data="B", subset="0:N*M", other_subset="0:M, 0:N"))
    total = sdfg.add_state_after(state, "total")
    total.add_mapped_tasklet("t", {"i": "0:M", "j": "0:N"}, {"c": dace.Memlet("C[i, j]"), "v": dace.Memlet("V[i, j]")},
                             "s = c * c * v", {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")},
                             external_edges=True)
    return sdfg


def _t_reshape_copy(A, V, S, **_):
    C = A[1:, 1:-1].reshape(V.shape)
    return S[0] + (C * C * V).sum()


def _i_reshape_copy(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=(n + 1, m + 2)), "V": rng.normal(size=(m, n)), "S": _z(1)}
# tasklet statements: a masked assignment (`if c: out = v` through a dynamic memlet), an explicit tasklet
# with reassigned locals, a dead bare expression, if/elif/else, a ternary and `+=`, and np.where


@dace.program
def df_masked_assign(X: f64[N], W: f64[N], S: f64[1]):
    T = np.sin(X) * 2.0
    T[T <= 0.1] = 1.0
    S[0] = np.sum(T * T * W)


def _t_masked_assign(X, W, **_):
    T = torch.sin(X) * 2.0
    T = torch.where(T <= 0.1, torch.ones_like(T), T)
    return (T * T * W).sum()


def _i_masked_assign(rng):
    n = _SIZES["N"]
    X = rng.uniform(-2.0, 2.0, n)
    X[np.abs(2.0 * np.sin(X) - 0.1) < 0.05] += 0.2  # away from the mask's edge
    X[:2] = (-1.0, 1.0)  # both sides of the mask
    return {"X": X, "W": rng.normal(size=n), "S": _z(1)}


@dace.program
def df_tasklet_branches(X: f64[N], Y: f64[N], W: f64[N], P: f64[N], Q: f64[N], S: f64[1]):
    for i in dace.map[0:N]:
        with dace.tasklet:
            x << X[i]
            y << Y[i]
            p >> P[i]
            q >> Q[i]
            t = x * y
            t = t + 1.0
            log(3.0)
            if x > 0.5:
                p = t * x
            elif x > -0.5:
                p = sin(t)
            else:
                p = t - y
            r = (t if y > 0 else x * x)
            q = r
            q += exp(r * 0.1)
    S[0] = np.sum(P * W + Q)
    for i in dace.map[0:N]:
        with dace.tasklet:
            x << X[i]
            s >> S(-1, lambda a, b: a + b)[0]  # dynamic: adds only where the code assigns
            if x > 0.0:
                s = x * x


def _t_tasklet_branches(X, Y, W, **_):
    t = X * Y + 1.0
    P = torch.where(X > 0.5, t * X, torch.where(X > -0.5, torch.sin(t), t - Y))
    r = torch.where(Y > 0, t, X * X)
    return (P * W + r + torch.exp(r * 0.1)).sum() + torch.where(X > 0.0, X * X, torch.zeros_like(X)).sum()


def _i_tasklet_branches(rng):
    n = _SIZES["N"]
    X = np.array([-1.5, -0.2, 0.9, 1.3, -0.9, 0.2, 0.7][:n]) + rng.uniform(-0.1, 0.1, n)
    Y = rng.uniform(0.2, 1.0, n) * rng.choice([-1.0, 1.0], n)
    return {"X": X, "Y": Y, "W": rng.normal(size=n), "P": _z(n), "Q": _z(n), "S": _z(1)}


@dace.program
def df_where(X: f64[N], Y: f64[N], S: f64[1]):
    T = np.where(X > Y, X * X, np.sin(Y))
    S[0] = np.sum(T * Y)


def _t_where(X, Y, **_):
    return (torch.where(X > Y, X * X, torch.sin(Y)) * Y).sum()


def _i_where(rng):
    n = _SIZES["N"]
    X = rng.normal(size=n)
    return {"X": X, "Y": X + rng.uniform(0.2, 1.0, n) * rng.choice([-1.0, 1.0], n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# products with exact zeros: np.prod (a product Reduce) along an axis and over everything, and a map that
# multiplies into one element (product write-conflict resolution)


@dace.program
def df_prod(A: f64[N, M], W: f64[N], S: f64[1]):
    r = np.prod(A, axis=1)
    S[0] = np.sum(r * W) + np.prod(A[0:3, 1:M])


def _t_prod(A, W, **_):
    return (A.prod(1) * W).sum() + A[0:3, 1:].prod()


def _i_prod(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    A = rng.uniform(0.5, 1.5, (n, m)) * rng.choice([-1.0, 1.0], (n, m))
    A[1, 2] = 0.0  # row 1: one zero (also the one zero of the block A[0:3, 1:])
    A[3, 0] = A[3, 4] = 0.0  # row 3: two zeros
    return {"A": A, "W": rng.normal(size=n), "S": _z(1)}


@dace.program
def df_prod_map(X: f64[N], Y: f64[N], S: f64[1]):
    P = np.ones(2, dtype=np.float64)
    for i in dace.map[0:N]:
        P[0] *= X[i] * Y[i]
    for i in dace.map[0:N]:
        P[1] *= np.sin(X[i]) + 2.0
    S[0] = P[0] * 3.0 + P[1]


def _t_prod_map(X, Y, **_):
    return (X * Y).prod() * 3.0 + (torch.sin(X) + 2.0).prod()


def _i_prod_map(rng):
    n = _SIZES["N"]
    X = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    X[rng.integers(n)] = 0.0  # exactly one zero factor in P[0]
    return {"X": X, "Y": rng.uniform(0.5, 1.5, n), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# contractions the frontend specializes np.einsum into: a matrix product, a diagonal (a map) and a
# three-operand contraction into a scalar (a write-conflict sum map)


@dace.program
def df_einsum(A: f64[N, M], B: f64[M, H], C: f64[N, N], X: f64[N, M], S: f64[1]):
    P = np.einsum("ij,jk->ik", A, B)
    d = np.einsum("ii->i", C)
    t = np.einsum("ij,ij,ij->", A, X, A)
    S[0] = np.sum(P * P) + np.sum(d * d) + t[0]


def _t_einsum(A, B, C, X, **_):
    P = torch.einsum("ij,jk->ik", A, B)
    return (P * P).sum() + (torch.einsum("ii->i", C) ** 2).sum() + torch.einsum("ij,ij,ij->", A, X, A)


def _i_einsum(rng):
    n, m, h = _SIZES["N"], _SIZES["M"], _SIZES["H"]
    return {"A": rng.normal(size=(n, m)), "B": rng.normal(size=(m, h)), "C": rng.normal(size=(n, n)),
            "X": rng.normal(size=(n, m)), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# gather and scatter through index arrays (duplicates in the gathered and accumulated indices): `A[idx]`
# (an indirection tasklet), `A[idx[i]]` inside a map (a nested SDFG reading the index into a symbol),
# `A[idx[i]] += v` (scatter-add), `A[idx] = v` and `A[idx[i]] = v` (overwriting scatters, distinct indices)


@dace.program
def df_gather(A: f64[N], B: f64[N, H], idx: dace.int64[M], W: f64[M], S: f64[1]):
    G = A[idx]
    for i in dace.map[0:M]:
        S[0] += np.sin(A[idx[i]]) * W[i]
    for i, j in dace.map[0:M, 0:H]:
        S[0] += B[idx[i], j] * B[idx[i], j] * W[i]
    S[0] += np.sum(G * G * W)


def _t_gather(A, B, idx, W, S, **_):
    k = idx.long()
    G = A.index_select(0, k)
    Bk = B.index_select(0, k)
    return S[0] + (torch.sin(G) * W).sum() + (Bk * Bk * W[:, None]).sum() + (G * G * W).sum()


def _index(rng, n: int, m: int, distinct: bool) -> np.ndarray:
    if distinct:
        return rng.permutation(n)[:m].astype(np.int64)
    idx = rng.integers(0, n, m).astype(np.int64)
    idx[1] = idx[0]  # a duplicate
    return idx


def _i_gather(rng):
    n, m, h = _SIZES["N"], _SIZES["M"], _SIZES["H"]
    return {"A": rng.normal(size=n), "B": rng.normal(size=(n, h)), "idx": _index(rng, n, m, distinct=False),
            "W": rng.normal(size=m), "S": _z(1)}


@dace.program
def df_scatter_add(A: f64[N], idx: dace.int64[M], V: f64[M], W: f64[N], S: f64[1]):
    for i in dace.map[0:M]:
        A[idx[i]] += V[i] * V[i]
    S[0] = np.sum(A * A * W)


def _t_scatter_add(A, idx, V, W, **_):
    A = A.index_add(0, idx.long(), V * V)
    return (A * A * W).sum()


def _i_scatter_add(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=n), "idx": _index(rng, n, m, distinct=False), "V": rng.normal(size=m),
            "W": rng.normal(size=n), "S": _z(1)}


@dace.program
def df_scatter(A: f64[N], idx: dace.int64[M], jdx: dace.int64[M], V: f64[M], W: f64[N], S: f64[1]):
    T = A * A
    A[idx] = V
    for i in dace.map[0:M]:
        A[jdx[i]] = np.cos(V[i]) * W[idx[i]]
    S[0] = np.sum(A * W) + np.sum(T * A)


def _t_scatter(A, idx, jdx, V, W, **_):
    T = A * A
    i, j = idx.long(), jdx.long()
    A = setitem(A, i, V)
    A = setitem(A, j, torch.cos(V) * W.index_select(0, i))
    return (A * W).sum() + (T * A).sum()


def _i_scatter(rng):
    n, m = _SIZES["N"], _SIZES["M"]
    return {"A": rng.normal(size=n), "idx": _index(rng, n, m, distinct=True), "jdx": _index(rng, n, m, distinct=True),
            "V": rng.normal(size=m), "W": rng.normal(size=n), "S": _z(1)}


CASES: list[Case] = [
    Case("df_elementwise_chain", df_elementwise_chain, _t_elementwise_chain, ("X",), "S",
         _i_elementwise_chain, _N, "exp/sin/tanh/sqrt chain, map-WCR sum"),
    Case("df_log_pow", df_log_pow, _t_log_pow, ("X", "Y"), "S", _i_log_pow, _N,
         "log, x**3, x**1.5, x**y on positive inputs"),
    Case("df_abs_max_min", df_abs_max_min, _t_abs_max_min, ("X", "Y"), "S", _i_abs_max_min, _N,
         "abs, maximum, minimum, relu away from kinks"),
    Case("df_div_sigmoid", df_div_sigmoid, _t_div_sigmoid, ("A", "B"), "S", _i_div_sigmoid, _N,
         "division, negation, sigmoid"),
    Case("df_wcr_2d", df_wcr_2d, _t_wcr_2d, ("A", "B"), "S", _i_wcr_2d, _NM,
         "2-D map, tasklet writes S with WCR directly"),
    Case("df_broadcast", df_broadcast, _t_broadcast, ("A", "v", "w", "alpha"), "S", _i_broadcast, _NM,
         "row-vector + matrix, matrix * column vector, alpha[0] * array"),
    Case("df_slices", df_slices, _t_slices, ("A", "B"), "S", _i_slices, _NM,
         "shifted windows A[1:N-1], A[0:N-2], A[2:N]; columns B[:, 0], B[:, M-1]"),
    Case("df_strided", df_strided, _t_strided, ("X", "Y"), "S", _i_strided, {"H": _SIZES["H"]},
         "strided reads X[::2], X[1::2], strided write Y[::3] (Y partly kept)"),
    Case("df_overwrite_transient", df_overwrite_transient, _t_overwrite_transient, ("X",), "S",
         _i_overwrite_transient, _N, "transient written, read, overwritten, read again"),
    Case("df_overwrite_output", df_overwrite_output, _t_overwrite_output, ("X",), "S",
         _i_overwrite_output, _N, "output array written, read, overwritten, read again"),
    Case("df_inplace_input", df_inplace_input, _t_inplace_input, ("X", "W"), "S", _i_inplace_input, _N,
         "input X[:] = X * 2 in place before use, then overwritten again"),
    Case("df_multi_output_tasklet", df_multi_output_tasklet, _t_multi_output_tasklet, ("X", "Y"), "S",
         _i_multi_output_tasklet, _N, "explicit tasklet with two outputs; explicit WCR tasklet"),
    Case("df_states_sequence", df_states_sequence, _t_states_sequence, ("X",), "S", _i_states_sequence, _N,
         "3 states: reduction read back, element and shifted-slice self-updates, S reset/accumulated/scaled"),
    Case("df_read_many", df_read_many, _t_read_many, ("X",), "S", _i_read_many, _N,
         "one array read by many expressions"),
    Case("df_transients", df_transients, _t_transients, ("A",), "S", _i_transients, _NM,
         "np.ndarray transients filled by maps"),
    Case("df_nested_map", df_nested_map, _t_nested_map, ("A", "x"), "S", _i_nested_map, _NM,
         "map nested in map, matvec with WCR into y, tanh reduction"),
    Case("df_stencil_2d", df_stencil_2d, _t_stencil_2d, ("A", "B"), "S", _i_stencil_2d, _NM,
         "5-point stencil by shifted slices; B's border comes from the input"),
    Case("df_softmax_wcr", df_softmax_wcr, _t_softmax_wcr, ("X", "W"), "S", _i_softmax_wcr, _NM,
         "row softmax, max by WCR-max tasklet, sum by WCR-sum, no library nodes"),
    Case("df_partial_dependence", df_partial_dependence, _t_partial_dependence, ("X", "Y", "Z"), "S",
         _i_partial_dependence, _N, "S independent of Z: gradient w.r.t. Z is zero"),
    Case("df_nested_call", BuiltProgram(df_nested_call, ("X", "Y", "W", "S")), _t_nested_call, ("X", "W"), "S",
         _i_nested_call, _N, "a call of a two-state nested SDFG (API-built, not inlined)"),
    Case("df_lib_sum", df_lib_sum, _t_lib_sum, ("X", "Y"), "S", _i_lib_sum, _N,
         "S[0] = np.sum(...) (Reduce library node)"),
    Case("df_lib_mean", df_lib_mean, _t_lib_mean, ("A",), "S", _i_lib_mean, _NM, "np.mean over a matrix"),
    Case("df_lib_sum_axis", df_lib_sum_axis, _t_lib_sum_axis, ("A", "v"), "S", _i_lib_sum_axis, _NM,
         "np.sum along axis 0 and axis 1, then np.sum"),
    Case("df_lib_softmax", df_lib_softmax, _t_lib_softmax, ("X", "W"), "S", _i_lib_softmax, _NM,
         "row softmax with np.max / np.sum library reductions"),
    Case("df_flatten_matmul", df_flatten_matmul, _t_flatten_matmul, ("X", "Wt"), "S", _i_flatten_matmul, _FLATTEN,
         "lenet's flatten: np.reshape of a 4-D transient with int_floor extents to (N, CB), then a matmul"),
    Case("df_flatten", df_flatten, _t_flatten, ("X",), "S", _i_flatten,
         {"N": _SIZES["N"], "M": _SIZES["M"], "H": _SIZES["H"]}, "X.flatten() of a 3-D input"),
    Case("df_reshape_same_rank", df_reshape_same_rank, _t_reshape_same_rank, ("A",), "S", _i_reshape_same_rank,
         _NM, "np.reshape (N, M) -> (M, N): a view of equal rank that is not a slice"),
    Case("df_reshape_memlet_path", df_reshape_memlet_path, _t_reshape_memlet_path, ("inp", "bias"), "S",
         _i_reshape_memlet_path, _NM, "a reshaped vector read by a broadcast map (a reshape on a memlet path)"),
    Case("df_reshape_copy", BuiltProgram(df_reshape_copy, ("A", "V", "S")), _t_reshape_copy, ("A",), "S",
         _i_reshape_copy, _NM, "copies that reshape: a strided 2-D block into a vector, the vector into a matrix"),
    Case("df_masked_assign", df_masked_assign, _t_masked_assign, ("X", "W"), "S", _i_masked_assign, _N,
         "T[T <= 0.1] = 1.0: a conditional write through a dynamic memlet"),
    Case("df_tasklet_branches", df_tasklet_branches, _t_tasklet_branches, ("X", "Y", "W"), "S",
         _i_tasklet_branches, _N, "explicit tasklets: reassigned local, bare expression, if/elif/else, ternary, +=, conditional dynamic sum"),
    Case("df_where", df_where, _t_where, ("X", "Y"), "S", _i_where, _N, "np.where (expanded to a ternary)"),
    Case("df_prod", df_prod, _t_prod, ("A", "W"), "S", _i_prod, _NM,
         "np.prod along an axis and over a block, rows with no, one and two zeros"),
    Case("df_prod_map", df_prod_map, _t_prod_map, ("X", "Y"), "S", _i_prod_map, _N,
         "P[0] *= f(x[i]) in a map (product write-conflict resolution), one zero factor"),
    Case("df_einsum", df_einsum, _t_einsum, ("A", "B", "C", "X"), "S", _i_einsum, _NMH,
         "np.einsum: matrix product, diagonal, three-operand contraction to a scalar"),
    Case("df_gather", df_gather, _t_gather, ("A", "B", "W"), "S", _i_gather, _NMH,
         "A[idx], A[idx[i]] and B[idx[i], j] in maps, duplicate indices"),
    Case("df_scatter_add", df_scatter_add, _t_scatter_add, ("A", "V", "W"), "S", _i_scatter_add, _NM,
         "A[idx[i]] += v[i] in a map, duplicate indices"),
    Case("df_scatter", df_scatter, _t_scatter, ("A", "V", "W"), "S", _i_scatter, _NM,
         "A[idx] = V and A[jdx[i]] = f(V[i], W[idx[i]]) overwrite (distinct indices); A read before"),
]

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}
