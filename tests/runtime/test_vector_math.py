"""Generated loops over transcendentals call glibc's SIMD variants (libmvec) where the platform has them,
with results within a few ulp of numpy's; the SDFG handed to the compiler is left as it was."""

from __future__ import annotations

import platform
import subprocess

import dace
import numpy as np
import pytest

from gradflow.core.graph import Graph
from gradflow.runtime import vector_math
from gradflow.runtime.compile import build_key, compile_sdfg, usable_cache_root

N = 1000


@dace.program
def squash32(x: dace.float32[N], y: dace.float32[N]):
    for i in dace.map[0:N]:
        with dace.tasklet:
            a << x[i]
            o >> y[i]
            o = math.tanh(a) * math.exp(-a) + math.log1p(a * a)


@dace.program
def squash64(x: dace.float64[N], y: dace.float64[N]):
    for i in dace.map[0:N]:
        with dace.tasklet:
            a << x[i]
            o >> y[i]
            o = math.tanh(a) * math.exp(-a) + math.log1p(a * a)


def _reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return np.tanh(x) * np.exp(-x) + np.log1p(x * x)


def _exported(graph: Graph) -> str:
    [lib] = [p for p in (usable_cache_root() / build_key(graph.sdfg, graph.fingerprint) / "build").glob("lib*.so")
             if not p.name.startswith("libdacestub")]
    return subprocess.run(["nm", "-D", str(lib)], capture_output=True, text=True, check=True).stdout


def test_the_platform_decides() -> None:
    # this project's machines: x86_64, glibc >= 2.35, GCC -- elsewhere nothing is declared
    if platform.machine() == "x86_64" and (vector_math._glibc() or (0, 0)) >= (2, 35) and vector_math._gcc():
        assert vector_math.enabled() and "tanh" in vector_math.functions()[0]
        assert "tanhf(float) noexcept;" in vector_math.declarations()
    else:
        assert not vector_math.enabled() and vector_math.tag() == "scalar"


@pytest.mark.parametrize("program, dtype, rtol", [(squash32, np.float32, 2e-6), (squash64, np.float64, 1e-14)])
def test_loops_of_transcendentals_use_simd_variants(program, dtype, rtol) -> None:
    graph = Graph.of(program.to_sdfg())
    before = (graph.fingerprint, {k: v.as_string for k, v in graph.sdfg.global_code.items()})
    x = np.random.default_rng(1).uniform(-4, 4, N).astype(dtype)
    y = np.zeros(N, dtype)
    compile_sdfg(graph)(x=x, y=y)
    np.testing.assert_allclose(y, _reference(x), rtol=rtol, atol=rtol)
    assert (graph.fingerprint, {k: v.as_string for k, v in graph.sdfg.global_code.items()}) == before
    if vector_math.enabled():
        suffix = "f" if dtype == np.float32 else ""
        symbols = _exported(graph)
        assert f"v_tanh{suffix}" in symbols and f"v_exp{suffix}" in symbols and "_ZGV" in symbols


def test_avx512_machines_build_with_512_bit_vectors_unless_told(monkeypatch) -> None:
    """On a CPU with AVX-512 GCC is asked for 512-bit vectors (its default under -march=native is 256);
    GRADFLOW_VECTOR_WIDTH=256 keeps its choice, and the choice is part of the compile-cache key."""
    if not vector_math.enabled():
        assert "-mprefer-vector-width" not in vector_math.compiler_args()
        return
    monkeypatch.setattr(vector_math, "_avx512", lambda: True)
    monkeypatch.delenv("GRADFLOW_VECTOR_WIDTH", raising=False)
    wide_args, wide_tag = vector_math.compiler_args(), vector_math.tag()
    assert wide_args.endswith("-mprefer-vector-width=512")
    monkeypatch.setenv("GRADFLOW_VECTOR_WIDTH", "256")
    assert "-mprefer-vector-width" not in vector_math.compiler_args() and vector_math.tag() != wide_tag
    monkeypatch.delenv("GRADFLOW_VECTOR_WIDTH")
    monkeypatch.setattr(vector_math, "_avx512", lambda: False)
    assert "-mprefer-vector-width" not in vector_math.compiler_args() and vector_math.tag() != wide_tag


def test_the_build_calls_the_8_wide_exp_exactly_where_it_asks_for_512_bit_vectors() -> None:
    """On an AVX-512 machine (this project's) the loop calls libmvec's 8-wide exp; elsewhere (no AVX-512,
    GRADFLOW_VECTOR_WIDTH=256, no libmvec) it does not, and the values are the same either way."""
    graph = Graph.of(squash64.to_sdfg())
    x = np.random.default_rng(2).uniform(-4, 4, N)
    y = np.zeros(N)
    compile_sdfg(graph)(x=x, y=y)
    np.testing.assert_allclose(y, _reference(x), rtol=1e-14, atol=1e-14)
    assert ("_ZGVeN8v_exp" in _exported(graph)) is vector_math.wide_vectors()
