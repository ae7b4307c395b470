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
