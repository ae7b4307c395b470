"""Matrix products shared out over the OpenMP team (`runtime/team_gemm.h`, reached through the shim header
every compiled SDFG's CBLAS calls go through) compute what one BLAS call computes, whichever way a call
is split: by rows or columns of C, or by the inner dimension into partial products added afterwards, and
whichever BLAS runs the blocks: torch's MKL (this process has imported torch), the wheel's OpenBLAS, or
the one of the two measured faster for the shape (GRADFLOW_BLAS=auto, whose first product of a shape runs
both on the same C).

The header is compiled into a small library (one per BLAS: the choice is made at a library's first product)
that records which split each call took, and run with two OpenMP threads in this process (the suite itself
runs with OMP_NUM_THREADS=1)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.runtime.shim_probe import compile_probe

_SOURCE = r"""
static char last_how = 0;
static int last_team = 0;
#define GRADFLOW_TEAM_TRACE(how, team) (last_how = (how), last_team = (team))
#include "gradflow_cblas.h"
extern "C" {
void set_threads(int n) { omp_set_num_threads(n); }
char how() { return last_how; }
int team() { return last_team; }
int mkl() { return gradflow_mkl_found().sgemm != nullptr; }
long routes() { return (long)gradflow_gemm_routes_recorded(); }
#define EXPORT(NAME, T, CALL)                                                                          \
    void NAME(int order, int ta, int tb, int M, int N, int K, T alpha, const T *A, int lda, const T *B,  \
              int ldb, T beta, T *C, int ldc) {                                                        \
        CALL((CBLAS_ORDER)order, (CBLAS_TRANSPOSE)ta, (CBLAS_TRANSPOSE)tb, M, N, K, alpha, A, lda, B,  \
             ldb, beta, C, ldc);                                                                        \
    }
EXPORT(sgemm, float, cblas_sgemm)
EXPORT(dgemm, double, cblas_dgemm)
}
"""

ROW, COL, NO, TRANS = 101, 102, 111, 112


@pytest.fixture(scope="module", params=["mkl", "openblas", "auto"])
def lib(request, tmp_path_factory):
    loaded = compile_probe(tmp_path_factory.mktemp(f"team_gemm_{request.param}"), _SOURCE)
    loaded.how.restype = ctypes.c_char
    loaded.routes.restype = ctypes.c_long
    loaded.choice = request.param
    saved = os.environ.get("GRADFLOW_BLAS")
    os.environ["GRADFLOW_BLAS"] = request.param
    try:
        assert loaded.mkl() == (request.param != "openblas")  # the first product of the library chooses
    finally:
        os.environ.pop("GRADFLOW_BLAS") if saved is None else os.environ.update(GRADFLOW_BLAS=saved)
    loaded.set_threads(2)
    yield loaded
    loaded.set_threads(1)


def _store(logical: np.ndarray, order: int, pad: int) -> np.ndarray:
    """`logical` laid out in `order` with a leading dimension `pad` elements longer than needed."""
    rows, cols = logical.shape
    if order == ROW:
        memory = np.full((rows, cols + pad), np.nan, logical.dtype)
        memory[:, :cols] = logical
    else:
        memory = np.full((cols, rows + pad), np.nan, logical.dtype)
        memory[:, :rows] = logical.T
    return memory


def _load(memory: np.ndarray, order: int, rows: int, cols: int) -> np.ndarray:
    return memory[:, :cols] if order == ROW else memory[:, :rows].T


def _pointer(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", [COL, ROW])
@pytest.mark.parametrize("ta, tb", [(NO, NO), (NO, TRANS), (TRANS, NO), (TRANS, TRANS)])
@pytest.mark.parametrize("m, n, k, beta, split", [
    # each thread's block just over GRADFLOW_TEAM_MIN_BLOCK multiply-adds; the last is under it: one call
    (300, 40, 220, 0.0, "m"), (40, 300, 220, 0.5, "n"), (20, 24, 5400, 0.0, "k"), (20, 24, 5400, -1.5, "k"),
    (37, 5, 11, 0.5, "1"),
])
def test_split_products_equal_numpy(lib, dtype, order, ta, tb, m, n, k, beta, split) -> None:
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((m, k) if ta == NO else (k, m)).astype(dtype)
    b = rng.standard_normal((k, n) if tb == NO else (n, k)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    a_mem, b_mem, c_mem = _store(a, order, 3), _store(b, order, 2), _store(c0, order, 1)
    if beta == 0.0:
        c_mem[...] = np.nan  # beta 0: C is written, never read
    ld = lambda mem: mem.shape[1]  # noqa: E731
    call, ctype = (lib.dgemm, ctypes.c_double) if dtype == np.float64 else (lib.sgemm, ctypes.c_float)
    call(order, ta, tb, m, n, k, ctype(2.0), _pointer(a_mem), ld(a_mem), _pointer(b_mem), ld(b_mem), ctype(beta),
         _pointer(c_mem), ld(c_mem))
    # a row-major call is the transposed column-major one: its M and N trade places
    taken = {"m": "n", "n": "m"}.get(split, split) if order == ROW else split
    assert (lib.how().decode(), lib.team()) == (taken, 1 if split == "1" else 2)
    op_a = a if ta == NO else a.T
    op_b = b if tb == NO else b.T
    want = 2.0 * op_a.astype(np.float64) @ op_b.astype(np.float64) + (beta * c0 if beta else 0.0)
    got = _load(c_mem, order, m, n)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert np.isnan(c_mem[:, -1]).all()  # the padding past each column (row) of C is untouched


def test_the_first_product_of_a_shape_times_both_libraries_and_leaves_one_result(lib) -> None:
    # auto: the first call runs MKL, OpenBLAS, MKL, OpenBLAS (and MKL again if it won) on C restored each
    # time; C must end as one product added to beta * C, the library kept for the shape's later calls
    rng = np.random.default_rng(17)
    a, b = rng.standard_normal((23, 31)), rng.standard_normal((31, 29))
    before = lib.routes()
    for call in range(2):
        c0 = rng.standard_normal((23, 29))
        c = np.asfortranarray(c0.copy())
        lib.dgemm(COL, NO, NO, 23, 29, 31, ctypes.c_double(2.0), _pointer(np.asfortranarray(a)), 23,
                  _pointer(np.asfortranarray(b)), 31, ctypes.c_double(0.5), _pointer(c), 23)
        np.testing.assert_allclose(c, 2.0 * a @ b + 0.5 * c0, rtol=1e-12, atol=1e-12)
        assert lib.routes() - before == (1 if lib.choice == "auto" else 0)  # recorded at the first call only


def test_one_thread_makes_one_call(lib) -> None:
    lib.set_threads(1)
    try:
        a = np.ones((300, 300)); c = np.zeros((300, 300))  # 2.7e7 multiply-adds: split with two threads
        lib.dgemm(COL, NO, NO, 300, 300, 300, ctypes.c_double(1.0), _pointer(a), 300, _pointer(a), 300,
                  ctypes.c_double(0.0), _pointer(c), 300)
        assert (lib.how().decode(), lib.team()) == ("1", 1) and (c == 300.0).all()
    finally:
        lib.set_threads(2)


_COMPILED = """
import numpy as np, dace, gradflow
from gradflow.runtime.compile import compile_sdfg
N = 192
@dace.program
def product(a: dace.float64[N, N], b: dace.float64[N, N], c: dace.float64[N, N]):
    c[:] = a @ b
rng = np.random.default_rng(0)
a, b, c = rng.standard_normal((N, N)), rng.standard_normal((N, N)), np.zeros((N, N))
graph = gradflow.Graph.of(product)
compile_sdfg(graph)(a=a, b=b, c=c)
from gradflow.runtime.compile import build_key, usable_cache_root
code = "".join(p.read_text() for p in (usable_cache_root() / build_key(graph.sdfg, graph.fingerprint)).rglob("*.cpp"))
print("gradflow_cblas.h" in code, "cblas_dgemm(" in code, np.abs(c - a @ b).max() / np.abs(a @ b).max())
"""


def test_a_compiled_product_on_two_threads(tmp_path) -> None:
    # end to end: the generated code calls cblas_dgemm with the shim (which maps it onto the team wrapper)
    # included, and gets the product right with two threads; fresh process, as the thread count is its state
    script = tmp_path / "product.py"  # DaCe parses a program from its source file
    script.write_text(_COMPILED)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    includes, calls, error = out.stdout.split()[-3:]
    assert (includes, calls) == ("True", "True") and float(error) < 1e-13


_VERBOSE = """
import numpy as np, dace, gradflow
from gradflow.runtime.compile import compile_sdfg
@dace.program
def product(a: dace.float32[64, 96], b: dace.float32[96, 80], c: dace.float32[64, 80]):
    c[:] = a @ b
rng = np.random.default_rng(1)
a, b = rng.standard_normal((64, 96), np.float32), rng.standard_normal((96, 80), np.float32)
c = np.zeros((64, 80), np.float32)
compile_sdfg(gradflow.Graph.of(product))(a=a, b=b, c=c)
from gradflow.runtime import blas
print("library", blas.gemm_library())
print("error", np.abs(c - a.astype(np.float64) @ b).max())
"""


@pytest.mark.parametrize("choice, mkl, says", [(None, True, "auto"), ("auto", True, "auto"), ("mkl", True, "mkl"),
                                              ("openblas", False, "openblas")])
def test_which_blas_a_compiled_product_calls(tmp_path, choice, mkl, says) -> None:
    # MKL_VERBOSE makes MKL print a line per call: there is one unless GRADFLOW_BLAS asks for OpenBLAS
    # (gradflow imports torch, whose libtorch_cpu.so carries MKL; auto times it at the first product); the
    # product is right either way
    script = tmp_path / "verbose.py"
    script.write_text(_VERBOSE)
    env = {**os.environ, "MKL_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("GRADFLOW_BLAS", None)
    if choice:
        env["GRADFLOW_BLAS"] = choice
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("SGEMM(" in out.stdout) == mkl, out.stdout[-2000:]
    assert float(out.stdout.split()[-1]) < 1e-4
    assert f"library {says}" in out.stdout  # what gradflow says it uses


def test_an_unknown_blas_choice_is_named(monkeypatch) -> None:
    from gradflow.core.errors import InvalidArgumentError
    from gradflow.runtime import blas

    monkeypatch.setenv("GRADFLOW_BLAS", "OpenBLAS")
    with pytest.raises(InvalidArgumentError, match="GRADFLOW_BLAS is 'OpenBLAS'; it takes one of 'auto', 'mkl', 'openblas'"):
        blas.gemm_library()
