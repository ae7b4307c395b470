"""Control flow end to end: gradflow.grad on the loop corpus matches torch.autograd to 1e-9 (float64),
under every forwarding strategy.

Strategies: `store_all`, `recompute_all`, and a user-given set (the first half, by name, of what
`recompute_all` recomputes, or all of it when that is fewer than two arrays: a user set is checked
strictly, every array named must be recomputable; an SDFG equal to another strategy's reuses its build).
Agreement of the strategies follows from each matching torch at 1e-9 on the same inputs. Each program
is differentiated and compiled once per strategy; hypothesis varies the input data.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import fingerprint
from gradflow.verify import programs
from gradflow.verify.corpus import loops

RTOL = 1e-9


@functools.cache
def policy_for(name: str, strategy: str) -> gradflow.Forwarding:
    if strategy == "store_all":
        return gradflow.STORE_ALL
    if strategy == "recompute_all":
        return gradflow.RECOMPUTE_ALL
    chosen = programs.differentiated(name, gradflow.RECOMPUTE_ALL).meta["ad"].recomputed
    return gradflow.Forwarding(recompute=frozenset(chosen[: len(chosen) // 2] if len(chosen) >= 2 else chosen))


@pytest.mark.parametrize("strategy", ["store_all", "recompute_all", "recompute_some"])
@pytest.mark.parametrize("name", [c.name for c in loops.CASES])
@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_grad_matches_torch(name: str, strategy: str, seed: int) -> None:
    assert programs.check(name, seed, policy_for(name, strategy)) < RTOL


def test_grad_leaves_its_argument_untouched() -> None:
    case = loops.CASES_BY_NAME["lp_lu"]
    sdfg = case.to_sdfg()
    before = fingerprint(sdfg)
    gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of)
    assert fingerprint(sdfg) == before


def test_corpus_covers_the_required_constructs() -> None:
    names = set(loops.CASES_BY_NAME)
    for required in ("lp_break_search", "lp_strided_step2_odd", "lp_negative_step", "lp_if_else", "lp_newton_sqrt",
                     "lp_triangular", "lp_map_of_loops", "lp_map_with_branch", "lp_map_inplace_rows",
                     "lp_map_of_while", "lp_newton_sqrt_capped", "lp_map_of_while_capped", "lp_api_loop_branch",
                     "lp_api_while_accumulate", "lp_api_edge_symbols", "lp_symbol_from_data", "lp_cholesky_dot",
                     "lp_lu_slices", "lp_trisolv_dot", "lp_doitgen", "lp_covariance"):
        assert required in names
    assert len(names) >= 12


@pytest.mark.parametrize("name", ["lp_if_else", "lp_softmax", "lp_triangular", "lp_api_edge_symbols",
                                  "lp_api_while_accumulate"])
def test_torch_function_through_control_flow(name: str) -> None:
    """The split forward/backward of a loop program (tape, recorded branches; for the while loop without a
    bound, a backward that reruns the forward) works as an autograd Function."""
    import torch

    import gradflow.torch as gtorch
    from gradflow.verify.corpus.case import to_tensors

    case = loops.CASES_BY_NAME[name]
    inputs = case.inputs(5)
    names = [k for k in inputs if k != case.of]
    f = gtorch.function(gradflow.vjp(case.to_sdfg(), wrt=list(case.wrt), of=case.of), inputs=names, outputs=[case.of])
    mine = to_tensors(inputs, requires_grad=case.wrt)
    out = f(*[mine[k] for k in names])
    out.sum().backward()
    ref = to_tensors(inputs, requires_grad=case.wrt)
    expected = case.torch_fn(**ref) - ref[case.of][0]  # the function allocates `of` zeroed
    expected.backward()
    np.testing.assert_allclose(out.detach().sum().item(), expected.item(), rtol=RTOL)
    for x in case.wrt:
        np.testing.assert_allclose(mine[x].grad.numpy(), ref[x].grad.numpy(), rtol=RTOL, atol=1e-12, err_msg=x)
