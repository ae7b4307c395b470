"""gradflow.torch.function with the ctypes dispatcher, on hand-written forward/backward SDFG pairs."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow.torch as gt
from gradflow.core.errors import ArgumentError, GradflowError, InvalidArgumentError
from tests.torch.vjp_programs import (scale_rows, scale_rows_reference, square_in_place, square_mul,
                                     square_mul_reference)


@pytest.fixture(scope="module")
def sq64():
    return gt.function(square_mul(name="ct_sq64"), inputs=["X", "W"], outputs=["Y"])


@pytest.fixture(scope="module")
def sq32():
    return gt.function(square_mul(dace.float32, name="ct_sq32"), inputs=["X", "W"], outputs=["Y"])


@pytest.fixture(scope="module")
def rows():
    return gt.function(scale_rows(name="ct_rows"), inputs=["A", "b", "alpha"], outputs=["Z", "S"])


def _leaf(*shape, dtype=torch.float64):
    return torch.rand(*shape, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("dtype, fixture", [(torch.float64, "sq64"), (torch.float32, "sq32")])
def test_loss_backward_matches_torch(request, dtype, fixture):
    f = request.getfixturevalue(fixture)
    X, W = _leaf(13, dtype=dtype), _leaf(13, dtype=dtype)
    Xr, Wr = (t.detach().clone().requires_grad_() for t in (X, W))
    Y = f(X, W)
    torch.testing.assert_close(Y, square_mul_reference(Xr, Wr))
    (Y.sin().sum()).backward()
    square_mul_reference(Xr, Wr).sin().sum().backward()
    torch.testing.assert_close(X.grad, Xr.grad)
    torch.testing.assert_close(W.grad, Wr.grad)
    assert Y.dtype == dtype and X.grad.dtype == dtype


def test_two_outputs_scalar_input_matches_torch(rows):
    A, b = _leaf(4, 5), _leaf(5)
    alpha = torch.tensor(0.75, dtype=torch.float64, requires_grad=True)
    Ar, br, alr = (t.detach().clone().requires_grad_() for t in (A, b, alpha))
    Z, S = rows(A, b, alpha)
    Zr, Sr = scale_rows_reference(Ar, br, alr)
    torch.testing.assert_close(Z, Zr)
    torch.testing.assert_close(S, Sr)
    ((Z * Z).sum() + S.cos().sum()).backward()
    ((Zr * Zr).sum() + Sr.cos().sum()).backward()
    for got, want in ((A, Ar), (b, br), (alpha, alr)):
        torch.testing.assert_close(got.grad, want.grad)
    assert alpha.grad.shape == ()


def test_unused_output_gets_zero_cotangent(rows):
    A, b = _leaf(3, 2), _leaf(2)
    Z, S = rows(A, b, 2.0)
    S.sum().backward()  # Z unused: its cotangent is zero
    Ar = A.detach().clone().requires_grad_()
    (Ar * Ar).sum(1).sum().backward()
    torch.testing.assert_close(A.grad, Ar.grad)
    torch.testing.assert_close(b.grad, torch.zeros_like(b))


def test_gradcheck_float64(sq64, rows):
    assert torch.autograd.gradcheck(sq64, (_leaf(6), _leaf(6)))
    assert torch.autograd.gradcheck(rows, (_leaf(3, 4), _leaf(4), torch.tensor(1.3, dtype=torch.float64,
                                                                                 requires_grad=True)))
    assert torch.autograd.gradcheck(lambda A, b: rows(A, b, -0.4), (_leaf(2, 3), _leaf(3)))


def test_only_requested_gradients(sq64):
    X, W = _leaf(5), torch.rand(5, dtype=torch.float64)
    sq64(X, W).sum().backward()
    assert W.grad is None
    torch.testing.assert_close(X.grad, 2 * X.detach() * W)
    with torch.no_grad():
        Y = sq64(_leaf(5), _leaf(5))
    assert Y.grad_fn is None and not Y.requires_grad


def test_several_sizes_share_one_function(sq64):
    for n in (1, 7, 3, 7, 64):
        X, W = _leaf(n), _leaf(n)
        Y = sq64(X, W)
        Y.backward(torch.ones(n, dtype=torch.float64))
        torch.testing.assert_close(X.grad, 2 * X.detach() * W.detach())
        torch.testing.assert_close(W.grad, X.detach() ** 2)


def test_zero_copy_pointers_reach_the_kernels():
    f = gt.function(square_mul(name="ct_sq_ptr"), inputs=["X", "W"], outputs=["Y"])
    dispatcher = f.autograd_function.dispatcher
    seen = {"fwd": [], "bwd": []}
    for tag, kernel in (("fwd", dispatcher.fwd), ("bwd", dispatcher.bwd)):
        original = kernel.program

        def record(handle, *args, _original=original, _tag=tag):
            seen[_tag].append(args)
            _original(handle, *args)

        kernel.program = record  # bound into the per-signature code generated on the first call
    X, W = _leaf(9), _leaf(9)
    Y = f(X, W)
    g = torch.rand(9, dtype=torch.float64)
    gX, gW = torch.autograd.grad(Y, (X, W), g)
    fwd_args, bwd_args = seen["fwd"][0], seen["bwd"][0]
    names_f, names_b = f.plan.forward.names, f.plan.backward.names
    assert fwd_args[names_f.index("X")] == X.data_ptr()
    assert fwd_args[names_f.index("W")] == W.data_ptr()
    assert fwd_args[names_f.index("Y")] == Y.data_ptr()
    assert bwd_args[names_b.index("X")] == X.data_ptr()
    assert bwd_args[names_b.index("T")] == fwd_args[names_f.index("T")]
    assert bwd_args[names_b.index("gY")] == g.data_ptr()
    assert bwd_args[names_b.index("gX")] == gX.data_ptr()
    assert bwd_args[names_b.index("gW")] == gW.data_ptr()


def test_in_place_change_of_saved_input_is_detected(sq64):
    X, W = _leaf(4), _leaf(4)
    Xc = X * 1.0
    Y = sq64(Xc, W)
    Xc.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        Y.sum().backward()


def test_expanded_cotangent_is_densified(sq64):
    X, W = _leaf(6), _leaf(6)
    Y = sq64(X, W)
    (gX,) = torch.autograd.grad(Y, (X,), torch.ones(1, dtype=torch.float64).expand(6))
    torch.testing.assert_close(gX, 2 * X.detach() * W.detach())


def test_double_backward_is_refused(sq64):
    X, W = _leaf(3), _leaf(3)
    Y = sq64(X, W)
    with pytest.raises(GradflowError, match="differentiable once"):
        torch.autograd.grad(Y.sum(), (X,), create_graph=True)


@pytest.mark.parametrize("args, name, needle", [
    (lambda: (_leaf(5, dtype=torch.float32), _leaf(5)), "X", "expected dtype float64, got float32"),
    (lambda: (_leaf(5), _leaf(6)), "W", "dimension 0 has extent 6, expected N = 5"),
    (lambda: (_leaf(5, 1), _leaf(5)), "X", "expected 1 dimension(s)"),
    (lambda: (_leaf(10)[::2], _leaf(5)), "X", "strides"),
    (lambda: (_leaf(5), torch.rand(5, dtype=torch.float64, device="meta")), "W", "device"),
    (lambda: ([1.0] * 5, _leaf(5)), "X", "expected a torch.Tensor"),
    (lambda: (torch._neg_view(torch.rand(5, dtype=torch.float64)), _leaf(5)), "X", "negation"),
])
def test_bad_arguments_raise_typed_errors(sq64, args, name, needle):
    with pytest.raises(ArgumentError) as info:
        sq64(*args())
    assert f"'{name}'" in str(info.value) and needle in str(info.value)


def test_scalar_input_given_as_one_element_tensor_gets_its_gradient(rows):
    A, b = _leaf(3, 4), _leaf(4)
    for alpha in (torch.tensor([0.5], dtype=torch.float64, requires_grad=True),
                  torch.tensor(0.5, dtype=torch.float64, requires_grad=True)):
        Z, S = rows(A, b, alpha)
        (Z.sum() + S.sum()).backward()
        assert alpha.grad.shape == alpha.shape
        torch.testing.assert_close(alpha.grad.reshape(()), (A.detach() * b.detach()).sum())
    with torch.no_grad():  # a number and a tensor that needs no gradient give the same values
        assert torch.equal(rows(A, b, 0.5)[0], rows(A, b, torch.tensor(0.5, dtype=torch.float64))[0])


def test_written_input_is_copied_in(request):
    """The forward program overwrites X (X <- X * X) and the backward its cotangent: the caller's tensors
    are left alone, and the gradients are those of Y = X * X * W with respect to the values passed."""
    f = gt.function(square_in_place(name="ct_sq_inplace"), inputs=["X", "W"], outputs=["Y"])
    assert f.plan.copied == (0,) and f.plan.backward_copied == {"gY"}
    X, W = _leaf(7), _leaf(7)
    X0 = X.detach().clone()
    g = torch.rand(7, dtype=torch.float64)
    g0 = g.clone()
    Y = f(X, W)
    assert torch.equal(X.detach(), X0)
    torch.testing.assert_close(Y, square_mul_reference(X0, W.detach()))
    X.data.add_(1.0)  # the forward read a private copy: the backward does not depend on X any more
    gX, gW = torch.autograd.grad(Y, (X, W), g)
    assert torch.equal(g, g0)
    torch.testing.assert_close(gX, 2 * X0 * W.detach() * g)
    torch.testing.assert_close(gW, X0 * X0 * g)
    assert torch.autograd.gradcheck(f, (_leaf(5), _leaf(5)))


def test_refused_under_functorch_transforms(sq64):
    with pytest.raises(GradflowError, match="functorch"):
        torch.func.vmap(sq64)(torch.rand(3, 4, dtype=torch.float64), torch.rand(3, 4, dtype=torch.float64))


def test_wrong_number_of_inputs(sq64):
    with pytest.raises(ArgumentError, match="takes 2 inputs"):
        sq64(_leaf(3))


def test_bad_scalar_argument(rows):
    with pytest.raises(ArgumentError, match="'alpha'"):
        rows(_leaf(2, 2), _leaf(2), torch.ones(2, dtype=torch.float64))


def test_convert_casts_and_copies_and_returns_gradients_in_input_dtype():
    f = gt.function(square_mul(name="ct_sq_conv"), inputs=["X", "W"], outputs=["Y"], convert=True)
    X = torch.rand(12, dtype=torch.float32, requires_grad=True)
    Wbig = torch.rand(24, dtype=torch.float64, requires_grad=True)
    W = Wbig[::2]  # non-contiguous
    Y = f(X, W)
    assert Y.dtype == torch.float64
    torch.testing.assert_close(Y, X.detach().double() ** 2 * W.detach())
    Y.sum().backward()
    assert X.grad.dtype == torch.float32
    torch.testing.assert_close(X.grad, (2 * X.detach().double() * W.detach()).float())
    torch.testing.assert_close(Wbig.grad[::2], X.detach().double() ** 2)
    torch.testing.assert_close(Wbig.grad[1::2], torch.zeros(12, dtype=torch.float64))


def test_plan_errors_name_the_array():
    with pytest.raises(InvalidArgumentError, match="'Q'"):
        gt.function(square_mul(name="ct_sq_err"), inputs=["X", "Q"], outputs=["Y"])
    with pytest.raises(InvalidArgumentError, match="'W'.*neither an input nor an output"):
        gt.function(square_mul(name="ct_sq_err"), inputs=["X"], outputs=["Y"])


def test_unknown_dispatcher():
    with pytest.raises(InvalidArgumentError, match="dispatcher"):
        gt.function(square_mul(name="ct_sq_err"), inputs=["X", "W"], outputs=["Y"], dispatcher="cuda")


def test_module_trains_like_torch():
    w0 = torch.rand(8, dtype=torch.float64)
    mod = gt.Module(square_mul(name="ct_sq_mod"), parameters={"W": w0}, inputs=["X", "W"], outputs=["Y"])
    assert [n for n, _ in mod.named_parameters()] == ["W"]
    ref = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD([ref], lr=0.1)
    for _ in range(3):
        X = torch.rand(8, dtype=torch.float64)
        for o in (opt, opt_ref):
            o.zero_grad()
        (mod(X) - 1.0).pow(2).sum().backward()
        (square_mul_reference(X, ref) - 1.0).pow(2).sum().backward()
        opt.step()
        opt_ref.step()
    torch.testing.assert_close(mod.W.detach(), ref.detach())
    with pytest.raises(ArgumentError, match="takes 1 inputs"):
        mod(X, X)
    with pytest.raises(InvalidArgumentError, match="'V'"):
        gt.Module(square_mul(name="ct_sq_mod"), parameters={"V": w0}, inputs=["X", "W"], outputs=["Y"])


def _constant_array_program() -> dace.SDFG:
    """S = sum(max(x * c, 0) * c) with `c` a constant array (`sdfg.add_constant`, as the ONNX frontend
    makes for Constant nodes): both sweeps read it."""
    sdfg = dace.SDFG("with_constant_array")
    sdfg.add_array("x", [4], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    sdfg.add_array("c", [4], dace.float64, transient=True)
    sdfg.add_constant("c", np.array([2.0, -3.0, 0.5, 4.0]), sdfg.arrays["c"])
    sdfg.add_array("y", [4], dace.float64, transient=True)
    first = sdfg.add_state()
    first.add_mapped_tasklet("relu", {"i": "0:4"}, {"a": dace.Memlet("x[i]"), "b": dace.Memlet("c[i]")},
                             "o = max(a * b, 0.0)", {"o": dace.Memlet("y[i]")}, external_edges=True)
    second = sdfg.add_state_after(first)
    second.add_mapped_tasklet("dot", {"i": "0:4"}, {"a": dace.Memlet("y[i]"), "b": dace.Memlet("c[i]")}, "o = a * b",
                              {"o": dace.Memlet("S[0]", wcr="lambda u, v: u + v")}, external_edges=True)
    return sdfg


def test_constant_arrays_keep_their_values_in_both_sweeps() -> None:
    # Was silently wrong: the constant read by the backward became an argument of the forward SDFG,
    # which then read uninitialised memory instead of the constant (S = 0, gradient 0).
    fn = gt.function(_constant_array_program(), inputs=["x"], outputs=["S"])
    x = torch.tensor([1.0, 1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    c = torch.tensor([2.0, -3.0, 0.5, 4.0], dtype=torch.float64)
    ref_x = x.detach().clone().requires_grad_(True)
    ref = (torch.clamp(ref_x * c, min=0) * c).sum()
    ref.backward()
    out = fn(x)
    out.sum().backward()
    torch.testing.assert_close(out.reshape(()), ref.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-12, atol=0)


N = dace.symbol("N")


@dace.program
def _chain(x: dace.float64[N], y: dace.float64[N]):
    a = np.copy(x)
    b = np.copy(x)
    for i in range(3):
        a[:] = np.tanh(a) * x
        b[:] = np.sin(b * a)
    y[:] = a * b


def test_saved_intermediates_share_one_allocation_and_stay_until_backward():
    """The values the backward reads are allocated as one buffer (one `torch.empty`, pointers into it,
    one saved tensor), not one each; the buffer lives as long as the graph: a second backward
    (`retain_graph`) after other calls of the function reads the same values."""
    from gradflow.torch.ctypes_dispatch import _pooled

    f = gt.function(_chain, inputs=["x"], outputs=["y"], wrt=["x"])
    signature_symbols = {"N": 7}
    offsets, total = _pooled(f.plan, signature_symbols)
    assert len(offsets) >= 2 and total >= 7 * 8 * len(offsets) and all(o % 64 == 0 for o in offsets.values())
    x = torch.rand(7, dtype=torch.float64, requires_grad=True)
    y = f(x)
    g = torch.rand(7, dtype=torch.float64)
    (first,) = torch.autograd.grad(y, x, g, retain_graph=True)
    for _ in range(3):  # other calls of the same signature allocate and fill pools of their own
        f(torch.rand(7, dtype=torch.float64, requires_grad=True)).sum().backward()
    (second,) = torch.autograd.grad(y, x, g)
    xr = x.detach().clone().requires_grad_()
    a, b = xr, xr
    for _ in range(3):
        a = torch.tanh(a) * xr
        b = torch.sin(b * a)
    want = torch.autograd.grad(a * b, xr, g)[0]
    torch.testing.assert_close(first, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(second, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, a * b, rtol=1e-12, atol=1e-12)
