"""A program is parsed without DaCe's assumption that every symbol is positive (`core/graph.as_sdfg` runs the
frontend inside `exact_subsets()`).

Found by `gradflow fuzz --n 600 --seed 18300` (program 147, a WRONG value): DaCe's frontend propagated a
map's reads x0[i2], x0[3], x0[N - 2] (i2 over 0:N) to x0[3:N], so its simplify fused the map's state with the
next one, whose product writes x0[2] in place; the map's read and that write were left unordered in one
state, and the differentiated program read x0[2] after the write."""

from __future__ import annotations

import dace
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow import stop_gradient
from gradflow.core.graph import Graph

N = dace.symbol("N")


@dace.program
def map_then_product_in_place(x0: dace.float64[N], w0: dace.float64[N], S: dace.float64[1]):
    x0[N - 2] += np.minimum(np.min(x0[1:N - 1] * x0[1:N - 1]),
                            np.maximum((1.6 + 1.3 * np.tanh(x0[N - 2])) ** (-1.0), stop_gradient(x0[1])))
    z1 = np.zeros((N, N), dtype=np.float64)
    for i2 in dace.map[0:N]:
        z1[i2, 3] = np.minimum(x0[i2], np.maximum(x0[3], x0[N - 2] - x0[N - 2]))
    x0[2] = x0[2::2] @ x0[:N - 2:2]
    S[0] += np.sum(x0 * w0) + np.sum(z1 * 1.0)


def _in_torch(x0: torch.Tensor, w0: torch.Tensor) -> torch.Tensor:
    n = x0.shape[0]
    bound = torch.maximum((1.6 + 1.3 * torch.tanh(x0[n - 2])) ** (-1.0), x0[1].detach())
    x0 = x0.index_put((torch.tensor([n - 2]),), x0[n - 2] + torch.minimum(torch.min(x0[1:n - 1] * x0[1:n - 1]), bound))
    z1 = torch.minimum(x0, torch.maximum(x0[3], x0[n - 2] - x0[n - 2]))  # the column z1[:, 3]; the rest is 0
    x0 = x0.index_put((torch.tensor([2]),), x0[2::2] @ x0[:n - 2:2])
    return (x0 * w0).sum() + z1.sum()


def test_the_maps_read_of_x0_is_parsed_as_all_it_reads():
    sdfg = Graph.of(map_then_product_in_place).sdfg
    outer = [e.data.subset for state in sdfg.states() for e in state.edges()
             if isinstance(e.dst, dace.nodes.MapEntry) and e.data.data == "x0" and e.dst.map.params == ["i2"]]
    assert outer
    for n in range(4, 10):  # the map reads x0[i2] for every i2 in 0:N
        for subset in outer:
            (begin, end, step), = subset.ndrange()
            low, high = (int(dace.symbolic.evaluate(v, {N: n})) for v in (begin, end))
            assert low <= 0 and high >= n - 1 and int(step) == 1, (n, str(subset))


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(5, 9))
def test_the_value_and_gradient_are_torchs(seed, n):
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    tx = torch.tensor(x, requires_grad=True)
    value = _in_torch(tx, torch.tensor(w))
    (want,) = torch.autograd.grad(value, tx)
    for optimize in (True, False):
        got_value, got = gradflow.value_and_grad(map_then_product_in_place, wrt="x0", of="S", optimize=optimize)(
            x0=x.copy(), w0=w.copy(), S=np.zeros(1))
        np.testing.assert_allclose(np.asarray(got_value).ravel(), [value.item()], rtol=1e-12)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
