"""Control flow end to end: gradflow.grad on the loop corpus matches torch.autograd to 1e-9 (float64),
under every forwarding strategy.

Strategies: `store_all`, `recompute_all`, and a user-given set (the first half, by name, of what
`recompute_all` recomputes; cases where that set would equal one of the others are not compiled twice).
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
from gradflow.autodiff.passes import Reverse, ad_pipeline
from gradflow.core.graph import Graph, fingerprint
from gradflow.runtime.compile import compile_sdfg
from tests.corpus import loops
from tests.corpus.case import Case, run_compiled, torch_grads, torch_value

RTOL = 1e-9
#: Trip-count bound for while loops (the Newton iteration converges in well under 64 steps).
BOUNDS = {"*": 64}


def recomputed_by_all(name: str) -> tuple[str, ...]:
    case = loops.CASES_BY_NAME[name]
    policy = gradflow.RECOMPUTE_ALL.with_loop_bounds(**BOUNDS)
    graph = ad_pipeline(Reverse(case.wrt, (case.of,), forwarding=policy))(Graph.of(case.to_sdfg())).unwrap()
    return graph.meta["ad"].recomputed


def policy_for(name: str, strategy: str) -> gradflow.Forwarding | None:
    if strategy == "store_all":
        return gradflow.STORE_ALL.with_loop_bounds(**BOUNDS)
    if strategy == "recompute_all":
        return gradflow.RECOMPUTE_ALL.with_loop_bounds(**BOUNDS)
    chosen = recomputed_by_all(name)
    if len(chosen) < 2:
        return None  # the user set would be empty or all of recompute_all: nothing new to check
    return gradflow.recompute(*chosen[: len(chosen) // 2], loop_bounds=BOUNDS)


@functools.cache
def compiled_grad(name: str, strategy: str):
    case = loops.CASES_BY_NAME[name]
    policy = policy_for(name, strategy)
    if policy is None:
        return None, None
    sdfg = case.to_sdfg()
    before = fingerprint(sdfg)
    result = gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of, forwarding=policy)
    assert fingerprint(sdfg) == before, "grad modified its argument"
    return compile_sdfg(Graph.adopt(result)), result


def check_case(case: Case, strategy: str, seed: int) -> None:
    compiled, sdfg = compiled_grad(case.name, strategy)
    if compiled is None:
        pytest.skip("recompute_all recomputes fewer than two arrays: a user set adds nothing")
    inputs = case.inputs(seed)
    extra = {f"grad_{x}": np.full_like(inputs[x], np.nan) for x in case.wrt}  # overwritten, never read
    if "gradflow_overflow" in sdfg.arrays:
        extra["gradflow_overflow"] = np.full(1, -1, dtype=np.int64)
    arrays = run_compiled(case, compiled, {**inputs, **extra})
    if "gradflow_overflow" in sdfg.arrays:
        assert arrays["gradflow_overflow"][0] == 0, "a while loop ran past its bound"
    np.testing.assert_allclose(arrays[case.of][0], torch_value(case, inputs), rtol=RTOL, atol=1e-12)
    expected = torch_grads(case, inputs)
    for x in case.wrt:
        np.testing.assert_allclose(arrays[f"grad_{x}"], expected[x], rtol=RTOL, atol=1e-12, err_msg=f"d{case.of}/d{x}")


@pytest.mark.parametrize("strategy", ["store_all", "recompute_all", "recompute_some"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in loops.CASES])
@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_grad_matches_torch(case: Case, strategy: str, seed: int) -> None:
    check_case(case, strategy, seed)


def test_corpus_covers_the_required_constructs() -> None:
    names = set(loops.CASES_BY_NAME)
    for required in ("lp_break_search", "lp_strided_step2_odd", "lp_negative_step", "lp_if_else", "lp_newton_sqrt", "lp_triangular",
                     "lp_map_of_loops", "lp_map_with_branch"):
        assert required in names
    assert len(names) >= 12


@pytest.mark.parametrize("name", ["lp_if_else", "lp_softmax", "lp_triangular"])
def test_torch_function_through_control_flow(name: str) -> None:
    """The split forward/backward of a loop program (tape, recorded branches) works as an autograd Function."""
    import torch

    import gradflow.torch as gtorch
    from tests.corpus.case import to_tensors

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
