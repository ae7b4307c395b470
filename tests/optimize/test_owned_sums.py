"""`nest_reductions`: a map summing into elements that only some of its parameters index runs parallel over
those and sequentially over the rest, through a register accumulator, so no sum is atomic. The results of
every corpus program stay those of the unoptimized route (test_two_routes.py); here, what the pass builds
and what it must leave alone."""

from __future__ import annotations

import copy

import dace
import numpy as np
from dace.sdfg import nodes as nd

from gradflow.core.graph import Graph
from gradflow.optimize.owned_sums import NestReductions, owners
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
