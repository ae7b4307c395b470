"""Matrix products run on a real BLAS: the generated code of forward and backward calls cblas_dgemm.

The project installs OpenBLAS through its `scipy-openblas32` dependency (pyproject.toml); a setup without
it is a broken setup here, so these tests fail rather than skip when it is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import gradflow
import gradflow.api
from gradflow.core.graph import Graph
from gradflow.runtime import blas
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.corpus.library import CASES_BY_NAME
from gradflow.verify.library import compiled as _compiled


def _calls(compiled) -> list[str]:
    folder = Path(compiled.sdfg.build_folder) / "src" / "cpu"
    return [c for f in folder.glob("*.cpp") for c in re.findall(r"\bcblas_\w+", f.read_text())]


def test_blas_is_installed() -> None:
    assert blas.available(), blas.describe()
    assert "OpenBLAS" in blas.describe()


def test_matmul_forward_and_backward_call_dgemm() -> None:
    calls = _calls(_compiled("matmul_mm", "rule"))
    assert calls.count("cblas_dgemm") == 3, calls  # C = A @ X; gA += gC X^T; gX += A^T gC


def test_expansion_route_has_no_blas_call() -> None:
    assert _calls(_compiled("matmul_mm", "expand")) == []


def test_matvec_backward_calls_dgemv() -> None:
    assert _calls(_compiled("matmul_mv", "rule")).count("cblas_dgemv") == 2  # y = A x; gx = A^T gy


@pytest.mark.parametrize("name, call, count", [
    ("matmul_slice3d", "cblas_dgemm", 3),  # C = A[b] @ X on a 3-D slice; both gradients into slices
    ("gemm_subblocks", "cblas_dgemm", 3),  # transposed sub-blocks in and out
    ("matmul_col_mat", "cblas_dgemv", 2),  # r = A[:, 0] @ A[:, 1:]; the column's gradient
    ("gemv_transposed_slice", "cblas_dgemv", 2),  # forward, and gX[1:N+1, 1] += 1.5 A[...] gY[:, 2]
    ("gemm_padded_operand", "cblas_dgemm", 3),  # T, a copy of A, is rebuilt packed for gX's product
])
def test_products_on_subsets_stay_on_blas(name: str, call: str, count: int) -> None:
    """Backward products of slices, columns and sub-blocks are BLAS calls on those subsets; an operand BLAS
    cannot address (a padded array) falls back to a map for that one product."""
    assert _calls(_compiled(name, "rule")).count(call) == count


def test_a_padded_operand_falls_back_to_a_map_with_the_same_gradients() -> None:
    """Stored (not rebuilt), the padded copy T is what gX's product reads: BLAS cannot address it, so that
    one product is a map (`_contract`'s fallback), and the gradients equal the rebuilt route's."""
    case = CASES_BY_NAME["gemm_padded_operand"]
    stored = compile_sdfg(gradflow.api.grad_graph(case.program.to_sdfg(simplify=True), list(case.wrt), "S",
                                                  forwarding=gradflow.Forwarding(rebuild_copies=False)))
    assert _calls(stored).count("cblas_dgemm") == 2  # forward and gT
    sizes = {"N": 5, "M": 4, "K": 6}
    inputs = case.make_inputs(np.random.default_rng(2), sizes)
    results = []
    for program in (stored, _compiled("gemm_padded_operand", "rule")):
        out = {"S": np.zeros(1), **{f"grad_{w}": np.zeros_like(inputs[w]) for w in case.wrt}}
        program(**{k: v.copy() for k, v in inputs.items()}, **out, **sizes)
        results.append(out)
    for k in results[0]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-13, atol=1e-14, err_msg=k)


def test_vjp_backward_sdfg_calls_dgemm() -> None:
    case = CASES_BY_NAME["matmul_mm"]
    result = gradflow.vjp(case.program.to_sdfg(simplify=True), wrt=["A", "X"], of="S")
    calls = _calls(compile_sdfg(Graph.adopt(result.backward)))
    assert calls.count("cblas_dgemm") == 2, calls


def test_gemm_result_through_blas_is_correct_for_large_sizes() -> None:
    """Sizes where OpenBLAS takes its blocked kernels (a loop nest and BLAS disagree only by rounding)."""
    case = CASES_BY_NAME["matmul_transposed"]
    sizes = {"N": 67, "M": 45, "K": 130}
    rng = np.random.default_rng(0)
    inputs = case.make_inputs(rng, sizes)
    arrays = {**{k: v.copy() for k, v in inputs.items()}, "S": np.zeros(1),
              "grad_A": np.zeros((67, 130)), "grad_X": np.zeros((45, 130))}
    _compiled("matmul_transposed", "rule")(**arrays, **sizes)
    A, X, W = inputs["A"], inputs["X"], inputs["W"]
    np.testing.assert_allclose(arrays["S"][0], np.sum((A @ X.T) * W), rtol=1e-9)
    np.testing.assert_allclose(arrays["grad_A"], W @ X, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(arrays["grad_X"], W.T @ A, rtol=1e-9, atol=1e-12)
