"""`Invoker`: positional binding and allocation of omitted arrays; everything else is `Runner`'s."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradflow.core.errors import ArgumentError
from gradflow.core.graph import Graph
from gradflow.runtime.invoke import Invoker
from tests.torch.vjp_programs import scale_rows, square_mul


def _invoker(sdfg, order):
    sdfg.arg_names = list(order)  # the declared argument order of a program (positional binding)
    return Invoker(Graph.of(sdfg))


@pytest.fixture(scope="module")
def sq():
    return _invoker(square_mul(name="inv_sqmul").forward, ["X", "W", "Y", "T"])


@pytest.fixture(scope="module")
def rows():
    return _invoker(scale_rows(name="inv_rows").forward, ["A", "b", "alpha", "Z", "S"])


def test_positional_and_named_binding_allocates_omitted_outputs(sq):
    X, W = np.random.rand(5), np.random.rand(5)
    arrays, as_torch = sq(X, W=W)
    assert not as_torch
    assert isinstance(arrays["Y"], np.ndarray)
    np.testing.assert_allclose(arrays["Y"], X * X * W)
    np.testing.assert_allclose(arrays["T"], X * X)
    assert arrays["X"] is X  # given arrays are passed as they are (zero-copy)


def test_torch_in_torch_out_zero_copy(sq):
    X, W = torch.rand(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    Y = torch.full((4,), -1.0, dtype=torch.float64)
    arrays, as_torch = sq(X, W, Y=Y)
    assert as_torch and isinstance(arrays["T"], torch.Tensor)
    assert arrays["Y"].data_ptr() == Y.data_ptr()
    torch.testing.assert_close(Y, X * X * W)


def test_scalars_and_symbols(rows):
    A, b = np.random.rand(3, 2), np.random.rand(2)
    arrays, _ = rows(A, b, 0.5, S=np.zeros(3))  # S is accumulated into (`+=`): the caller gives it
    np.testing.assert_allclose(arrays["Z"], 0.5 * A * b)
    np.testing.assert_allclose(arrays["S"], (A * A).sum(1))
    with pytest.raises(ArgumentError, match="symbol"):
        rows(A, b, 0.5, S=np.zeros(3), N=4)  # contradicts the shape of A


@pytest.mark.parametrize("call, needle", [
    (lambda f: f(np.ones(3, np.float32), np.ones(3)), "argument 'X': expected dtype float64, got float32"),
    (lambda f: f(np.ones(3), np.ones(4)), "argument 'W': dimension 0 has extent 4, expected N = 3"),
    (lambda f: f(np.ones(6)[::2], np.ones(3)), "argument 'X': has strides"),
    (lambda f: f(np.ones(3), np.ones(3), np.ones(3), np.ones(3), np.ones(3)), "5 positional arguments"),
    (lambda f: f(np.ones(3), X=np.ones(3)), "'X' given both by position and by name"),
    (lambda f: f(np.ones(3), Q=np.ones(3)), "unknown argument 'Q'"),
])
def test_errors_are_runners(sq, call, needle):
    """The checks are Runner's (same messages as everywhere in gradflow), after Invoker's binding."""
    with pytest.raises(ArgumentError) as info:
        call(sq)
    assert needle in str(info.value)


def test_program_without_declared_order_takes_names_only():
    f = Invoker(Graph.of(square_mul(name="inv_sq_named").forward))
    with pytest.raises(ArgumentError, match="by position"):
        f(np.ones(3))
    arrays, _ = f(X=np.full(3, 2.0), W=np.ones(3))
    np.testing.assert_allclose(arrays["Y"], 4.0)


def test_one_element_arrays_accept_numbers_and_other_ranks(rows):
    A, b = np.random.rand(2, 2), np.random.rand(2)
    S = np.zeros(2)
    arrays, _ = rows(A, b, np.float64(2.0), S=S)  # a numpy scalar for the scalar input
    np.testing.assert_allclose(arrays["Z"], 2.0 * A * b)


def test_an_omitted_array_larger_than_the_machine_is_a_typed_error_before_allocating(sq):
    with pytest.raises(ArgumentError, match=r"array '[YT]' would need 8192.0 GiB \(shape \(1099511627776,\), from N = "):
        sq.zeros(["Y", "T"], {"N": 2**40})


def test_omitted_arrays_are_sized_by_each_calls_own_arguments(sq):
    # the shapes of left-out arrays are remembered by what sizes them: a call with other sizes gets its own,
    # a repeated one fresh arrays (never the previous call's), torch or numpy as the call's arguments are
    seen = []
    for n, as_torch in ((5, False), (7, False), (5, False), (5, True), (7, True)):
        X, W = np.random.rand(n), np.random.rand(n)
        if as_torch:
            X, W = torch.from_numpy(X), torch.from_numpy(W)
        arrays, got_torch = sq(X, W)
        assert got_torch == as_torch and tuple(arrays["Y"].shape) == (n,) and tuple(arrays["T"].shape) == (n,)
        np.testing.assert_allclose(np.asarray(arrays["Y"]), np.asarray(X * X * W))
        assert all(arrays["Y"] is not y for y in seen)
        seen.append(arrays["Y"])
    with pytest.raises(ArgumentError, match="symbol"):
        sq(np.ones(4), np.ones(4), N=5)  # a symbol that contradicts the shapes, after calls that were cached
