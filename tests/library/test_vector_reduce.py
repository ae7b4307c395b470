"""The `gradflow-vector` expansion of `Reduce` (`gradflow/library/vector_reduce.py`) against numpy.

One program holds every layout the expansion distinguishes -- the unit-stride axis reduced (row sums, a
full sum folded into one loop), kept (column sums: the whole output row updated per step), both mixed
(`axis=(0, 2)`), a strided view as input, and `+`, `*`, `max`, `min` -- so it compiles once; the data
vary. `local_reductions` must pick this expansion for each of them."""

from __future__ import annotations

import dace
import numpy as np
import pytest

from gradflow.core.graph import Graph
from gradflow.library.vector_reduce import IMPLEMENTATION
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.reductions import LocalReductions
from gradflow.runtime.compile import compile_sdfg

N, M, K = (dace.symbol(s) for s in "NMK")
f64 = dace.float64


@dace.program
def reductions(A: f64[N, M, K], B: f64[N, M], rows: f64[N, M], cols: f64[M, K], mx: f64[N, K], mn: f64[M],
               pr: f64[N, K], total: f64[1], strided: f64[1], colmax: f64[M]):
    rows[:] = np.sum(A, axis=2)
    cols[:] = np.sum(A, axis=0)
    mx[:] = np.max(A, axis=1)
    mn[:] = np.min(A, axis=(0, 2))
    pr[:] = np.multiply.reduce(A, axis=1)
    total[0] = np.sum(A)
    strided[0] = np.sum(B[1:, ::2])
    colmax[:] = np.max(B, axis=0)


def _expected(A: np.ndarray, B: np.ndarray) -> dict[str, np.ndarray]:
    return {"rows": A.sum(axis=2), "cols": A.sum(axis=0), "mx": A.max(axis=1), "mn": A.min(axis=(0, 2)),
            "pr": A.prod(axis=1), "total": np.array([A.sum()]), "strided": np.array([B[1:, ::2].sum()]),
            "colmax": B.max(axis=0)}


@pytest.fixture(scope="module")
def compiled():
    graph = Graph.of(reductions.to_sdfg(simplify=True))
    optimized = OPTIMIZE(graph).unwrap()
    return graph, optimized, compile_sdfg(optimized)


def test_local_reductions_picks_the_vector_expansion_for_every_reduction(compiled) -> None:
    graph, _, _ = compiled
    from dace.libraries.standard.nodes.reduce import Reduce
    picked = [n.implementation for n, _ in LocalReductions()(graph).unwrap().sdfg.all_nodes_recursive()
              if isinstance(n, Reduce)]
    assert len(picked) == 8 and set(picked) == {IMPLEMENTATION}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", [(5, 7, 9), (3, 1, 16), (2, 33, 3)])
def test_every_layout_matches_numpy(compiled, seed: int, shape: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(seed)
    n, m, k = shape
    A, B = rng.uniform(0.5, 1.5, size=shape), rng.normal(size=(n, m))
    got = {"rows": np.zeros((n, m)), "cols": np.zeros((m, k)), "mx": np.zeros((n, k)), "mn": np.zeros(m),
           "pr": np.zeros((n, k)), "total": np.zeros(1), "strided": np.zeros(1), "colmax": np.zeros(m)}
    compiled[2](A=A, B=B, N=n, M=m, K=k, **got)
    for name, want in _expected(A, B).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-12, atol=1e-12, err_msg=name)
