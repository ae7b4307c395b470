"""End to end: gradflow.grad on the dataflow corpus matches torch.autograd to 1e-9 (float64).

Each program is differentiated and compiled once (`gradflow.verify.programs`, the same check `gradflow
verify` runs); hypothesis varies the input data (seeds of the case's own generator, which draws inside
the domains of the functions the program applies).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import fingerprint
from gradflow.verify import programs
from gradflow.verify.corpus import dataflow


@pytest.mark.parametrize("name", [c.name for c in dataflow.CASES])
@settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_grad_matches_torch(name: str, seed: int) -> None:
    assert programs.check(name, seed) < 1e-9


@pytest.mark.parametrize("name", ["df_elementwise_chain", "df_inplace_input", "df_lib_softmax"])
def test_grad_leaves_its_argument_untouched(name: str) -> None:
    sdfg = dataflow.CASES_BY_NAME[name].to_sdfg()
    before = fingerprint(sdfg)
    gradflow.grad(sdfg, wrt=list(dataflow.CASES_BY_NAME[name].wrt), of="S")
    assert fingerprint(sdfg) == before
