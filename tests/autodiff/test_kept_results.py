"""Inside loops, the reverse of `y = exp(u)` (and of other functions whose derivative is themselves) reads
`y` from the backward sweep's working copy where the planned tape keeps it there
(`Reversal.keeps_result`): every later overwrite of what the operation wrote is popped before its reverse,
and no later run of the operation writes the same elements. Elsewhere the function is called again.
Gradients are checked against `torch.autograd` on the same loops, both ways."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.runtime.compile import compile_sdfg

N, M = 5, 6
f64 = dace.float64


@dace.program
def row_softmax(X: f64[N, M], W: f64[N, M], P: f64[N, M], S: f64[1]):
    for i in range(N):
        s = 0.0
        for j in range(M):
            P[i, j] = np.exp(X[i, j])
            s += P[i, j]
        for j in range(M):
            P[i, j] = P[i, j] / s  # pops row i before the exp's reverse
    for i in range(N):
        for j in range(M):
            S[0] += P[i, j] * W[i, j]


def _t_row_softmax(X, W, **_):
    e = torch.exp(X)
    return (e / e.sum(dim=1, keepdim=True) * W).sum()


@dace.program
def overwritten_untaped(X: f64[N, M], W: f64[N, M], P: f64[N, M], S: f64[1]):
    for i in range(N):
        for j in range(M):
            P[i, j] = np.exp(X[i, j])
        for j in range(M):
            S[0] += P[i, j] * W[i, j]
        for j in range(M):
            P[i, j] = 3.0  # nothing reads the old row: not taped, so the exp is called again


def _t_overwritten_untaped(X, W, **_):
    return (torch.exp(X) * W).sum()


@dace.program
def rewritten_each_sweep(X: f64[N, M], W: f64[N, M], P: f64[N, M], S: f64[1]):
    for t in range(3):
        for i in range(N):
            for j in range(M):
                P[i, j] = np.exp(X[i, j] * (t + 1))  # the same elements in every sweep t
            for j in range(M):
                S[0] += P[i, j] * W[i, j]


def _t_rewritten_each_sweep(X, W, **_):
    return sum((torch.exp(X * (t + 1)) * W).sum() for t in range(3))


@dace.program
def overwritten_next_iteration(X: f64[N, M], W: f64[N, M], P: f64[N, M], S: f64[1]):
    T = np.ndarray([M], dtype=np.float64)
    for i in range(1, N):
        for j in range(M):
            P[i, j] = np.exp(X[i, j])
        for j in range(M):
            T[j] = P[i - 1, j] * P[i, j]
        for j in range(M):
            P[i - 1, j] = T[j]  # overwrites the row the exp wrote one iteration before (read just before)
    # the tape also saves each row before the exp (the analysis cannot tell that T reads row i only after
    # the exp wrote it): popped at the exp itself, its result is not what the working copy holds there
    for i in range(N):
        for j in range(M):
            S[0] += P[i, j] * W[i, j]


def _t_overwritten_next_iteration(X, W, P):
    rows = [P[0]] + [None] * (N - 1)
    for i in range(1, N):
        rows[i] = torch.exp(X[i])
        rows[i - 1] = rows[i - 1] * rows[i]
    return (torch.stack(rows) * W).sum()


def _backward_calls(sdfg: dace.SDFG, fn: str) -> int:
    [backward] = [b for b in sdfg.nodes() if b.label == "gradflow_backward"]
    return sum(f"{fn}(" in n.code.as_string for n, _ in backward.all_nodes_recursive()
               if isinstance(n, dace.nodes.Tasklet))


CASES = [  # program, torch reference, wrt, whether the backward reads the exp's result
    (row_softmax, _t_row_softmax, "X", True),
    (overwritten_untaped, _t_overwritten_untaped, "X", False),
    (rewritten_each_sweep, _t_rewritten_each_sweep, "X", False),
    (overwritten_next_iteration, _t_overwritten_next_iteration, "X", False),
]


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("program, reference, wrt, kept", CASES, ids=[c[0].name for c in CASES])
def test_results_kept_by_the_tape_are_read(program, reference, wrt, kept, optimize) -> None:
    sdfg = gradflow.grad(program, wrt=wrt, of="S", optimize=optimize)
    if not optimize:
        assert (_backward_calls(sdfg, "exp") == 0) is kept
    rng = np.random.default_rng(11)
    arrays = {name: rng.uniform(-1, 1, desc.shape) for name, desc in program.to_sdfg().arrays.items()
              if not desc.transient and name != "S"}
    given = {k: v.copy() for k, v in arrays.items()}
    grad = np.full_like(arrays[wrt], np.nan)
    compile_sdfg(sdfg)(**given, S=np.zeros(1), **{f"grad_{wrt}": grad})
    inputs = {k: torch.tensor(v, requires_grad=(k == wrt)) for k, v in arrays.items() if k in ("X", "W", "P")}
    reference(**inputs).backward()
    np.testing.assert_allclose(grad, inputs[wrt].grad.numpy(), rtol=1e-12, atol=1e-14)
