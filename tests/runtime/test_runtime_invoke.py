"""`Invoker`: positional binding and allocation of omitted arrays; everything else is `Runner`'s."""

from __future__ import annotations

import dace
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


def test_a_repeated_call_by_name_computes_from_its_own_arguments(rows):
    # the second and later calls of a layout skip binding and checks (`_Prepared`): each still reads its
    # own arrays and scalars and returns fresh outputs
    outputs = []
    for alpha in (0.5, 2.0, -1.5):
        A, b, S = np.random.rand(3, 2), np.random.rand(2), np.random.rand(3)
        S0 = S.copy()
        arrays, _ = rows(A=A, b=b, alpha=alpha, S=S)
        np.testing.assert_allclose(arrays["Z"], alpha * A * b)
        np.testing.assert_allclose(arrays["S"], S0 + (A * A).sum(1))
        assert arrays["S"] is S and all(arrays["Z"] is not z for z in outputs)
        outputs.append(arrays["Z"])
    assert len(rows._prepared) == 1


@pytest.mark.parametrize("call, needle", [
    (lambda f: f(X=np.ones(3, np.float32), W=np.ones(3)), "argument 'X': expected dtype float64, got float32"),
    (lambda f: f(X=np.ones(3), W=np.ones(4)), "argument 'W': dimension 0 has extent 4, expected N = 3"),
    (lambda f: f(X=np.ones(6)[::2], W=np.ones(3)), "argument 'X': has strides"),
    (lambda f: f(X=np.ones(3), W=np.ones(3), N=4), "symbol"),
    (lambda f: f(X=np.ones(3), W=np.ones(3), Y=np.ones(3)[::-1]), "argument 'Y'"),
])
def test_a_call_of_another_layout_after_prepared_ones_is_checked(sq, call, needle):
    for _ in range(3):  # prepared: same names, layouts and sizes
        arrays, _ = sq(X=np.full(3, 2.0), W=np.ones(3))
        np.testing.assert_allclose(arrays["Y"], 4.0)
    with pytest.raises(ArgumentError) as info:
        call(sq)
    assert needle in str(info.value)


def test_a_read_only_output_is_refused_after_prepared_calls(sq):
    Y = np.zeros(3)
    for _ in range(2):
        sq(X=np.ones(3), W=np.ones(3), Y=Y)
    Y.flags.writeable = False
    with pytest.raises(ArgumentError, match="'Y'"):
        sq(X=np.ones(3), W=np.ones(3), Y=Y)


N = dace.symbol("N")


@dace.program
def _writes_part(X: dace.float64[N], Y: dace.float64[N], T: dace.float64[N], U: dace.float64[N]):
    Y[1:] = X[1:] * 2.0
    T[:] = X * 3.0


@pytest.mark.parametrize("as_torch", [False, True])
def test_an_omitted_array_is_filled_with_zeros_unless_every_run_writes_all_of_it(as_torch):
    """`unfilled` arrays are allocated as they come (`np.empty`); one the program leaves alone (`U`) is
    zeros, call after call, also when the allocator hands back memory an earlier array dirtied. One written
    in part (`Y`) is the caller's to give."""
    f = Invoker(Graph.of(_writes_part.to_sdfg(simplify=True)))
    assert f.unfilled == frozenset({"T"}) and f.allocatable == frozenset({"T", "U"})
    for _ in range(4):  # the first call checked, the others prepared
        dirty = torch.full((64,), 7.0, dtype=torch.float64) if as_torch else np.full(64, 7.0)
        del dirty  # its block is free for the next allocation of the size
        X = torch.rand(64, dtype=torch.float64) if as_torch else np.random.rand(64)
        Y = torch.zeros(64, dtype=torch.float64) if as_torch else np.zeros(64)
        arrays, _ = f(X=X, Y=Y)
        assert not np.asarray(arrays["U"]).any() and float(arrays["Y"][0]) == 0.0
        np.testing.assert_allclose(np.asarray(arrays["Y"][1:]), 2.0 * np.asarray(X[1:]))
        np.testing.assert_allclose(np.asarray(arrays["T"]), 3.0 * np.asarray(X))
