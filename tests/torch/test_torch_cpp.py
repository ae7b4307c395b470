"""The generated C++ torch extension dispatcher: agrees with the ctypes one and with torch.

The two extensions are built once for this module (about 20 s each on a cold cache, then cached on disk).
"""

from __future__ import annotations

import pytest
import torch

import gradflow.torch as gt
from gradflow.core.errors import ArgumentError
from gradflow.torch import cpp
from tests.torch.vjp_programs import (scale_rows, scale_rows_reference, square_in_place, square_mul,
                                     square_mul_reference)


@pytest.fixture(scope="module")
def pair():
    vjp = square_mul(name="cpp_sq64")
    return (gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="cpp"),
            gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="ctypes"))


@pytest.fixture(scope="module")
def rows_pair():
    vjp = scale_rows(name="cpp_rows")
    return (gt.function(vjp, inputs=["A", "b", "alpha"], outputs=["Z", "S"], dispatcher="cpp"),
            gt.function(vjp, inputs=["A", "b", "alpha"], outputs=["Z", "S"], dispatcher="ctypes"))


def _leaf(*shape, dtype=torch.float64):
    return torch.rand(*shape, dtype=dtype, requires_grad=True)


def _grads(f, args, seed):
    out = f(*args)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.rand(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return outs, torch.autograd.grad(outs, wrt, cots)


def test_cpp_matches_torch_and_ctypes(pair):
    f_cpp, f_ct = pair
    for n in (1, 10, 33, 10):
        X, W = _leaf(n), _leaf(n)
        Xr, Wr = (t.detach().clone().requires_grad_() for t in (X, W))
        Y = f_cpp(X, W)
        torch.testing.assert_close(Y, square_mul_reference(Xr, Wr))
        Y.exp().sum().backward()
        square_mul_reference(Xr, Wr).exp().sum().backward()
        torch.testing.assert_close(X.grad, Xr.grad)
        torch.testing.assert_close(W.grad, Wr.grad)
        (oc, gc), (ot, gt_) = _grads(f_cpp, (X, W), n), _grads(f_ct, (X, W), n)
        for a, b in zip(oc + gc, ot + gt_):  # same kernels, same inputs: bitwise equal
            assert torch.equal(a, b)


def test_cpp_two_outputs_matches_ctypes(rows_pair):
    f_cpp, f_ct = rows_pair
    A, b = _leaf(3, 5), _leaf(5)
    (oc, gc), (ot, gt_) = _grads(f_cpp, (A, b, 0.3), 1), _grads(f_ct, (A, b, 0.3), 1)
    for a, c in zip(oc + gc, ot + gt_):
        assert torch.equal(a, c)
    Zr, Sr = scale_rows_reference(A, b, 0.3)
    torch.testing.assert_close(oc[0], Zr)
    torch.testing.assert_close(oc[1], Sr)


def test_cpp_scalar_input_as_tensor_gets_its_gradient(rows_pair):
    f_cpp, f_ct = rows_pair
    A, b = _leaf(3, 5), _leaf(5)
    for make in (lambda: torch.tensor(0.3, dtype=torch.float64, requires_grad=True),
                 lambda: torch.tensor([0.3], dtype=torch.float64, requires_grad=True)):
        al_c, al_t = make(), make()
        (oc, gc), (ot, gt_) = _grads(f_cpp, (A, b, al_c), 2), _grads(f_ct, (A, b, al_t), 2)
        for a, c in zip(oc + gc, ot + gt_):
            assert torch.equal(a, c)
        assert gc[2].shape == al_c.shape
    assert torch.autograd.gradcheck(f_cpp, (_leaf(2, 3), _leaf(3), torch.tensor(1.1, dtype=torch.float64,
                                                                               requires_grad=True)))
    with pytest.raises(ArgumentError, match="'alpha'.*one-element"):
        f_cpp(A, b, torch.ones(2, dtype=torch.float64))
    with pytest.raises(ArgumentError, match="'alpha'.*expected a number"):
        f_cpp(A, b, "0.3")


def test_cpp_written_input_is_copied_in_like_ctypes():
    vjp = square_in_place(name="cpp_sq_inplace")
    f_cpp = gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="cpp")
    f_ct = gt.function(vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="ctypes")
    X, W = _leaf(6), _leaf(6)
    X0 = X.detach().clone()
    g = torch.rand(6, dtype=torch.float64)
    g0 = g.clone()
    Y = f_cpp(X, W)
    assert torch.equal(X.detach(), X0)
    gc = torch.autograd.grad(Y, (X, W), g)
    assert torch.equal(g, g0)
    gt_ = torch.autograd.grad(f_ct(X, W), (X, W), g)
    for a, c in zip(gc, gt_):
        assert torch.equal(a, c)
    torch.testing.assert_close(gc[0], 2 * X0 * W.detach() * g)
    torch.testing.assert_close(gc[1], X0 * X0 * g)


def test_cpp_registered_operator_is_differentiable(pair):
    f_cpp, _ = pair
    X, W = _leaf(5), _leaf(5)
    (Y,) = f_cpp.extension.op(X, W)
    Y.sum().backward()
    torch.testing.assert_close(X.grad, 2 * X.detach() * W.detach())
    torch.testing.assert_close(W.grad, X.detach() ** 2)


def test_cpp_gradcheck(pair, rows_pair):
    assert torch.autograd.gradcheck(pair[0], (_leaf(7), _leaf(7)))
    assert torch.autograd.gradcheck(lambda A, b: rows_pair[0](A, b, 1.7), (_leaf(2, 3), _leaf(3)))


def test_cpp_only_requested_gradients(pair):
    X, W = torch.rand(4, dtype=torch.float64), _leaf(4)
    pair[0](X, W).sum().backward()
    assert X.grad is None
    torch.testing.assert_close(W.grad, X * X)


def test_cpp_saves_the_input_itself(pair):
    # the saved X is the caller's tensor (no copy): changing it in place is caught by its version counter
    X, W = _leaf(4), _leaf(4)
    Xc = X * 1.0
    Y = pair[0](Xc, W)
    Xc.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        Y.sum().backward()


@pytest.mark.parametrize("args, name, needle", [
    (lambda: (_leaf(5, dtype=torch.float32), _leaf(5)), "X", "expected dtype float64"),
    (lambda: (_leaf(5), _leaf(6)), "W", "dimension 0 has extent 6, expected N = 5"),
    (lambda: (_leaf(5, 1), _leaf(5)), "X", "expected 1 dimension(s)"),
    (lambda: (_leaf(10)[::2], _leaf(5)), "X", "strides"),
    (lambda: (_leaf(5), torch.rand(5, dtype=torch.float64, device="meta")), "W", "device"),
    (lambda: (_leaf(5).to_sparse(), _leaf(5)), "X", "layout"),
    (lambda: (torch._neg_view(torch.rand(5, dtype=torch.float64)), _leaf(5)), "X", "negation"),
    (lambda: ([1.0] * 5, _leaf(5)), "X", "expected a torch.Tensor"),
])
def test_cpp_bad_arguments_raise_typed_errors(pair, args, name, needle):
    with pytest.raises(ArgumentError) as info:
        pair[0](*args())
    assert f"'{name}'" in str(info.value) and needle in str(info.value)


def test_cpp_wrong_number_of_inputs(pair):
    with pytest.raises(ArgumentError, match="takes 2 inputs"):
        pair[0](_leaf(3))
    with pytest.raises(ArgumentError, match="takes 2 inputs"):
        pair[0].extension.call(_leaf(3))


def test_cpp_extension_is_cached_and_generated_from_the_plan(pair):
    f_cpp, _ = pair
    again = gt.function(f_cpp.vjp, inputs=["X", "W"], outputs=["Y"], dispatcher="cpp")
    assert again.extension is f_cpp.extension
    source = cpp.generate_source(f_cpp.plan, f_cpp.extension.namespace, f_cpp.extension.stateful)
    assert f_cpp.extension.source_path.read_text() == source
    assert "__program_cpp_sq64_fwd" in source and "__program_cpp_sq64_bwd" in source
