"""`overwrite_zeroed_products`: a gradient buffer whose first writer after the zeroing covers it -- a Gemm
(computed with beta = 0) or a map adding into each element once (a plain write) -- is not zeroed. The
gradients stay those of the unoptimized route (here, and on every corpus program in test_two_routes.py)."""

from __future__ import annotations

import dace
import numpy as np
from dace.libraries.blas.nodes.gemm import Gemm

import gradflow
from gradflow.core.passes import Pipeline
from gradflow.optimize.overwrite_zeroed_products import OverwriteZeroedProducts, _candidates
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


def _wcr_writes(sdfg: dace.SDFG, name: str) -> int:
    """Edges that add into `name` from a map or tasklet, and Gemms accumulating into it."""
    count = 0
    for state in sdfg.states():
        for edge in state.edges():
            if edge.data.data == name and edge.data.wcr is not None and isinstance(edge.dst, dace.nodes.AccessNode):
                count += 1
            if isinstance(edge.src, Gemm) and edge.data.data == name and edge.src.beta != 0:
                count += 1
    return count


@dace.program
def rows_and_diagonal(A: dace.float64[N, N], V: dace.float64[N, N], S: dace.float64[1]):
    # grad_V's only writer is the map of sin(A) * V's reverse, reaching each element once; grad_A gets that
    # map's contribution and the first row's, which covers a part of it
    S[0] = np.sum(np.sin(A) * V) + np.sum(A[0, :])


def test_a_map_adding_into_each_element_once_overwrites_the_zeros() -> None:
    plain = gradflow.grad(rows_and_diagonal, wrt=["A", "V"], of="S", optimize=False)
    rewritten = gradflow.grad(rows_and_diagonal, wrt=["A", "V"], of="S",
                              optimize=Pipeline((OverwriteZeroedProducts(),)))
    assert _wcr_writes(rewritten, "grad_V") == 0 < _wcr_writes(plain, "grad_V")
    rng = np.random.default_rng(2)
    inputs = {"A": rng.standard_normal((N, N)), "V": rng.standard_normal((N, N))}
    results = []
    for sdfg in (plain, rewritten):
        gA, gV = np.full((N, N), np.nan), np.full((N, N), np.nan)
        compile_sdfg(sdfg)(**inputs, S=np.zeros(1), grad_A=gA, grad_V=gV)
        results.append((gA, gV))
    for w, g in zip(*results):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-14)
    np.testing.assert_allclose(results[1][1], np.sin(inputs["A"]), rtol=1e-14)


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
    writers = [c for s in plain.all_sdfgs_recursive() for c in _candidates(s)]
    assert sorted(t.data for _, _, t, _ in writers) == ["grad_A", "grad_B", "gradflow_g_C", "gradflow_g_expr_times_V"]
    assert _gemm_betas(plain) == [1, 1] and _gemm_betas(rewritten) == [0, 0]
    want, got = _grads(plain, _inputs()), _grads(rewritten, _inputs())
    for w, g in zip(want, got):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-14)


def test_a_buffer_that_another_contribution_reaches_first_keeps_its_zeros() -> None:
    plain = gradflow.grad(layer_twice, wrt=["A", "B"], of="S", optimize=False)
    rewritten = gradflow.grad(layer_twice, wrt=["A", "B"], of="S", optimize=Pipeline((OverwriteZeroedProducts(),)))
    assert _gemm_betas(rewritten) == [0, 1]  # B's product still overwrites, A's adds to the map's part
    # (the map of A * A adds two contributions into each element of grad_A: it keeps the zeros too)
    assert _wcr_writes(rewritten, "grad_A") == _wcr_writes(plain, "grad_A")
    got, want = _grads(rewritten, _inputs()), _grads(plain, _inputs())
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-14)


def test_a_loop_whose_condition_reads_the_buffer_touches_it() -> None:
    from dace.sdfg.state import LoopRegion

    from gradflow.analysis.access import touches

    loop = LoopRegion("scan", "i < 4 and buf[0] < 3.0", "i", "i = 0", "i = i + 1")
    loop.add_state("body", is_start_block=True)
    assert touches(loop, "buf") and not touches(loop, "bu") and not touches(loop, "other")
