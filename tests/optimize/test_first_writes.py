"""`overwrite_zeroed_products`: a gradient buffer whose first writer after the zeroing is a Gemm covering
it is computed with beta = 0 and not zeroed. The gradients stay those of the unoptimized route (here, and
on every corpus program in test_two_routes.py)."""

from __future__ import annotations

import dace
import numpy as np
from dace.libraries.blas.nodes.gemm import Gemm

import gradflow
from gradflow.core.passes import Pipeline
from gradflow.optimize.first_writes import OverwriteZeroedProducts, _candidates
from gradflow.runtime.compile import compile_sdfg

N, K = 6, 5


@dace.program
def layer(A: dace.float64[N, K], B: dace.float64[K, N], V: dace.float64[N, N], S: dace.float64[1]):
    C = A @ B
    S[0] = np.sum(np.tanh(C) * V)


@dace.program
def layer_twice(A: dace.float64[N, K], B: dace.float64[K, N], V: dace.float64[N, N], S: dace.float64[1]):
    # A's gradient gets a map's contribution before the product's: its zeros are needed
    C = A @ B
    S[0] = np.sum(np.tanh(C) * V) + np.sum(A * A)


def _gemm_betas(sdfg: dace.SDFG) -> list[float]:
    return sorted(n.beta for n, _ in sdfg.all_nodes_recursive() if isinstance(n, Gemm))


def _grads(sdfg: dace.SDFG, inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    gA, gB = np.full((N, K), np.nan), np.full((K, N), np.nan)  # whatever the buffers held before
    compile_sdfg(sdfg)(**inputs, S=np.zeros(1), grad_A=gA, grad_B=gB)
    return gA, gB


def _inputs() -> dict:
    rng = np.random.default_rng(5)
    return {"A": rng.standard_normal((N, K)), "B": rng.standard_normal((K, N)), "V": rng.standard_normal((N, N))}


def test_products_overwrite_the_gradients_they_write_first() -> None:
    plain = gradflow.grad(layer, wrt=["A", "B"], of="S", optimize=False)
    rewritten = gradflow.grad(layer, wrt=["A", "B"], of="S", optimize=Pipeline((OverwriteZeroedProducts(),)))
    assert sum(len(_candidates(s)) for s in plain.all_sdfgs_recursive()) == 2
    assert _gemm_betas(plain) == [1, 1] and _gemm_betas(rewritten) == [0, 0]
    want, got = _grads(plain, _inputs()), _grads(rewritten, _inputs())
    for w, g in zip(want, got):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-14)


def test_a_buffer_that_another_contribution_reaches_first_keeps_its_zeros() -> None:
    plain = gradflow.grad(layer_twice, wrt=["A", "B"], of="S", optimize=False)
    rewritten = gradflow.grad(layer_twice, wrt=["A", "B"], of="S", optimize=Pipeline((OverwriteZeroedProducts(),)))
    assert _gemm_betas(rewritten) == [0, 1]  # B's product still overwrites, A's adds to the map's part
    got, want = _grads(rewritten, _inputs()), _grads(plain, _inputs())
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-14)


def test_a_loop_whose_condition_reads_the_buffer_touches_it() -> None:
    from dace.sdfg.state import LoopRegion

    from gradflow.optimize.first_writes import _touches

    loop = LoopRegion("scan", "i < 4 and buf[0] < 3.0", "i", "i = 0", "i = i + 1")
    loop.add_state("body", is_start_block=True)
    assert _touches(loop, "buf") and not _touches(loop, "bu") and not _touches(loop, "other")
