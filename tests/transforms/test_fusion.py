"""`fuse_maps` trims a map to the iterations whose results are read, then fuses: the Runge-Kutta stage
`t = y + h * k` whose temporary a shifted product reads in part (`z[1:] = w[1:] * t[:-1]`) becomes one
map. Here: when the trim applies and when it must not, that the programs compute what numpy does, and
that their gradients are torch's."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from dace.sdfg import nodes as nd

import gradflow
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg
from gradflow.transforms.fusion import FuseMaps

N = dace.symbol("N")


@dace.program
def stage(y: dace.float64[N], k: dace.float64[N], w: dace.float64[N], S: dace.float64[1]):
    t = y + 0.25 * k
    z = np.ndarray([N], dtype=np.float64)
    z[0] = w[0]
    z[1:] = w[1:] * t[:-1]
    S[0] = np.sum(z * z)


def t_stage(y, k, w):
    t = y + 0.25 * k
    z = torch.cat([w[:1], w[1:] * t[:-1]])
    return (z * z).sum()


@dace.program
def stage_read_twice(y: dace.float64[N], k: dace.float64[N], w: dace.float64[N], S: dace.float64[1]):
    t = y + 0.25 * k
    z = np.ndarray([N], dtype=np.float64)
    z[0] = w[0]
    z[1:] = w[1:] * t[:-1]
    S[0] = np.sum(z * z) + np.sum(t)


def t_stage_read_twice(y, k, w):
    return t_stage(y, k, w) + (y + 0.25 * k).sum()


@dace.program
def stage_read_ahead(y: dace.float64[N], k: dace.float64[N], w: dace.float64[N], S: dace.float64[1]):
    t = y + 0.25 * k
    z = np.ndarray([N], dtype=np.float64)
    z[N - 1] = w[N - 1]
    z[:-1] = w[:-1] * t[1:]
    S[0] = np.sum(z * z)


def t_stage_read_ahead(y, k, w):
    t = y + 0.25 * k
    z = torch.cat([w[:-1] * t[1:], w[-1:]])
    return (z * z).sum()


@dace.program
def rk2(x: dace.float64[N], T: dace.int64, S: dace.float64[1]):
    y = np.zeros([N], dtype=np.float64)
    k1 = np.ndarray([N], dtype=np.float64)
    k2 = np.ndarray([N], dtype=np.float64)
    for _ in range(T):
        k1[0] = x[0]
        k1[1:] = x[1:] * y[:-1]
        t = y + 0.5 * k1
        k2[0] = x[0]
        k2[1:] = x[1:] * t[:-1]
        y[:] = y + 0.25 * (k1 + k2)
    S[0] = np.sum(y * y)


def t_rk2(x, T=3):
    y = torch.zeros_like(x)
    for _ in range(T):
        k1 = torch.cat([x[:1], x[1:] * y[:-1]])
        t = y + 0.5 * k1
        k2 = torch.cat([x[:1], x[1:] * t[:-1]])
        y = y + 0.25 * (k1 + k2)
    return (y * y).sum()


CASES = {"stage": (stage, t_stage), "stage_read_twice": (stage_read_twice, t_stage_read_twice),
         "stage_read_ahead": (stage_read_ahead, t_stage_read_ahead)}


def _fused(program) -> Graph:
    sdfg = program.to_sdfg()
    sdfg.simplify()
    return FuseMaps()(Graph.of(sdfg)).unwrap()


def test_a_temporary_read_in_part_is_computed_only_there_and_fused_with_its_reader() -> None:
    fused = _fused(stage)
    assert "t" not in {n.data for n, _ in fused.sdfg.all_nodes_recursive() if isinstance(n, nd.AccessNode)}
    readers_of_k = [str(m.map.range) for state in fused.sdfg.states() for m in state.nodes()
                    if isinstance(m, nd.MapEntry) and any(e.data.data == "k" for e in state.in_edges(m))]
    assert readers_of_k == ["0:N - 1"]  # the stage runs over the N - 1 elements the product reads


@pytest.mark.parametrize("name", ["stage_read_twice", "stage_read_ahead"])
def test_a_temporary_read_elsewhere_or_ahead_is_not_fused_into_its_reader(name) -> None:
    fused = _fused(CASES[name][0])
    assert "t" in {n.data for n, _ in fused.sdfg.all_nodes_recursive() if isinstance(n, nd.AccessNode)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trimmed_and_fused_programs_compute_what_numpy_does_and_have_torchs_gradients(name) -> None:
    program, reference = CASES[name]
    rng = np.random.default_rng(5)
    arrays = {a: rng.normal(size=7) for a in ("y", "k", "w")}
    S = np.zeros(1)
    compile_sdfg(_fused(program))(**arrays, S=S, N=7)
    tensors = {a: torch.tensor(v, requires_grad=True) for a, v in arrays.items()}
    value = reference(**tensors)
    np.testing.assert_allclose(S[0], value.item(), rtol=1e-12)
    _, grads = gradflow.value_and_grad(program, wrt=["y", "k", "w"], of="S")(**arrays, S=np.zeros(1))
    for a, g in zip(("y", "k", "w"), torch.autograd.grad(value, [tensors[a] for a in ("y", "k", "w")])):
        np.testing.assert_allclose(grads[a], g.numpy(), rtol=1e-10, atol=1e-13, err_msg=a)


@pytest.mark.parametrize("policy", ["store_all", "recompute_all"])
def test_runge_kutta_steps_have_torchs_gradient(policy) -> None:
    x = np.random.default_rng(2).uniform(0.5, 1.5, 6)
    forwarding = gradflow.STORE_ALL if policy == "store_all" else gradflow.RECOMPUTE_ALL
    value, grad = gradflow.value_and_grad(rk2, wrt="x", of="S", forwarding=forwarding)(x=x, T=3, S=np.zeros(1))
    tensor = torch.tensor(x, requires_grad=True)
    expected = t_rk2(tensor)
    np.testing.assert_allclose(np.asarray(value).reshape(-1)[0], expected.item(), rtol=1e-12)
    np.testing.assert_allclose(grad, torch.autograd.grad(expected, tensor)[0].numpy(), rtol=1e-10)
