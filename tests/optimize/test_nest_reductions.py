"""`nest_reductions`: a map summing into elements that only some of its parameters index runs parallel over
those and sequentially over the rest, through a register accumulator, so no sum is atomic. The results of
every corpus program stay those of the unoptimized route (test_two_routes.py); here, what the pass builds
and what it must leave alone."""

from __future__ import annotations

import copy

import dace
import numpy as np
from dace.sdfg import nodes as nd

from gradflow.analysis.writes import may_read_before_write, overwritten_before_read
from gradflow.core.graph import Graph
from gradflow.optimize.nest_reductions import NestReductions, owners
from gradflow.runtime.compile import compile_sdfg

N, K = dace.symbol("N"), dace.symbol("K")


@dace.program
def matvec(A: dace.float64[N, K], x: dace.float64[K], y: dace.float64[N]):
    for i, k in dace.map[0:N, 0:K]:
        with dace.tasklet:
            a << A[i, k]
            b << x[k]
            o >> y(1, lambda p, q: p + q)[i]
            o = a * b


@dace.program
def shifted_sum(A: dace.float64[N, K], y: dace.float64[N + K]):
    for i, k in dace.map[0:N, 0:K]:
        with dace.tasklet:
            a << A[i, k]
            o >> y(1, lambda p, q: p + q)[i + k]
            o = a


def _top_maps(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.MapEntry]]:
    return [(s, n) for s in sdfg.states() for n in s.nodes() if isinstance(n, nd.MapEntry) and s.entry_node(n) is None]


def test_a_contraction_runs_parallel_over_its_outputs_and_accumulates_in_a_register() -> None:
    plain = Graph.of(matvec.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert owners(state, entry) == ["i"]
    nested = NestReductions()(plain).unwrap()
    [(state, outer)] = _top_maps(nested.sdfg)
    assert outer.map.params == ["i"] and outer.map.schedule == dace.ScheduleType.Default
    [inner] = [n for n in state.scope_children()[outer] if isinstance(n, nd.MapEntry)]
    assert inner.map.params == ["k"] and inner.map.schedule == dace.ScheduleType.Sequential
    accumulators = [n for n, d in nested.sdfg.arrays.items() if n.startswith("gradflow_acc_")]
    assert accumulators and nested.sdfg.arrays[accumulators[0]].storage == dace.StorageType.Register
    rng = np.random.default_rng(0)
    A, x = rng.standard_normal((7, 5)), rng.standard_normal(5)
    results = []
    for graph in (plain, nested):
        y = np.full(7, 0.5)  # the sums add to what y holds
        compile_sdfg(graph)(A=A, x=x, y=y, N=7, K=5)
        results.append(y)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-14)
    np.testing.assert_allclose(results[0], 0.5 + A @ x, rtol=1e-14)


def test_sums_no_parameter_owns_are_left_alone() -> None:
    # y[i + k]: iterations with different i write the same element (i + k = const), so neither owns it
    plain = Graph.of(shifted_sum.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert owners(state, entry) is None
    assert NestReductions()(plain).unwrap().fingerprint == plain.fingerprint


@dace.program
def channel_sums(x: dace.float32[6, 4, 5, 16], s: dace.float32[4]):
    # a BatchNorm's per-channel sum: c owns s[c], the innermost loop has a constant extent of 16
    for n, c, h, w in dace.map[0:6, 0:4, 0:5, 0:16]:
        with dace.tasklet:
            a << x[n, c, h, w]
            o >> s(1, lambda p, q: p + q)[c]
            o = a


def test_a_short_constant_innermost_loop_sums_into_lanes() -> None:
    # one accumulator per iteration of the w loop: no add waits for the previous one, the loop vectorizes
    plain = Graph.of(channel_sums.to_sdfg())
    nested = NestReductions()(plain).unwrap()
    [acc] = [d for n, d in nested.sdfg.arrays.items() if n.startswith("gradflow_acc_")]
    assert tuple(acc.shape) == (16,) and acc.storage == dace.StorageType.Register
    x = np.random.default_rng(2).standard_normal((6, 4, 5, 16)).astype(np.float32)
    results = []
    for graph in (plain, nested):
        s = np.full(4, 0.5, np.float32)
        compile_sdfg(graph)(x=x, s=s)
        results.append(s)
    want = 0.5 + x.astype(np.float64).sum(axis=(0, 2, 3))
    for got in results:
        np.testing.assert_allclose(got, want, rtol=2e-6)


@dace.program
def window_max(x: dace.float32[4, 3, 8, 8], y: dace.float32[4, 3, 4, 4]):
    # a 2x2 MaxPool: each output element is the max over its window
    for n, c, o0, o1, k0, k1 in dace.map[0:4, 0:3, 0:4, 0:4, 0:2, 0:2]:
        with dace.tasklet:
            a << x[n, c, 2 * o0 + k0, 2 * o1 + k1]
            o >> y(1, lambda p, q: max(p, q))[n, c, o0, o1]
            o = a


def test_a_max_over_windows_runs_without_critical_sections() -> None:
    plain = Graph.of(window_max.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert owners(state, entry) == ["n", "c", "o0", "o1"]
    nested = NestReductions()(plain).unwrap()
    code = "".join(obj.clean_code for obj in copy.deepcopy(nested.sdfg).generate_code())
    assert "reduce_atomic" not in code and not any(n.startswith("gradflow_acc_") for n in nested.sdfg.arrays)
    x = np.random.default_rng(3).standard_normal((4, 3, 8, 8)).astype(np.float32)
    for graph in (plain, nested):
        y = np.full((4, 3, 4, 4), -np.inf, np.float32)
        compile_sdfg(graph)(x=x, y=y)
        np.testing.assert_array_equal(y, x.reshape(4, 3, 4, 2, 4, 2).max(axis=(3, 5)))


@dace.program
def two_biases(g: dace.float32[64, 16], gb: dace.float32[32]):
    # the adjoint of adding two bias vectors stored end to end (an LSTM's input and recurrent biases):
    # iteration (s, q) adds into gb[q] and gb[q + 16]; the two halves never meet, so q owns both
    for s, q in dace.map[0:64, 0:16]:
        with dace.tasklet:
            a << g[s, q]
            lo >> gb(1, lambda x, y: x + y)[q]
            hi >> gb(1, lambda x, y: x + y)[q + 16]
            lo = a
            hi = 2 * a


@dace.program
def overlapping_halves(g: dace.float32[64, 16], gb: dace.float32[32]):
    # gb[q] and gb[q + 8]: iteration q = 8 of the first meets q = 0 of the second -- not owned
    for s, q in dace.map[0:64, 0:16]:
        with dace.tasklet:
            a << g[s, q]
            lo >> gb(1, lambda x, y: x + y)[q]
            hi >> gb(1, lambda x, y: x + y)[q + 8]
            lo = a
            hi = 2 * a


def test_sums_through_disjoint_subsets_of_one_array_are_owned() -> None:
    plain = Graph.of(two_biases.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert owners(state, entry) == ["q"]
    nested = NestReductions()(plain).unwrap()
    code = "".join(obj.clean_code for obj in copy.deepcopy(nested.sdfg).generate_code())
    assert "reduce_atomic" not in code
    g = np.random.default_rng(4).standard_normal((64, 16)).astype(np.float32)
    gb = np.full(32, 0.5, np.float32)
    compile_sdfg(nested)(g=g, gb=gb)
    column = g.astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(gb, 0.5 + np.concatenate([column, 2 * column]), rtol=2e-6, atol=2e-6)


def test_sums_through_overlapping_subsets_are_left_alone() -> None:
    plain = Graph.of(overlapping_halves.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert owners(state, entry) is None
    assert NestReductions()(plain).unwrap().fingerprint == plain.fingerprint


@dace.program
def gate_blocks(g: dace.float32[8, 4], gates: dace.float32[8, 16]):
    # g[b, j + 4 k] for four blocks k: every element has one (b, j); there is nothing to reorder
    for b, j in dace.map[0:8, 0:4]:
        with dace.tasklet:
            a << g[b, j]
            o0 >> gates(1, lambda x, y: x + y)[b, j]
            o1 >> gates(1, lambda x, y: x + y)[b, j + 4]
            o2 >> gates(1, lambda x, y: x + y)[b, j + 8]
            o0 = a
            o1 = 2 * a
            o2 = 3 * a


def test_sums_every_parameter_owns_through_several_subsets_keep_their_order() -> None:
    plain = Graph.of(gate_blocks.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert owners(state, entry) is None


@dace.program
def bias_gradient(g: dace.float32[32, 256], c: dace.float32[32, 256], gb: dace.float32[256]):
    # the adjoint of a bias added to every row: j owns gb[j] and is the unit-stride index of g and c
    for i, j in dace.map[0:32, 0:256]:
        with dace.tasklet:
            a << g[i, j]
            o >> gb(1, lambda p, q: p + q)[j]
            copy >> c[i, j]
            o = a
            copy = a


def test_a_unit_stride_owner_is_tiled_innermost() -> None:
    # parallel over tiles of 64 columns; in each, the rows in order, then the tile's columns (memory order)
    plain = Graph.of(bias_gradient.to_sdfg())
    nested = NestReductions()(plain).unwrap()
    [(state, outer)] = _top_maps(nested.sdfg)
    assert outer.map.schedule == dace.ScheduleType.Default and outer.map.range.ranges[0][2] == 64
    rows = [n for n in state.scope_children()[outer] if isinstance(n, nd.MapEntry)]
    assert [m.map.params for m in rows] == [["i"]] and rows[0].map.schedule == dace.ScheduleType.Sequential
    [columns] = [n for n in state.scope_children()[rows[0]] if isinstance(n, nd.MapEntry)]
    assert columns.map.params == ["j"] and columns.map.schedule == dace.ScheduleType.Sequential
    g = np.random.default_rng(5).standard_normal((32, 256)).astype(np.float32)
    results = []
    for graph in (plain, nested):
        gb, c = np.full(256, 0.5, np.float32), np.zeros((32, 256), np.float32)
        compile_sdfg(graph)(g=g, c=c, gb=gb)
        np.testing.assert_array_equal(c, g)
        results.append(gb)
    # float32 sums of 32 terms of size 1: a few ulps of the terms, whatever the sum
    np.testing.assert_allclose(results[1], 0.5 + g.astype(np.float64).sum(axis=0), rtol=0, atol=2e-5)
    np.testing.assert_allclose(results[1], results[0], rtol=0, atol=2e-5)


R, C = dace.symbol("R"), dace.symbol("C")


@dace.program
def column_sums(g: dace.float64[R, C], c: dace.float64[R, C], gb: dace.float64[C]):
    # the same with symbolic sizes (k-means' gradient of |c|^2 summed over the points: C centroids)
    for i, j in dace.map[0:R, 0:C]:
        with dace.tasklet:
            a << g[i, j]
            o >> gb(1, lambda p, q: p + q)[j]
            copy >> c[i, j]
            o = a
            copy = -2.0 * a


def test_a_unit_stride_owner_of_symbolic_extent_is_tiled_with_a_short_last_tile() -> None:
    plain = Graph.of(column_sums.to_sdfg())
    nested = NestReductions()(plain).unwrap()
    [(state, outer)] = _top_maps(nested.sdfg)
    assert outer.map.range.ranges[0][2] == 64
    [rows] = [n for n in state.scope_children()[outer] if isinstance(n, nd.MapEntry)]
    [columns] = [n for n in state.scope_children()[rows] if isinstance(n, nd.MapEntry)]
    assert (rows.map.params, columns.map.params) == (["i"], ["j"])
    rng = np.random.default_rng(6)
    for r, c in ((7, 150), (3, 64), (5, 10)):  # a short last tile, whole tiles, one short tile
        g = rng.standard_normal((r, c))
        results = []
        for graph in (plain, nested):
            gb, out = np.full(c, 0.25), np.zeros((r, c))
            compile_sdfg(graph)(g=g, c=out, gb=gb, R=r, C=c)
            np.testing.assert_array_equal(out, -2.0 * g)
            results.append(gb)
        np.testing.assert_allclose(results[1], 0.25 + g.sum(axis=0), rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(results[1], results[0], rtol=1e-14, atol=1e-14)


def test_tiling_keeps_what_the_map_overwrites() -> None:
    """The tiled map still writes `c` whole before anything reads it: its outer memlets stay the map's
    own (DaCe's propagation over a short last tile made them dynamic) and the analysis joins the tiles.
    Before, `value_and_grad` refused to allocate lp_covariance's `grad_data` (a tiled owner)."""
    plain = Graph.of(column_sums.to_sdfg())
    nested = NestReductions()(plain).unwrap()
    assert overwritten_before_read(plain.sdfg, "c")
    assert overwritten_before_read(nested.sdfg, "c")
    assert not may_read_before_write(nested.sdfg, "c")
    [(state, outer)] = _top_maps(nested.sdfg)
    assert not any(e.data.dynamic for e in state.out_edges(state.exit_node(outer)))
