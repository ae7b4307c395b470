"""The public API: grad / vjp / value_and_grad behaviour, purity, and the typed errors users see."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.core.errors import InvalidArgumentError, NoRuleError, UnknownArrayError
from gradflow.core.graph import Graph, fingerprint
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


@dace.program
def energy(X: dace.float64[N], W: dace.float64[N], Y: dace.float64[N], S: dace.float64[1]):
    Y[:] = np.tanh(X) * W
    S[0] = np.sum(Y * Y)


@dace.program
def with_index(X: dace.float64[N], K: dace.int32[N], S: dace.float64[1]):
    S[0] = np.sum(X * K)


def reference(x: np.ndarray, w: np.ndarray):
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    s = torch.sum((torch.tanh(xt) * wt) ** 2)
    s.backward()
    return s.item(), xt.grad.numpy(), wt.grad.numpy(), (torch.tanh(xt) * wt).detach().numpy()


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(9), rng.standard_normal(9)


def test_grad_returns_a_new_sdfg_and_leaves_the_argument_alone() -> None:
    sdfg = energy.to_sdfg()
    before = fingerprint(sdfg)
    out = gradflow.grad(sdfg, wrt=["X", "W"], of="S")
    assert out is not sdfg and fingerprint(sdfg) == before
    assert {"grad_X", "grad_W"} <= {n for n, d in out.arrays.items() if not d.transient}
    x, w = data()
    arrays = dict(X=x.copy(), W=w.copy(), Y=np.zeros(9), S=np.zeros(1), grad_X=np.full(9, np.nan),
                  grad_W=np.full(9, np.nan))
    compile_sdfg(Graph.adopt(out))(**arrays, N=9)
    value, gx, gw, y = reference(x, w)
    np.testing.assert_allclose(arrays["S"][0], value, rtol=1e-12)
    np.testing.assert_allclose(arrays["Y"], y, rtol=1e-12)  # everything the original computed, too
    np.testing.assert_allclose(arrays["grad_X"], gx, rtol=1e-9)
    np.testing.assert_allclose(arrays["grad_W"], gw, rtol=1e-9)


def test_grad_accepts_a_program_and_infers_of() -> None:
    out = gradflow.grad(energy, wrt="X")
    assert "grad_X" in out.arrays and "grad_W" not in out.arrays


def test_vjp_separates_forward_and_backward_for_a_vector_output() -> None:
    sdfg = energy.to_sdfg()
    before = fingerprint(sdfg)
    result = gradflow.vjp(sdfg, wrt=["X", "W"], of="Y")
    assert fingerprint(sdfg) == before
    assert result.cotangents == {"Y": "grad_Y"} and result.grads == {"X": "grad_X", "W": "grad_W"}
    x, w = data(1)
    fwd_args = {n: np.zeros(9) for n, d in result.forward.arrays.items() if not d.transient}
    fwd_args.update(X=x.copy(), W=w.copy(), S=np.zeros(1))
    compile_sdfg(Graph.adopt(result.forward))(**fwd_args, N=9)
    cot = np.random.default_rng(5).standard_normal(9)
    bwd_args = {n: fwd_args[n] for n in result.forwarded}
    bwd_args.update(grad_Y=cot.copy(), grad_X=np.full(9, np.nan), grad_W=np.full(9, np.nan))
    compile_sdfg(Graph.adopt(result.backward))(**bwd_args, N=9)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    (torch.tanh(xt) * wt).backward(torch.tensor(cot))
    np.testing.assert_allclose(bwd_args["grad_X"], xt.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(bwd_args["grad_W"], wt.grad.numpy(), rtol=1e-9)
    np.testing.assert_array_equal(bwd_args["grad_Y"], cot)  # the cotangent is read, never written
    assert set(result.saved) <= set(result.forwarded)
    assert all(not result.backward.arrays[n].transient for n in result.forwarded)


def test_value_and_grad_numpy_and_torch() -> None:
    f = gradflow.value_and_grad(energy, wrt=["X", "W"])
    x, w = data(2)
    value, grads = f(X=x.copy(), W=w.copy())
    ref_value, gx, gw, _ = reference(x, w)
    assert value == pytest.approx(ref_value, rel=1e-12)
    np.testing.assert_allclose(grads["X"], gx, rtol=1e-9)
    np.testing.assert_allclose(grads["W"], gw, rtol=1e-9)
    value_t, grad_x = gradflow.value_and_grad(energy, wrt="X")(torch.tensor(x), torch.tensor(w))
    assert isinstance(grad_x, torch.Tensor)
    np.testing.assert_allclose(grad_x.numpy(), gx, rtol=1e-9)


def test_value_and_grad_rejects_wrong_dtype() -> None:
    f = gradflow.value_and_grad(energy, wrt="X")
    with pytest.raises(gradflow.ArgumentError, match=r"argument 'X': expected dtype float64, got float32"):
        f(X=np.ones(4, np.float32), W=np.ones(4))


def test_wrt_not_in_the_sdfg_lists_the_arrays() -> None:
    with pytest.raises(UnknownArrayError, match=r"'Q'.*arrays there: S, W, X, Y"):
        gradflow.grad(energy, wrt="Q", of="S")


def test_integer_wrt_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="'K' of type int32"):
        gradflow.grad(with_index, wrt="K", of="S")


def test_non_scalar_of_points_to_vjp() -> None:
    with pytest.raises(InvalidArgumentError, match="vjp"):
        gradflow.grad(energy, wrt="X", of="Y")


def test_taken_gradient_name_needs_a_prefix() -> None:
    sdfg = energy.to_sdfg()
    sdfg.add_array("grad_X", [N], dace.float64)
    with pytest.raises(InvalidArgumentError, match="prefix"):
        gradflow.grad(sdfg, wrt="X", of="S")
    out = gradflow.grad(sdfg, wrt="X", of="S", prefix="d_")
    assert "d_X" in out.arrays


def _outer_with_nested() -> dace.SDFG:
    inner = dace.SDFG("inner")
    inner.add_array("a", [1], dace.float64)
    inner.add_array("b", [1], dace.float64)
    inner.add_state().add_mapped_tasklet("t", {"i": "0:1"}, {"x": dace.Memlet("a[i]")}, "y = 2 * x * x",
                                         {"y": dace.Memlet("b[i]")}, external_edges=True)
    outer = dace.SDFG("outer")
    outer.add_array("A", [1], dace.float64)
    outer.add_array("S", [1], dace.float64)
    state = outer.add_state("the_state")
    node = state.add_nested_sdfg(inner, {"a": None}, {"b": None})
    state.add_edge(state.add_read("A"), None, node, "a", dace.Memlet("A[0]"))
    state.add_edge(node, "b", state.add_write("S"), None, dace.Memlet("S[0]"))
    return outer


def test_nested_sdfg_is_differentiated_recursively() -> None:
    value, grad = gradflow.value_and_grad(_outer_with_nested(), wrt="A", of="S")(A=np.array([1.5]), S=np.zeros(1))
    assert value == pytest.approx(4.5) and grad[0] == pytest.approx(6.0)


def test_a_map_bodys_vjp_seeds_only_its_iterations_part_of_the_cotangent() -> None:
    """The vjp of a map's nested body receives whole outer arrays; it copies the cotangent of what it
    writes into its gradient buffer for that one element (it copied the whole array per iteration: 8 s
    for lp_map_with_branch at N = 200,000)."""
    from dace.sdfg import nodes as nd

    from gradflow.verify.corpus import loops

    case = loops.CASES_BY_NAME["lp_map_with_branch"]
    sdfg = gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of)
    calls = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nd.NestedSDFG) and n.label.startswith("vjp_")]
    assert calls
    for call in calls:
        seeds = [e for s in call.sdfg.states() for e in s.edges()
                 if isinstance(e.src, nd.AccessNode) and e.src.data.startswith("gradflow_d_")
                 and isinstance(e.dst, nd.AccessNode) and e.dst.data.startswith("gradflow_g_")]
        assert seeds and all(e.data.subset.num_elements() == 1 for e in seeds), [str(e.data) for e in seeds]


def test_operation_without_a_rule_names_the_node_and_state() -> None:
    from gradflow.analysis.ops import Op
    from gradflow.autodiff.context import OpSite
    from gradflow.autodiff.engine import _rule_for
    from gradflow.autodiff.rules import default_tables

    state = _outer_with_nested().nodes()[0]
    site = OpSite(0, state, Op("other", frozenset(), (), (), "odd_node"))
    with pytest.raises(NoRuleError, match=r"other 'odd_node'.*state 'the_state'"):
        _rule_for(default_tables(), site)
