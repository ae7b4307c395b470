"""`demote_data_symbols`: a scalar that a condition reads, which DaCe's frontend makes a symbol assigned on
an interstate edge, is differentiated through (both modes) instead of refused; before, forward mode took
it for a constant (a silent zero tangent) and reverse mode refused it. Against torch in float64."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.core.graph import Graph
from gradflow.transforms.data_symbols import DemoteDataSymbols, _candidates

P = dace.symbol("P")


@dace.program
def rotation_angle(r: dace.float64[P, 3], d: dace.float64[P], S: dace.float64[1]):
    out = np.ndarray([P], dtype=np.float64)
    for j in dace.map[0:P]:
        rx = r[j, 0]
        rz = r[j, 2]
        sq = rx * rx + rz * rz
        if sq != 0.0:
            theta = np.sqrt(sq)
            out[j] = rz / theta * d[j] + np.sin(theta)
        else:
            out[j] = d[j] + rx
    S[0] = np.sum(out)


def _torch_rotation_angle(r, d):
    sq = r[:, 0] ** 2 + r[:, 2] ** 2
    theta = torch.sqrt(torch.where(sq != 0, sq, torch.ones_like(sq)))
    return torch.where(sq != 0, r[:, 2] / theta * d + torch.sin(theta), d + r[:, 0]).sum()


@dace.program
def clipped_step(x: dace.float64[P], S: dace.float64[1]):
    t = np.arccos(0.5 * np.tanh(x[1]))
    if t > 1.5:
        S[0] = t * x[0] * t
    else:
        S[0] = np.maximum(t, 0.25) * x[2]


def _torch_clipped_step(x):
    t = torch.arccos(0.5 * torch.tanh(x[1]))
    return t * x[0] * t if t > 1.5 else torch.maximum(t, torch.tensor(0.25)) * x[2]


R = np.array([[-0.758453, -1.109613, -0.845551], [0.0, 0.3, 0.0], [0.4, 0.0, -1.2]])  # one row with sq = 0
D = np.array([0.7, -1.3, 2.1])


def test_branch_in_a_map_on_a_value_the_frontend_made_a_symbol_grad_equals_torch():
    f = gradflow.value_and_grad(rotation_angle, wrt="r", of="S")
    value, grads = f(r=R.copy(), d=D, S=np.zeros(1))
    tr = torch.tensor(R, requires_grad=True)
    want = _torch_rotation_angle(tr, torch.tensor(D))
    want.backward()
    np.testing.assert_allclose(value, want.item(), rtol=1e-13)
    np.testing.assert_allclose(grads, tr.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_branch_in_a_map_on_a_value_the_frontend_made_a_symbol_jvp_equals_torch():
    f = gradflow.value_and_jvp(rotation_angle, wrt="r", of="S")
    v = np.random.default_rng(1).standard_normal(R.shape)
    _, tangents = f(r=R.copy(), d=D, S=np.zeros(1), tan_r=v)
    _, want = torch.func.jvp(lambda r: _torch_rotation_angle(r, torch.tensor(D)), (torch.tensor(R),),
                             (torch.tensor(v),))
    assert want.item() != 0.0
    np.testing.assert_allclose(tangents["S"][0], want.item(), rtol=1e-10)


@pytest.mark.parametrize("x", [[0.3, -0.2, 0.1], [0.9, 0.8, 0.7]])  # t above and below 1.5: both branches
def test_top_level_scalar_a_condition_reads_grad_and_hvp_equal_torch(x):
    x = np.array(x)
    tx = torch.tensor(x, requires_grad=True)
    _torch_clipped_step(tx).backward()
    _, grad = gradflow.value_and_grad(clipped_step, wrt="x", of="S")(x=x.copy(), S=np.zeros(1))
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12)
    v = np.array([0.5, -1.0, 2.0])
    hv = gradflow.hvp(clipped_step, wrt="x", of="S")(x=x.copy(), S=np.zeros(1), tan_x=v)["x"]
    want = torch.autograd.functional.hvp(_torch_clipped_step, torch.tensor(x), torch.tensor(v))[1]
    np.testing.assert_allclose(hv, want.numpy(), rtol=1e-10, atol=1e-14)


def test_the_pass_demotes_once():
    graph = Graph.of(rotation_angle)
    assert any(_candidates(sub) for sub in graph.sdfg.all_sdfgs_recursive())
    once = DemoteDataSymbols()(graph).unwrap()
    assert not any(_candidates(sub) for sub in once.sdfg.all_sdfgs_recursive())
    assert DemoteDataSymbols()(once).unwrap() is once
