"""`split_sum_maps`: a map whose one tasklet sums into arrays owned by different parameters (the adjoint of
a depthwise convolution: the weight's gradient owned by channel and tap, the input's by batch and
channel) becomes one map per array, each then nested by its own owners. The results stay those of the
one map; maps that read what they sum into, or whose sums share their owners, are left alone."""

from __future__ import annotations

import math  # noqa: F401 - the tasklets' `math.tanh`

import dace
import numpy as np
import torch
from dace.sdfg import nodes as nd

import gradflow
from gradflow.core.graph import Graph
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.nest_reductions import NestReductions
from gradflow.optimize.split_sums import SplitSumMaps, groups
from gradflow.runtime.compile import compile_sdfg

N, C, L = (dace.symbol(s) for s in "NCL")


@dace.program
def depthwise_adjoint(x: dace.float64[N, C, L + 2], w: dace.float64[C, 3], g: dace.float64[N, C, L],
                      gx: dace.float64[N, C, L + 2], gw: dace.float64[C, 3]):
    for n, c, o, k in dace.map[0:N, 0:C, 0:L, 0:3]:
        with dace.tasklet:
            a << x[n, c, o + k]
            b << w[c, k]
            d << g[n, c, o]
            da >> gx(1, lambda p, q: p + q)[n, c, o + k]
            db >> gw(1, lambda p, q: p + q)[c, k]
            da = d * b
            db = d * a


@dace.program
def reads_its_target(x: dace.float64[N, C], w: dace.float64[C], gx: dace.float64[N, C], gw: dace.float64[C]):
    for n, c in dace.map[0:N, 0:C]:
        with dace.tasklet:
            a << x[n, c]
            b << gw[c]
            da >> gx(1, lambda p, q: p + q)[n, c]
            db >> gw(1, lambda p, q: p + q)[c]
            da = a * b
            db = a


@dace.program
def scale_adjoint(x: dace.float64[N, C], w: dace.float64[C], g: dace.float64[N, C], gx: dace.float64[N, C],
                  gw: dace.float64[C]):
    # y = x * w: gw[c] is fixed by c, which owns gx too, so the one map, nested by c, sums gw in registers
    for n, c in dace.map[0:N, 0:C]:
        with dace.tasklet:
            a << x[n, c]
            b << w[c]
            d << g[n, c]
            da >> gx(1, lambda p, q: p + q)[n, c]
            db >> gw(1, lambda p, q: p + q)[c]
            da = d * b
            db = d * a


@dace.program
def plus_total_adjoint(g: dace.float64[N, C], gx: dace.float64[N, C], gt: dace.float64[1]):
    # y = x + t (go_fast's `a + trace`): gx is a copy of g, gt a sum no parameter owns
    for n, c in dace.map[0:N, 0:C]:
        with dace.tasklet:
            d << g[n, c]
            da >> gx(1, lambda p, q: p + q)[n, c]
            dt >> gt(1, lambda p, q: p + q)[0]
            da = d
            dt = d


@dace.program
def outer_tanh(a: dace.float64[N], b: dace.float64[C], S: dace.float64[1]):
    # the adjoint sums into ga[i] (owned by i) and gb[j] (owned by j): no parameter owns both
    for i, j in dace.map[0:N, 0:C]:
        with dace.tasklet:
            x << a[i]
            y << b[j]
            s >> S(1, lambda p, q: p + q)[0]
            s = math.tanh(x * y)


def _top_maps(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.MapEntry]]:
    return [(s, n) for s in sdfg.states() for n in s.nodes() if isinstance(n, nd.MapEntry) and s.entry_node(n) is None]


def _run(graph: Graph, data: dict) -> tuple[np.ndarray, np.ndarray]:
    gx, gw = np.full(data["x"].shape, 0.25), np.full(data["w"].shape, -0.5)  # the sums add to what they hold
    compile_sdfg(graph)(x=data["x"], w=data["w"], g=data["g"], gx=gx, gw=gw, N=5, C=4, L=9)
    return gx, gw


def test_each_sum_gets_a_map_nested_by_its_own_owners() -> None:
    plain = Graph.of(depthwise_adjoint.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    parts = groups(plain.sdfg, state, entry)
    assert parts is not None and sorted(e.data.data for part in parts for e in part) == ["gw", "gx"]
    split = SplitSumMaps()(plain).unwrap()
    assert len(_top_maps(split.sdfg)) == 2
    nested = NestReductions()(split).unwrap()
    outermost = {}
    for state, entry in _top_maps(nested.sdfg):
        chain = [entry]
        while inner := [n for n in state.scope_children()[chain[-1]] if isinstance(n, nd.MapEntry)]:
            chain.append(inner[0])
        target = {e.data.data for e in state.out_edges(state.exit_node(entry)) if not e.data.is_empty()}
        outermost[target.pop()] = [m.map.params[0] for m in chain]
    # gw's elements are fixed by (c, k): those loops go first and the sum over n and o runs inside them
    assert outermost["gw"][:2] == ["c", "k"] and set(outermost["gw"][2:]) == {"n", "o"}
    assert outermost["gx"][0] in ("n", "c")
    assert any(n.startswith("gradflow_acc_gw") for n in nested.sdfg.arrays)
    rng = np.random.default_rng(3)
    data = {"x": rng.standard_normal((5, 4, 11)), "w": rng.standard_normal((4, 3)), "g": rng.standard_normal((5, 4, 9))}
    want = _run(plain, data)
    for graph in (split, OPTIMIZE(plain).unwrap()):
        got = _run(graph, data)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-13)
    gx, gw = want
    ref_gw = -0.5 + np.einsum("nco,ncok->ck", data["g"], np.lib.stride_tricks.sliding_window_view(data["x"], 3, axis=2))
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-12)


def test_a_map_reading_what_it_sums_into_is_left_alone() -> None:
    plain = Graph.of(reads_its_target.to_sdfg())
    [(state, entry)] = _top_maps(plain.sdfg)
    assert groups(plain.sdfg, state, entry) is None
    assert SplitSumMaps()(plain).unwrap().fingerprint == plain.fingerprint


def test_a_split_that_gains_no_register_sum_is_not_made() -> None:
    # split, each copy would read g again and no sum would move into registers that is not there already
    for program in (scale_adjoint, plus_total_adjoint):
        plain = Graph.of(program.to_sdfg())
        [(state, entry)] = _top_maps(plain.sdfg)
        assert groups(plain.sdfg, state, entry) is None, program.name
        assert SplitSumMaps()(plain).unwrap().fingerprint == plain.fingerprint


def test_the_gradient_of_an_outer_product_through_the_split_equals_torch() -> None:
    fast = gradflow.grad(outer_tanh, wrt=["a", "b"], of="S")
    plain = gradflow.grad(outer_tanh, wrt=["a", "b"], of="S", optimize=False)
    before = Graph.of(plain)
    assert any(groups(sub, st, e) is not None for sub in before.sdfg.all_sdfgs_recursive()
               for st, e in _top_maps(sub)), "the reverse map sums into ga and gb from one tasklet"
    written = [{x.data.data for x in st.out_edges(st.exit_node(e)) if not x.data.is_empty()}
               for sub in fast.all_sdfgs_recursive() for st, e in _top_maps(sub)]
    assert {"grad_a"} in written and {"grad_b"} in written  # optimized: one map each
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(37), rng.standard_normal(29)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    torch.tanh(ta[:, None] * tb[None, :]).sum().backward()
    for sdfg in (fast, plain):
        ga, gb = np.full(37, np.nan), np.full(29, np.nan)
        compile_sdfg(sdfg)(a=a.copy(), b=b.copy(), S=np.zeros(1), grad_a=ga, grad_b=gb, N=37, C=29)
        np.testing.assert_allclose(ga, ta.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-12)
