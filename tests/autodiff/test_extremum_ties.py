"""The reverse of a max/min reduction that keeps dimensions counts the ties of each output element and
spreads its gradient in one scope (a map over the kept dimensions around two sequential maps over the
reduced ones, the count in a register): the input elements of one output are read twice while they are
in cache. Ties are split equally (as `torch.amax`); a middle axis is reduced, so the kept dimensions are
not contiguous."""

from __future__ import annotations

import dace
import numpy as np
import pytest

import gradflow
from gradflow.runtime.compile import compile_sdfg

N, M, K = 3, 6, 4


@dace.program
def max_middle(x: dace.float64[N, M, K], w: dace.float64[N, K], S: dace.float64[1]):
    S[0] = np.sum(np.max(x, axis=1) * w)


def _expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    at_max = (x == x.max(axis=1, keepdims=True)).astype(float)
    return at_max / at_max.sum(axis=1, keepdims=True) * w[:, np.newaxis, :]


def _counts(sdfg: dace.SDFG) -> list:
    return [desc for name, desc in sdfg.arrays.items() if name.startswith("gradflow_t_count")]


@pytest.mark.parametrize("optimize", [True, False])
def test_ties_are_counted_per_output_in_registers(optimize: bool) -> None:
    sdfg = gradflow.grad(max_middle, wrt="x", of="S", optimize=optimize)
    counts = _counts(sdfg)
    assert counts and all(c.total_size == 1 and c.storage == dace.StorageType.Register for c in counts)
    compiled = compile_sdfg(sdfg)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = rng.integers(-1, 2, size=(N, M, K)).astype(float)  # three values over six: ties in every column
        w = rng.standard_normal((N, K))
        g = np.full((N, M, K), np.nan)
        compiled(x=x.copy(), w=w, S=np.zeros(1), grad_x=g)
        np.testing.assert_allclose(g, _expected(x, w), rtol=1e-13, atol=1e-15)
