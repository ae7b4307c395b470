"""Forwarding policies: bytes forwarded, purity, loop bounds and the errors users see.

The gradients under each policy are checked against torch in `test_loops_grad.py`; this module checks
what the policies promise besides: recomputation never forwards more than storing, and forwards less
wherever it recomputes something storing kept; the reverse pass stays pure under every policy; a while
loop past its bound is reported, not silently wrong.
"""

from __future__ import annotations

import functools

import attrs
import dace

import numpy as np
import pytest

import gradflow
from gradflow.autodiff.normalize import NORMALIZE
from gradflow.autodiff.passes import Reverse, ad_pipeline, forwarded_bytes
from gradflow.core.graph import Graph, fingerprint
from gradflow.verify.corpus import loops

BOUNDS = {"*": 64}


@functools.cache
def differentiated(name: str, policy: gradflow.Forwarding) -> Graph:
    case = loops.CASES_BY_NAME[name]
    return ad_pipeline(Reverse(case.wrt, (case.of,), forwarding=policy))(Graph.of(case.to_sdfg())).unwrap()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in loops.CASES])
def test_recompute_all_forwards_no_more_than_store_all(case) -> None:
    stored = differentiated(case.name, gradflow.STORE_ALL.with_loop_bounds(**BOUNDS))
    recomputed = differentiated(case.name, gradflow.RECOMPUTE_ALL.with_loop_bounds(**BOUNDS))
    symbols = dict(case.symbols)
    store_bytes, recompute_bytes = forwarded_bytes(stored, symbols), forwarded_bytes(recomputed, symbols)
    assert recompute_bytes <= store_bytes
    # Growable stacks (loops without a bound before the run) are not forwarded (split_vjp reruns the forward
    # in the backward), so what recomputing saves there does not show in forwarded bytes.
    # (STORE_ALL itself rebuilds copies of data it holds anyway: only what it does not rerun counts.)
    extra = sorted(set(recomputed.meta["ad"].recomputed) - set(stored.meta["ad"].recomputed))
    if store_bytes and extra and not stored.meta["ad"].heaps:
        assert recompute_bytes < store_bytes, f"recomputing {extra} saved nothing"


STORE_EVERY_COPY = attrs.evolve(gradflow.STORE_ALL, rebuild_copies=False)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in loops.CASES])
def test_rebuilt_copies_forward_no_more(case) -> None:
    """`STORE_ALL` rebuilds values that only move data it holds anyway: that never forwards more than
    storing them, and forwards less wherever it rebuilds something."""
    rebuilt = differentiated(case.name, gradflow.STORE_ALL.with_loop_bounds(**BOUNDS))
    stored = differentiated(case.name, STORE_EVERY_COPY.with_loop_bounds(**BOUNDS))
    symbols = dict(case.symbols)
    assert not stored.meta["ad"].recomputed
    rebuilt_bytes, stored_bytes = forwarded_bytes(rebuilt, symbols), forwarded_bytes(stored, symbols)
    assert rebuilt_bytes <= stored_bytes
    if rebuilt.meta["ad"].recomputed and not stored.meta["ad"].heaps:
        assert rebuilt_bytes < stored_bytes, f"rebuilding {rebuilt.meta['ad'].recomputed} saved nothing"


def test_copies_are_rebuilt_somewhere() -> None:
    """The property above is not vacuous."""
    hits = [c.name for c in loops.CASES
            if differentiated(c.name, gradflow.STORE_ALL.with_loop_bounds(**BOUNDS)).meta["ad"].recomputed]
    assert len(hits) >= 3, hits


def test_recomputation_applies_somewhere() -> None:
    """The property above is not vacuous: most kernels have something recomputable."""
    hits = [c.name for c in loops.CASES
            if differentiated(c.name, gradflow.RECOMPUTE_ALL.with_loop_bounds(**BOUNDS)).meta["ad"].recomputed]
    assert len(hits) >= 12


@pytest.mark.parametrize("policy", [gradflow.STORE_ALL, gradflow.RECOMPUTE_ALL], ids=lambda p: p.name)
@pytest.mark.parametrize("name", ["lp_softmax", "lp_if_else", "lp_newton_sqrt", "lp_map_of_loops", "lp_lu"])
def test_reverse_is_pure_under_every_policy(name: str, policy: gradflow.Forwarding) -> None:
    case = loops.CASES_BY_NAME[name]
    graph = NORMALIZE(Graph.of(case.to_sdfg())).unwrap()
    before = fingerprint(graph.sdfg)
    result = Reverse(case.wrt, (case.of,), forwarding=policy.with_loop_bounds(**BOUNDS))(graph).unwrap()
    assert fingerprint(graph.sdfg) == before, "reverse mutated its input"
    assert result.sdfg is not graph.sdfg and result.meta["ad"].spec.forwarding.recompute == policy.recompute


def test_policies_are_frozen_values() -> None:
    a = gradflow.recompute("x", "y", loop_bounds={"w": 3})
    assert a == gradflow.recompute("y", "x", loop_bounds={"w": 3}) and hash(a) == hash(gradflow.recompute("y", "x", loop_bounds={"w": 3}))
    b = a.with_loop_bounds(v=5)
    assert b.bound_of("v") == 5 and a.bound_of("v") is None
    assert gradflow.STORE_ALL.with_loop_bounds(**{"*": 7}).bound_of("anything") == 7
    assert gradflow.RECOMPUTE_ALL.name == "recompute_all" and gradflow.STORE_ALL.name == "store_all"


def test_while_loop_needs_no_bound_and_a_bound_caps_it() -> None:
    """Without a bound, what a while loop stores per iteration goes to growable stacks; with one, to
    fixed-size stacks and the loop is stopped there (gradients of both are checked in the loop corpus:
    lp_newton_sqrt and lp_newton_sqrt_capped)."""
    case = loops.CASES_BY_NAME["lp_newton_sqrt"]
    free = differentiated(case.name, gradflow.STORE_ALL).meta["ad"]
    capped = differentiated(case.name, gradflow.STORE_ALL.with_loop_bounds(**BOUNDS)).meta["ad"]
    assert free.heaps and not free.bounded_loops
    assert not capped.heaps and [limit.count for limit in capped.bounded_loops] == [64]
    f = gradflow.value_and_grad(case.program.to_sdfg(), wrt="A", of="S")
    g = gradflow.value_and_grad(case.program.to_sdfg(), wrt="A", of="S",
                                forwarding=gradflow.STORE_ALL.with_loop_bounds(**BOUNDS))
    inputs = case.inputs(3)
    (value, grad), (capped_value, capped_grad) = f(**inputs), g(**case.inputs(3))
    assert value == capped_value
    np.testing.assert_allclose(grad, capped_grad, rtol=1e-12)


def test_while_loop_past_its_bound_raises() -> None:
    case = loops.CASES_BY_NAME["lp_newton_sqrt"]
    inputs = case.inputs(0)
    f = gradflow.value_and_grad(case.program.to_sdfg(), wrt="A", of="S",
                                forwarding=gradflow.STORE_ALL.with_loop_bounds(**{"*": 2}))
    with pytest.raises(gradflow.LoopBoundError, match=r"ran more than its bound of 2"):
        f(**inputs)
    ok = gradflow.value_and_grad(case.program.to_sdfg(), wrt="A", of="S",
                                 forwarding=gradflow.STORE_ALL.with_loop_bounds(**BOUNDS))
    value, grad = ok(**case.inputs(0))
    assert np.isfinite(value) and np.all(np.isfinite(grad))


def test_user_set_that_cannot_be_recomputed_is_an_error() -> None:
    case = loops.CASES_BY_NAME["lp_whole_array_update"]
    # A is updated in place every iteration: its defining operation reads it.
    with pytest.raises(gradflow.InvalidArgumentError, match="'A' cannot be recomputed"):
        gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=gradflow.recompute("A"))
    with pytest.raises(gradflow.InvalidArgumentError, match="does not have: nope"):
        gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=gradflow.recompute("nope"))


N = dace.symbol("N")


@dace.program
def flipped_prefixes(x: dace.float64[N], S: dace.float64[1]):
    B = np.zeros((N,), dtype=np.float64)
    for k in range(1, N):
        for i in dace.map[0:k]:  # writes B[0:k] only: a part of B, the part its reader reads
            B[i] = x[k - 1 - i]
        S[0] += np.dot(B[:k], x[:k])


def _flipped_prefixes_grad(x: np.ndarray) -> np.ndarray:
    """d/dx of sum_k sum_{i<k} x[k-1-i] x[i] (each pair counted from both sides)."""
    n, g = len(x), np.zeros_like(x)
    for k in range(1, n):
        for i in range(k):
            g[k - 1 - i] += x[i]
            g[i] += x[k - 1 - i]
    return g


@pytest.mark.parametrize("policy", [gradflow.STORE_ALL, STORE_EVERY_COPY, gradflow.recompute("B")],
                         ids=["store_all", "store_every_copy", "recompute_B"])
def test_a_partly_written_copy_is_rebuilt_for_its_reader(policy: gradflow.Forwarding) -> None:
    """`B[0:k]`, rewritten every iteration from an input nothing changes: `STORE_ALL` and a user's
    `recompute("B")` rerun the flip for the sum's reverse (the rerun writes what the reader reads, not
    all of B); storing it keeps one row per iteration. All three give the exact gradient."""
    graph = ad_pipeline(Reverse(("x",), ("S",), forwarding=policy))(Graph.of(flipped_prefixes.to_sdfg())).unwrap()
    stored = "B" in graph.meta["ad"].stores.values()  # a stack of B's overwritten values
    assert ("B" in graph.meta["ad"].recomputed) == (not stored) == (policy is not STORE_EVERY_COPY)
    x = np.random.default_rng(3).uniform(-1, 1, 9)
    f = gradflow.value_and_grad(flipped_prefixes.to_sdfg(), wrt="x", of="S", forwarding=policy)
    value, grad = f(x=x.copy(), S=np.zeros(1))
    want = sum(x[k - 1 - i] * x[i] for k in range(1, 9) for i in range(k))
    np.testing.assert_allclose(value, want, rtol=1e-13)
    np.testing.assert_allclose(grad, _flipped_prefixes_grad(x), rtol=1e-13, atol=1e-14)
