"""Real @dace.programs differentiated by gradflow.vjp and run through gradflow.torch.function.

Each is compared against pure torch and checked with gradcheck.
"""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow.torch as gt

N = dace.symbol("N")


@dace.program
def tv_poly(x: dace.float64[N], w: dace.float64[N]):
    return x * x * w + np.exp(x)


@dace.program
def tv_scaled(x: dace.float64[N], w: dace.float64[N], out: dace.float64[N]):
    out[:] = 3.0 * x * w - w


@dace.program
def tv_inplace(x: dace.float64[N], w: dace.float64[N], y: dace.float64[N]):
    x[:] = x * x
    y[:] = x * w


def _function(program, **kw):
    return gt.function(program, **kw)


@pytest.fixture(scope="module")
def poly():
    return _function(tv_poly)


def test_program_return_value_matches_torch(poly):
    x, w = torch.rand(11, dtype=torch.float64, requires_grad=True), torch.rand(11, dtype=torch.float64,
                                                                                requires_grad=True)
    xr, wr = (t.detach().clone().requires_grad_() for t in (x, w))
    y = poly(x, w)
    yr = xr * xr * wr + torch.exp(xr)
    torch.testing.assert_close(y, yr)
    (y * y).sum().backward()
    (yr * yr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)
    assert torch.autograd.gradcheck(poly, (x.detach().requires_grad_(), w.detach().requires_grad_()))


def test_program_with_named_output():
    f = _function(tv_scaled, inputs=["x", "w"], outputs=["out"])
    x, w = torch.rand(6, dtype=torch.float64, requires_grad=True), torch.rand(6, dtype=torch.float64,
                                                                               requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, w))
    torch.testing.assert_close(f(x, w), 3.0 * x * w - w)


def test_program_through_cpp_extension_agrees(poly):
    f_cpp = _function(tv_poly, dispatcher="cpp")  # builds the C++ extension (cached on disk afterwards)
    x, w = torch.rand(9, dtype=torch.float64, requires_grad=True), torch.rand(9, dtype=torch.float64,
                                                                               requires_grad=True)
    g = torch.rand(9, dtype=torch.float64)
    y_cpp, y_ct = f_cpp(x, w), poly(x, w)
    assert torch.equal(y_cpp, y_ct)
    for a, b in zip(torch.autograd.grad(y_cpp, (x, w), g), torch.autograd.grad(y_ct, (x, w), g)):
        assert torch.equal(a, b)
    assert torch.autograd.gradcheck(f_cpp, (x, w))


def test_program_writing_its_input_is_copied_in():
    f = _function(tv_inplace, inputs=["x", "w"], outputs=["y"])
    assert f.plan.copied == (0,)
    x, w = torch.rand(5, dtype=torch.float64, requires_grad=True), torch.rand(5, dtype=torch.float64,
                                                                               requires_grad=True)
    x0 = x.detach().clone()
    y = f(x, w)
    assert torch.equal(x.detach(), x0)  # the caller's tensor is left alone
    torch.testing.assert_close(y, x0 * x0 * w.detach())
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    torch.testing.assert_close(gx, 2 * x0 * w.detach())
    torch.testing.assert_close(gw, x0 * x0)
    assert torch.autograd.gradcheck(f, (x, w))
