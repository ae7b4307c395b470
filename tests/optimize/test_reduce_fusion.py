"""`reduce_in_maps`: an element-wise map whose result only a reduction reads (kmeans' minimum over the
all-pairs distances, a weighted sum, the largest absolute difference) reduces into the reduction's output;
a temporary read by something else too, read in part, or a map reading the output, keeps its temporary.
Values equal numpy's on hypothesis data (one build per program); the minimum and maximum exactly."""

from __future__ import annotations

import functools

import dace
import numpy as np
import pytest
from dace.libraries.standard.nodes.reduce import Reduce
from hypothesis import given, settings
from hypothesis import strategies as st

from gradflow.core.graph import Graph
from gradflow.optimize import OPTIMIZE, optimized
from gradflow.runtime.compile import compile_sdfg

N, K, D = (dace.symbol(s) for s in "NKD")


@dace.program
def nearest(points: dace.float64[N, D], centroids: dace.float64[K, D], S: dace.float64[1]):
    distances = (np.sum(points * points, axis=1)[:, None] + np.sum(centroids * centroids, axis=1)[None, :]
                 - 2.0 * (points @ np.transpose(centroids)))
    S[0] = np.sum(np.min(distances, axis=1))


def nearest_numpy(points, centroids):
    distances = (points * points).sum(1)[:, None] + (centroids * centroids).sum(1)[None, :] - 2 * points @ centroids.T
    return distances.min(1).sum()


@dace.program
def largest_difference(x: dace.float64[N, K], y: dace.float64[N, K], M: dace.float64[K]):
    M[:] = np.max(np.abs(x - y), axis=0)


@dace.program
def weighted(x: dace.float64[N, K], w: dace.float64[N, K], S: dace.float64[1]):
    S[0] = np.sum(w * np.tanh(x))


@dace.program
def kept_for_later(x: dace.float64[N, K], M: dace.float64[N], T: dace.float64[N, K]):
    t = np.exp(x)
    M[:] = np.max(t, axis=1)
    T[:] = t * 2.0  # the temporary has another reader: no fusion


@dace.program
def partial(x: dace.float64[N, K], M: dace.float64[N]):
    t = x * 3.0
    M[:] = np.min(t[:, 1:], axis=1)  # the reduction reads part of it: no fusion


def _reduces(sdfg: dace.SDFG) -> int:
    return sum(isinstance(n, Reduce) for n, _ in sdfg.all_nodes_recursive())


def _built(program):
    graph = Graph.of(program)
    before = optimized(graph, OPTIMIZE.without("reduce_in_maps")).sdfg
    after = optimized(graph).sdfg
    return before, after


@pytest.fixture(scope="module")
def nearest_built():
    before, after = _built(nearest)
    return before, after, compile_sdfg(after)


def test_the_minimum_of_the_distances_reduces_in_their_map(nearest_built):
    before, after, _ = nearest_built
    assert "distances" in before.arrays and "distances" not in after.arrays
    assert _reduces(after) == _reduces(before) - 3  # the two row sums and the minimum; the total stays


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_the_minimum_keeps_its_value(nearest_built, n, k, d, seed):
    rng = np.random.default_rng(seed)
    points, centroids = rng.standard_normal((n, d)), rng.standard_normal((k, d))
    S = np.zeros(1)
    nearest_built[2](points=points, centroids=centroids, S=S, N=n, K=k, D=d)
    np.testing.assert_allclose(S[0], nearest_numpy(points, centroids), rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def others_built():
    out = {}
    for name, program in (("largest_difference", largest_difference), ("weighted", weighted)):
        before, after = _built(program)
        out[name] = (before, after, compile_sdfg(after))
    return out


def test_a_maximum_and_a_sum_reduce_in_their_maps(others_built):
    for name, (before, after, _) in others_built.items():
        assert _reduces(after) == _reduces(before) - 1, name


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 9), st.integers(1, 70), st.integers(0, 2**32 - 1))
def test_a_maximum_and_a_sum_keep_their_values(others_built, n, k, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((n, k)), rng.standard_normal((n, k))
    M, S = np.zeros(k), np.zeros(1)
    others_built["largest_difference"][2](x=x, y=y, M=M, N=n, K=k)
    np.testing.assert_array_equal(M, np.abs(x - y).max(0))  # exact: a maximum does not round
    others_built["weighted"][2](x=x, w=y, S=S, N=n, K=k)
    np.testing.assert_allclose(S[0], (y * np.tanh(x)).sum(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("program", [kept_for_later, partial], ids=["kept_for_later", "partial"])
def test_a_temporary_read_elsewhere_or_in_part_is_kept(program):
    before, after = _built(program)
    assert _reduces(before) == _reduces(after) == 1
    assert "t" in before.arrays and "t" in after.arrays
    n, k = 4, 6
    x = np.random.default_rng(0).standard_normal((n, k))
    arrays = {"x": x, "M": np.zeros(n)}
    if program is kept_for_later:
        arrays["T"] = np.zeros((n, k))
    compile_sdfg(after)(**arrays, N=n, K=k)
    want = np.exp(x).max(1) if program is kept_for_later else (3 * x)[:, 1:].min(1)
    np.testing.assert_allclose(arrays["M"], want, rtol=1e-14, atol=0)  # exp: glibc's and numpy's may differ


@dace.program
def row_maximum(x: dace.float64[N, 16], M: dace.float64[N]):
    M[:] = np.max(np.abs(x) * 2.0, axis=1)  # 16 terms per row: `nest_reductions` keeps them in 16 register lanes


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_a_row_maximum_in_register_lanes_keeps_its_value(n, seed):
    run = _row_maximum()
    x = np.random.default_rng(seed).standard_normal((n, 16))
    M = np.zeros(n)
    run(x=x, M=M, N=n)
    np.testing.assert_array_equal(M, (np.abs(x) * 2.0).max(1))  # exact: no rounding anywhere


@functools.cache
def _row_maximum():
    before, after = _built(row_maximum)
    assert _reduces(after) == _reduces(before) - 1
    assert any(name.startswith("gradflow_acc_M") and desc.total_size == 16 for name, desc in after.arrays.items())
    return compile_sdfg(after)
