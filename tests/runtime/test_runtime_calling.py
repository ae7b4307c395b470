"""The call plan, argument validation and the validated zero-copy Runner (ctypes fast path)."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

from gradflow.core.errors import ArgumentError
from gradflow.runtime import Runner, compile_sdfg, plan_for
from gradflow.runtime.plan import ARRAY, SCALAR, SYMBOL
from tests.torch.vjp_programs import scale_rows, square_mul


@pytest.fixture(scope="module")
def sq():
    vjp = square_mul(name="rt_sqmul")
    return vjp, Runner(vjp.forward)


@pytest.fixture(scope="module")
def rows():
    vjp = scale_rows(name="rt_rows")
    return vjp, Runner(vjp.forward)


def test_plan_follows_dace_signature_order(sq):
    vjp, runner = sq
    compiled = compile_sdfg(vjp.forward)
    plan = plan_for(compiled.sdfg)
    assert plan.names == tuple(compiled.sdfg.signature_arglist(with_types=False))
    assert [a.kind for a in plan.args] == [ARRAY, ARRAY, ARRAY, ARRAY, SYMBOL]
    assert plan.init_args == ("N",)
    assert all(a.default_strides() for a in plan.arrays)
    assert plan == runner.plan


def test_plan_scalars_and_2d(rows):
    _, runner = rows
    plan = runner.plan
    assert plan.arg("alpha").kind == SCALAR and plan.arg("alpha").dtype == "float64"
    assert [d.py for d in plan.arg("A").shape] == ["N", "M"]
    assert [d.py for d in plan.arg("A").strides] == ["M", "1"]


@pytest.mark.parametrize("make", [torch.rand, np.random.rand])
def test_runner_computes_in_place_without_copies(sq, make):
    _, runner = sq
    n = 11
    X, W = make(n), make(n)
    if isinstance(X, torch.Tensor):
        X, W = X.double(), W.double()
        Y, T = torch.full((n,), -1.0, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    else:
        Y, T = np.full(n, -1.0), np.zeros(n)
    before = (Y.data_ptr() if isinstance(Y, torch.Tensor) else Y.ctypes.data)
    runner(X=X, W=W, Y=Y, T=T)
    after = (Y.data_ptr() if isinstance(Y, torch.Tensor) else Y.ctypes.data)
    assert before == after
    np.testing.assert_allclose(np.asarray(Y), np.asarray(X) * np.asarray(X) * np.asarray(W))
    np.testing.assert_allclose(np.asarray(T), np.asarray(X) ** 2)


def test_runner_handles_several_sizes(rows):
    _, runner = rows
    for n, m in ((3, 4), (5, 2), (3, 4)):
        A, b = torch.rand(n, m, dtype=torch.float64), torch.rand(m, dtype=torch.float64)
        Z, S = torch.empty(n, m, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
        runner(A=A, b=b, alpha=0.5, Z=Z, S=S)
        torch.testing.assert_close(Z, 0.5 * A * b)
        torch.testing.assert_close(S, (A * A).sum(1))


def _args(n=6, **over):
    args = dict(X=torch.rand(n, dtype=torch.float64), W=torch.rand(n, dtype=torch.float64),
                Y=torch.empty(n, dtype=torch.float64), T=torch.empty(n, dtype=torch.float64))
    args.update(over)
    return args


@pytest.mark.parametrize("over, needle", [
    (dict(X=torch.rand(6, dtype=torch.float32)), "expected dtype float64, got float32"),
    (dict(W=torch.rand(7, dtype=torch.float64)), "dimension 0 has extent 7, expected N = 6"),
    (dict(W=torch.rand(6, 1, dtype=torch.float64)), "expected 1 dimension(s)"),
    (dict(X=torch.rand(12, dtype=torch.float64)[::2]), "strides"),
    (dict(X=torch.empty(6, dtype=torch.float64, device="meta")), "device"),
    (dict(X=torch.rand(6, dtype=torch.float64).to_sparse()), "layout"),
    (dict(X=[1.0] * 6), "expected a torch.Tensor or numpy.ndarray"),
])
def test_runner_rejects_bad_arguments_by_name(sq, over, needle):
    _, runner = sq
    args = _args(**over)
    bad = next(iter(over))
    with pytest.raises(ArgumentError) as info:
        runner(**args)
    assert f"'{bad}'" in str(info.value)
    assert needle in str(info.value)


def test_runner_rejects_negation_view(sq):
    _, runner = sq
    X = torch._neg_view(torch.rand(6, dtype=torch.float64))
    with pytest.raises(ArgumentError, match="'X'.*negation"):
        runner(**_args(X=X))


def test_runner_missing_and_unknown(sq):
    _, runner = sq
    args = _args()
    del args["T"]
    with pytest.raises(ArgumentError, match="missing argument.*T"):
        runner(**args)
    with pytest.raises(ArgumentError, match="unknown argument.*Q"):
        runner(**_args(Q=torch.zeros(6)))


def test_bad_call_after_good_one_with_same_shapes_is_still_checked(sq):
    _, runner = sq
    runner(**_args())
    with pytest.raises(ArgumentError, match="'Y'.*float64"):
        runner(**_args(Y=torch.empty(6, dtype=torch.float32)))


@pytest.mark.parametrize("over", [
    dict(X=torch.rand(12, dtype=torch.float64)[::2]),  # same shape and dtype, other strides
    dict(X=torch._neg_view(torch.rand(6, dtype=torch.float64))),  # same layout, a negation view
    dict(X=np.random.rand(12)[::2]),  # numpy, other strides
])
def test_cached_checks_are_keyed_by_the_whole_layout(sq, over):
    _, runner = sq
    runner(**_args())
    runner(**_args(X=np.random.rand(6)))
    with pytest.raises(ArgumentError, match="'X'"):
        runner(**_args(**over))


_N, _M = dace.symbol("N"), dace.symbol("M")


@dace.program
def rt_column_stats(A: dace.float64[_N, _M], sums: dace.float64[_M], peaks: dace.float64[_M]):
    sums[:] = np.sum(A, axis=0)
    peaks[:] = np.max(A, axis=0)


def test_a_symbol_only_a_library_node_uses_is_passed_to_the_build_and_to_the_runner() -> None:
    """`N` appears only in the memlets of the `Reduce` nodes: the SDFG as given does not list it as an
    argument, the generated code (library nodes expanded) takes it. The loaded program passes what the
    build takes; before, every argument after `M` was shifted and the column sums read garbage."""
    sdfg = rt_column_stats.to_sdfg(simplify=True)
    assert "N" not in sdfg.arglist()  # the DaCe behaviour this test guards against
    compiled = compile_sdfg(sdfg)
    assert "N" in compiled.sdfg.arglist() and "N" in plan_for(compiled.sdfg).init_args
    A = np.random.default_rng(0).normal(size=(7, 5))
    sums, peaks = np.zeros(5), np.zeros(5)
    compiled(A=A, sums=sums, peaks=peaks, N=7, M=5)
    np.testing.assert_allclose(sums, A.sum(axis=0), rtol=1e-13)
    np.testing.assert_array_equal(peaks, A.max(axis=0))
    runner_sums, runner_peaks = np.zeros(5), np.zeros(5)
    Runner(sdfg)(A=torch.from_numpy(A), sums=torch.from_numpy(runner_sums), peaks=torch.from_numpy(runner_peaks))
    np.testing.assert_array_equal(runner_sums, sums)
    np.testing.assert_array_equal(runner_peaks, peaks)


@pytest.mark.parametrize("make", [
    lambda: np.arange(12.0),
    lambda: np.arange(12.0)[3:],  # a view starting inside its base
    lambda: np.arange(12.0).reshape(3, 4)[:, 1:],  # not contiguous
    lambda: np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    lambda: np.frombuffer(np.arange(12.0).tobytes()),  # read-only
    lambda: np.zeros(0),
    lambda: np.arange(12, dtype=np.float32)[::-1],  # negative stride
    lambda: torch.arange(12.0)[2:],
])
def test_the_data_pointer_is_the_first_elements_address(make) -> None:
    from gradflow.runtime.validate import data_pointer

    array = make()
    want = array.data_ptr() if isinstance(array, torch.Tensor) else array.__array_interface__["data"][0]
    assert data_pointer(array) == want
