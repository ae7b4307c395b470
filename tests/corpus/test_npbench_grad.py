"""The 37 NPBench kernels upstream DaCe's AD suite differentiates: gradflow's gradients match
torch.autograd (float64, rtol 1e-9) under every forwarding policy: store everything, recompute what can
be, and a byte budget halfway between the two's forwarded bytes (the exact planner's choice)."""

from __future__ import annotations

import functools

import pytest

import gradflow
from gradflow.verify import programs

from . import npbench

programs.adopt(npbench.CASES)


@functools.cache
def _halfway(name: str) -> gradflow.Forwarding:
    sizes = dict(npbench.CASES_BY_NAME[name].symbols)
    plans = [programs.differentiated(name, p).meta["ad"].forwarding_plan for p in (gradflow.STORE_ALL,
                                                                                   gradflow.RECOMPUTE_ALL)]
    stored, recomputed = (plan.total_bytes(sizes) for plan in plans)
    return gradflow.Forwarding.budget((stored + recomputed) // 2, sizes=sizes)


POLICIES = {"store_all": lambda name: gradflow.STORE_ALL, "recompute_all": lambda name: gradflow.RECOMPUTE_ALL,
            "budget": _halfway}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", [c.name for c in npbench.CASES])
def test_gradient_matches_torch(name: str, policy: str) -> None:
    assert programs.check(name, 1, POLICIES[policy](name)) < 1e-9


def test_the_corpus_is_upstreams_list() -> None:
    assert len(npbench.CASES) == 37


@pytest.mark.parametrize("name", [c.name for c in npbench.CASES])
def test_grad_output_runs_through_dace_own_compile(name: str, tmp_path) -> None:
    """What `gradflow.grad` returns is a plain SDFG: DaCe's own `SDFG.__call__` (its compile, no gradflow
    runtime) builds and runs it, with gradients equal to torch's."""
    import numpy as np

    from gradflow.verify.corpus.case import torch_grads, torch_value

    case = npbench.CASES_BY_NAME[name]
    sdfg = gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of)
    sdfg.build_folder = str(tmp_path / "build")  # private: workers compile programs of the same name
    inputs = case.inputs(2)
    arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
    arrays.update({f"grad_{x}": np.full_like(inputs[x], np.nan) for x in case.wrt})
    sdfg(**arrays, **dict(case.symbols))
    np.testing.assert_allclose(arrays[case.of].reshape(-1)[0], torch_value(case, inputs), rtol=1e-9, atol=1e-12)
    expected = torch_grads(case, inputs)
    for x in case.wrt:
        np.testing.assert_allclose(arrays[f"grad_{x}"], expected[x], rtol=1e-9, atol=1e-12, err_msg=x)
