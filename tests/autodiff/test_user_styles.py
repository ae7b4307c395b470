"""Programs in styles neither the loop corpus nor the fuzzer's grammar writes, each checked against
`torch.autograd` in float64: a backward sweep (negative step), a triangular solve, a scan, modulo and
float-computed indices, a running `max()` of scalars, `break` and `while` on data, an RNN whose trip count
is an argument, a view updated in place, an explicit tasklet, a power by the loop index; step functions
(floor, ceil, trunc, rint) and remainders (`%`, `//`, np.remainder, np.fmod), whose steps have derivative 0
(refused as unknown functions until 2026-12-04); numpy's arctan2, hypot, exp2, log2, log10, cbrt, arcsinh,
arccosh, arctanh, fmax, fmin, deg2rad, rad2deg, reciprocal and float_power (until 2026-12-05); weights from
`np.arange`, in a `for` and in a `while` that steps by two (refused until 2026-12-05: DaCe writes arange's
conversion in C++).

They were written from the outside (as a new user would) on 2026-12-03 and all passed then on every route;
each runs here on two routes that between them cover both policies, both routes and optimize on and off.
One build per program and route (content cache); hypothesis varies the data.
"""

from __future__ import annotations

import math

import dace
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.verify.routes import gradient

N, M = dace.symbol("N"), dace.symbol("M")
RTOL = 1e-10


@dace.program
def backward_sweep(A: dace.float64[N], S: dace.float64[1]):
    C = np.copy(A)
    for i in range(N - 1, 0, -1):
        C[i - 1] += C[i] * 0.3
    S[0] = np.sum(C ** 2)


def t_backward_sweep(A):
    c = list(A)
    for i in range(A.shape[0] - 1, 0, -1):
        c[i - 1] = c[i - 1] + c[i] * 0.3
    return sum(v * v for v in c)


@dace.program
def forward_substitution(b: dace.float64[N], L: dace.float64[N, N], S: dace.float64[1]):
    x = np.copy(b)
    for i in range(N):
        for j in range(i):
            x[i] -= L[i, j] * x[j]
    S[0] = np.sum(x ** 2)


def t_forward_substitution(b, L):
    x = []
    for i in range(b.shape[0]):
        acc = b[i]
        for j in range(i):
            acc = acc - L[i, j] * x[j]
        x.append(acc)
    return sum(v * v for v in x)


@dace.program
def damped_scan(A: dace.float64[N], S: dace.float64[1]):
    C = np.copy(A)
    for i in range(1, N):
        C[i] = C[i] + C[i - 1] * 0.5
    S[0] = np.sum(C ** 2)


def t_damped_scan(A):
    c = [A[0]]
    for i in range(1, A.shape[0]):
        c.append(A[i] + c[-1] * 0.5)
    return sum(v * v for v in c)


@dace.program
def modulo_index(A: dace.float64[N], S: dace.float64[1]):
    B = np.zeros_like(A)
    for i in range(N):
        B[i] = A[(i + 1) % N] * A[i] * 1.5
    S[0] = np.sum(B)


def t_modulo_index(A):
    return (torch.roll(A, -1) * A * 1.5).sum()


@dace.program
def float_index_gather(A: dace.float64[N], C: dace.float64[M], S: dace.float64[1]):
    s = 0.0
    for i in range(N):
        k = int(A[i] * 3)
        s += C[k] * A[i]
    S[0] = s


def t_float_index_gather(A, C):
    return (C[(A * 3).long()] * A).sum()


@dace.program
def running_max(A: dace.float64[N], S: dace.float64[1]):
    m = A[0]
    for i in range(1, N):
        m = max(m, A[i] * 0.9)
    S[0] = m * np.sum(A)


def t_running_max(A):
    m = A[0]
    for i in range(1, A.shape[0]):
        m = torch.maximum(m, A[i] * 0.9)
    return m * A.sum()


@dace.program
def break_on_data(A: dace.float64[N], S: dace.float64[1]):
    s = 0.0
    for i in range(N):
        s += A[i] * A[i]
        if s > 1.2:
            break
    S[0] = s


def t_break_on_data(A):
    s = 0
    for i in range(A.shape[0]):
        s = s + A[i] * A[i]
        if s > 1.2:
            break
    return s


@dace.program
def while_on_data(x: dace.float64[2], S: dace.float64[1]):
    v = x[0]
    i = 0
    while i < 6 and v < 5.0:
        v = v * 1.7 + x[1]
        i += 1
    S[0] = v


def t_while_on_data(x):
    v, i = x[0], 0
    while i < 6 and v < 5.0:
        v = v * 1.7 + x[1]
        i += 1
    return v


@dace.program
def rnn(W: dace.float64[N, N], x: dace.float64[M, N], K: dace.int64, S: dace.float64[1]):
    h = np.zeros([N], dtype=np.float64)
    for t in range(K):
        h[:] = np.tanh(W @ h + x[t])
    S[0] = np.sum(h)


def t_rnn(W, x):
    h = torch.zeros(W.shape[0], dtype=torch.float64)
    for t in range(x.shape[0]):
        h = torch.tanh(W @ h + x[t])
    return h.sum()


@dace.program
def view_update(A: dace.float64[N], S: dace.float64[1]):
    B = np.copy(A)
    v = B[1:-1]
    v[:] = v * 2 + B[:-2]
    S[0] = np.sum(B ** 3)


def t_view_update(A):
    b = A.clone()
    b[1:-1] = b[1:-1] * 2 + b[:-2]
    return (b ** 3).sum()


@dace.program
def explicit_tasklet(A: dace.float64[N], S: dace.float64[1]):
    B = np.ndarray([N], dtype=np.float64)
    for i in dace.map[0:N]:
        with dace.tasklet:
            a << A[i]
            b >> B[i]
            b = a * math.exp(-a)
    S[0] = np.sum(B)


def t_explicit_tasklet(A):
    return (A * torch.exp(-A)).sum()


@dace.program
def power_of_loop_index(A: dace.float64[N], S: dace.float64[1]):
    S[0] = 0.0
    for i in range(N):
        S[0] += A[i] ** i


def t_power_of_loop_index(A):
    return sum(A[i] ** i for i in range(A.shape[0]))


@dace.program
def weighted_by_position(A: dace.float64[N], S: dace.float64[1]):
    B = np.ndarray([N], dtype=np.float64)
    for i in range(N):
        B[i] = A[N - 1 - i] * A[i]
    S[0] = np.sum(B * np.arange(N))


def t_weighted_by_position(A):
    return (A.flip(0) * A * torch.arange(A.shape[0])).sum()


@dace.program
def while_every_other(A: dace.float64[N], S: dace.float64[1]):
    i = 0
    while i < N:
        A[i] = A[i] * A[i] + 1.0
        i += 2
    S[0] = np.sum(A * np.arange(N))


def t_while_every_other(A):
    B = A.clone()
    B[::2] = A[::2] * A[::2] + 1.0
    return (B * torch.arange(A.shape[0])).sum()


@dace.program
def step_functions(A: dace.float64[N], S: dace.float64[1]):
    B = A * np.ceil(A * 2.0) + np.trunc(A * 3.0) * A * A + np.rint(A * 4.0) * np.sin(A)
    S[0] = np.sum(B * np.floor(A + 0.3))


def t_step_functions(A):
    rint = torch.sign(A * 4.0) * torch.floor(torch.abs(A * 4.0) + 0.5)  # C's round: halves away from zero
    B = A * torch.ceil(A * 2.0) + torch.trunc(A * 3.0) * A * A + rint * torch.sin(A)
    return (B * torch.floor(A + 0.3)).sum()


@dace.program
def remainders(A: dace.float64[N], D: dace.float64[N], S: dace.float64[1]):
    B = np.remainder(A * 3.0, D) * A + np.fmod(A * 2.0, D) + np.floor_divide(A, 0.3) * A
    C = np.ndarray([N], dtype=np.float64)
    for i in dace.map[0:N]:
        with dace.tasklet:
            a << A[i]
            d << D[i]
            c >> C[i]
            c = (a * 5.0) % d * a + (a // d) * d
    S[0] = np.sum(B * B) + np.sum(C * C)


def t_remainders(A, D):
    B = torch.remainder(A * 3.0, D) * A + torch.fmod(A * 2.0, D) + torch.floor(A / 0.3) * A
    C = torch.remainder(A * 5.0, D) * A + torch.floor(A / D) * D
    return (B * B).sum() + (C * C).sum()


@dace.program
def numpy_functions(A: dace.float64[N], D: dace.float64[N], S: dace.float64[1]):
    B = np.arctan2(A, D) * np.hypot(A, D) + np.exp2(A) * np.log2(D) - np.log10(D) * np.cbrt(A)
    C = np.arcsinh(A) * np.arccosh(D + 1.0) + np.arctanh(0.5 * A) + np.fmax(A, D) * np.fmin(A, 0.5 * D)
    E = np.deg2rad(A) * np.rad2deg(D) + np.reciprocal(D) * np.float_power(D, A)
    S[0] = np.sum(B * C) + np.sum(E * E)


def t_numpy_functions(A, D):
    B = torch.atan2(A, D) * torch.hypot(A, D) + torch.exp2(A) * torch.log2(D) - torch.log10(D) * (
        torch.sign(A) * torch.abs(A) ** (1.0 / 3.0))
    C = torch.asinh(A) * torch.acosh(D + 1.0) + torch.atanh(0.5 * A) + torch.fmax(A, D) * torch.fmin(A, 0.5 * D)
    E = torch.deg2rad(A) * torch.rad2deg(D) + torch.reciprocal(D) * torch.float_power(D, A)
    return (B * C).sum() + (E * E).sum()


def _uniform(rng, shape, low=0.1, high=1.0):
    return rng.uniform(low, high, shape)


#: name -> (program, torch reference over the wrt arrays, wrt, inputs(rng), symbols)
CASES = {
    "backward_sweep": (backward_sweep, t_backward_sweep, ("A",), lambda r: {"A": r.normal(size=7)}, {"N": 7}),
    "forward_substitution": (forward_substitution, t_forward_substitution, ("b", "L"),
                             lambda r: {"b": r.normal(size=6), "L": r.normal(size=(6, 6)) * 0.4}, {"N": 6}),
    "damped_scan": (damped_scan, t_damped_scan, ("A",), lambda r: {"A": r.normal(size=8)}, {"N": 8}),
    "modulo_index": (modulo_index, t_modulo_index, ("A",), lambda r: {"A": r.normal(size=7)}, {"N": 7}),
    # indices int(3 A) in 0..2, A away from the jumps at 1/3 and 2/3
    "float_index_gather": (float_index_gather, t_float_index_gather, ("A", "C"),
                           lambda r: {"A": (r.integers(0, 3, 6) + r.uniform(0.05, 0.95, 6)) / 3.0,
                                      "C": r.normal(size=4)}, {"N": 6, "M": 4}),
    "running_max": (running_max, t_running_max, ("A",), lambda r: {"A": r.normal(size=8)}, {"N": 8}),
    "break_on_data": (break_on_data, t_break_on_data, ("A",), lambda r: {"A": _uniform(r, 9)}, {"N": 9}),
    "while_on_data": (while_on_data, t_while_on_data, ("x",), lambda r: {"x": _uniform(r, 2)}, {}),
    # K, the trip count, an argument as a user passes it (the split forward takes it as a scalar)
    "rnn": (rnn, t_rnn, ("W", "x"),
            lambda r: {"W": r.normal(size=(4, 4)) * 0.5, "x": r.normal(size=(5, 4)), "K": 5}, {"N": 4, "M": 5}),
    "view_update": (view_update, t_view_update, ("A",), lambda r: {"A": r.normal(size=7)}, {"N": 7}),
    "explicit_tasklet": (explicit_tasklet, t_explicit_tasklet, ("A",), lambda r: {"A": r.normal(size=6)},
                         {"N": 6}),
    "step_functions": (step_functions, t_step_functions, ("A",), lambda r: {"A": r.normal(size=7)}, {"N": 7}),
    # negative dividends and divisors: Python's remainder takes the divisor's sign, C's fmod the dividend's
    "remainders": (remainders, t_remainders, ("A", "D"),
                   lambda r: {"A": r.normal(size=6), "D": r.choice([-1.0, 1.0], 6) * r.uniform(0.3, 1.5, 6)},
                   {"N": 6}),
    # numpy's elementary functions beyond the first table (refused as unknown until 2026-12-05); A away from 0
    # (cbrt's infinite slope), A and D/2 apart (fmin's kink)
    "numpy_functions": (numpy_functions, t_numpy_functions, ("A", "D"),
                        lambda r: {"A": r.choice([-1.0, 1.0], 6) * r.uniform(0.2, 1.2, 6), "D": r.uniform(2.6, 3.0, 6)},
                        {"N": 6}),
    # np.arange's tasklet converts with C++'s `decltype(__out)(...)` (refused as an unknown function until
    # 2026-12-05)
    "weighted_by_position": (weighted_by_position, t_weighted_by_position, ("A",), lambda r: {"A": r.normal(size=7)},
                             {"N": 7}),
    "while_every_other": (while_every_other, t_while_every_other, ("A",), lambda r: {"A": r.normal(size=7)},
                          {"N": 7}),
    "power_of_loop_index": (power_of_loop_index, t_power_of_loop_index, ("A",), lambda r: {"A": _uniform(r, 6)},
                            {"N": 6}),
}

#: two routes per program: between them both policies, both routes, optimized and not
ROUTES = [("grad", "store_all", True), ("vjp", "recompute_all", False)]


@pytest.mark.parametrize("route, policy, optimize", ROUTES, ids=["grad-store_all-optimized",
                                                                 "vjp-recompute_all-unoptimized"])
@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_program_in_a_users_style_gets_torchs_gradient(name, route, policy, optimize, seed) -> None:
    program, reference, wrt, make, symbols = CASES[name]
    rng = np.random.default_rng(seed)
    arrays = {**make(rng), "S": np.zeros(1)}
    forwarding = gradflow.STORE_ALL if policy == "store_all" else gradflow.RECOMPUTE_ALL
    after, grads = gradient(program, wrt, "S", arrays, symbols, route=route, forwarding=forwarding,
                            optimize=optimize)
    tensors = {k: torch.tensor(arrays[k], dtype=torch.float64, requires_grad=True) for k in wrt}
    value = reference(*(tensors[k] for k in wrt))
    expected = torch.autograd.grad(value, [tensors[k] for k in wrt])
    np.testing.assert_allclose(after["S"][0], value.item(), rtol=RTOL)
    for x, g in zip(wrt, expected):
        np.testing.assert_allclose(grads[x], g.numpy(), rtol=RTOL, atol=1e-13, err_msg=f"d S / d {x}")
