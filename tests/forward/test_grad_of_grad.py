"""Reverse over reverse: gradient programs (loops, tapes included) differentiated again, against torch's
double backward; the two ways users write it (the gradient program's own gradient, a program that calls
the gradient program), and the typed refusals where a gradient program cannot be differentiated."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.core.names import MADE
from gradflow.transforms.internal_names import SetAsideInternalNames
from gradflow.verify.programs import cases
from gradflow.verify.tangents import check_grad_of_grad

CASES = {c.name: c for c in cases()}

#: loop programs of every kind: stencils in place, triangular and strided loops, a negative step, branches,
#: a map of loops, a break, a bounded while loop, a trip count from data, indirect updates
LOOPS = ["lp_jacobi_1d", "lp_trisolv", "lp_softmax", "lp_strided_step3", "lp_negative_step", "lp_if_else",
         "lp_triangular", "lp_map_of_loops", "lp_break_search", "lp_newton_sqrt_capped", "lp_symbol_from_data",
         "lp_indexed_updates"]


@pytest.mark.parametrize("name", LOOPS)
def test_grad_of_grad_equals_torch_double_backward(name):
    check_grad_of_grad(CASES[name])  # CheckFailure unless allclose(rtol 1e-9, atol 1e-12) to torch


def test_growable_tape_is_refused_with_what_to_do():
    with pytest.raises(NotDifferentiableError, match="give the while loop a bound"):
        check_grad_of_grad(CASES["lp_newton_sqrt"])


X = dace.symbol("X")


@dace.program
def orbit(x: dace.float64[1], S: dace.float64[1]):
    y = np.copy(x)
    for _t in range(4):
        y[0] = np.sin(y[0]) * y[0] + 0.25 * y[0] * y[0]
    S[0] = y[0] * x[0]


def _torch_orbit(x):
    y = x
    for _ in range(4):
        y = torch.sin(y) * y + 0.25 * y * y
    return y * x


@settings(max_examples=5, deadline=None)
@given(st.floats(-1.5, 1.5))
def test_second_derivative_is_the_gradient_programs_gradient(x0):
    """`value_and_grad` of `grad`'s output, of its one-element gradient: the gradient arrays take the free
    prefix `grad2_`, the first level's tape is an array like any other."""
    g = gradflow.grad(orbit, wrt="x", of="S", optimize=False)
    f2 = _second(g)
    x = np.array([x0])
    first, second = f2(x=x.copy(), S=np.zeros(1), grad_x=np.zeros(1))
    xt = torch.tensor(x, requires_grad=True)
    (d1,) = torch.autograd.grad(_torch_orbit(xt).sum(), xt, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), xt)
    assert np.allclose(first, d1.detach().numpy()[0], rtol=1e-12, atol=1e-14)
    assert np.allclose(second, d2.numpy(), rtol=1e-10, atol=1e-12)


_SECOND = {}


def _second(g):
    if "f" not in _SECOND:  # one build for all the examples
        _SECOND["f"] = gradflow.value_and_grad(g, wrt="x", of="grad_x")
    return _SECOND["f"]


@dace.program
def smooth(x: dace.float64[X], S: dace.float64[1]):
    y = np.copy(x)
    for _t in range(3):
        for i in range(1, X - 1):
            y[i] = 0.3 * (y[i - 1] + np.sin(y[i]) * y[i + 1])
    S[0] = np.sum(y * y)


def _torch_smooth(x):
    y = x.clone()
    for _ in range(3):
        for i in range(1, len(x) - 1):
            y = torch.cat([y[:i], (0.3 * (y[i - 1] + torch.sin(y[i]) * y[i + 1]))[None], y[i + 1:]])
    return torch.sum(y * y)


def test_a_program_calling_a_gradient_program_is_differentiated():
    """The gradient program (optimized, as `grad` returns it) called from a user's program that reduces the
    gradient to a number (a gradient penalty): its gradient is torch's double backward."""
    smooth_grad = gradflow.grad(smooth, wrt="x", of="S")

    @dace.program
    def gradient_norm(x: dace.float64[X], R: dace.float64[1]):
        S = np.zeros([1], dtype=np.float64)
        gx = np.zeros([X], dtype=np.float64)
        smooth_grad(x=x, S=S, grad_x=gx)
        R[0] = np.sum(gx * gx)

    x = np.random.default_rng(3).uniform(-1, 1, 9)
    value, h = gradflow.value_and_grad(gradient_norm, wrt="x", of="R")(x=x.copy())
    xt = torch.tensor(x, requires_grad=True)
    (gx,) = torch.autograd.grad(_torch_smooth(xt), xt, create_graph=True)
    penalty = torch.sum(gx * gx)
    (want,) = torch.autograd.grad(penalty, xt)
    assert np.isclose(value, float(penalty), rtol=1e-12)
    assert np.allclose(h, want.numpy(), rtol=1e-10, atol=1e-12)


def test_gradflow_names_are_set_aside_and_arguments_kept():
    g = gradflow.grad(smooth, wrt="x", of="S", optimize=False)
    before = {n for n, d in g.arrays.items() if not d.transient}
    out = SetAsideInternalNames()(Graph.adopt(g)).unwrap().sdfg
    names = {n for s in out.all_sdfgs_recursive() for n in s.arrays}
    assert {n for n, d in out.arrays.items() if not d.transient} == before
    assert any(n.startswith("gfl1_tape") for n in names)
    for sub in out.all_sdfgs_recursive():
        made = [n for n, d in sub.arrays.items() if (d.transient or sub is not out) and n.startswith(MADE)]
        assert not made, made
    assert all(b.label.startswith("gfl1_") for b in out.all_control_flow_blocks())
    again = SetAsideInternalNames()(Graph.adopt(out)).unwrap().sdfg  # a third level: nothing made is left
    assert again is out


def test_a_users_program_keeps_its_names():
    graph = Graph.of(smooth)
    assert SetAsideInternalNames()(graph).unwrap() is graph  # loop labels stay as users name them


def test_optimized_gradient_program_is_refused_with_what_to_do():
    """The optimizer's accumulations are C++ tasklets: the refusal says to differentiate the unoptimized
    gradient program (no compilation: it is refused while building)."""
    case = CASES["lp_strided_step2"]
    g = gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of)  # optimized, as grad returns it
    with pytest.raises(NotDifferentiableError, match="optimize=False"):
        gradflow.vjp(g, wrt=list(case.wrt), of=[f"grad_{x}" for x in case.wrt], prefix=None)
