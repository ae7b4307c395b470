"""End to end: gradflow.grad on the dataflow corpus matches torch.autograd to 1e-9 (float64).

Each program is differentiated and compiled once; hypothesis varies the input data (seeds of the case's
own generator, which draws inside the domains of the functions the program applies).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import Graph, fingerprint
from gradflow.runtime.compile import compile_sdfg
from tests.corpus import dataflow
from tests.corpus.case import Case, run_compiled, torch_grads, torch_value

RTOL = 1e-9

#: Cases whose constructs are not differentiated yet; strict, so each turns into a failure once it works.
NOT_YET: dict[str, str] = {}


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=NOT_YET[case.name])] if case.name in NOT_YET else []
    return pytest.param(case, id=case.name, marks=marks)


@functools.cache
def compiled_grad(name: str):
    case = dataflow.CASES_BY_NAME[name]
    sdfg = case.to_sdfg()
    before = fingerprint(sdfg)
    result = gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of)
    assert fingerprint(sdfg) == before, "grad modified its argument"
    return compile_sdfg(Graph.adopt(result))


def check_case(case: Case, seed: int) -> None:
    inputs = case.inputs(seed)
    outputs = {f"grad_{x}": np.full_like(inputs[x], np.nan) for x in case.wrt}  # overwritten, never read
    arrays = run_compiled(case, compiled_grad(case.name), {**inputs, **outputs})
    expected_value = torch_value(case, inputs)
    np.testing.assert_allclose(arrays[case.of][0], expected_value, rtol=RTOL, atol=1e-12)
    expected = torch_grads(case, inputs)
    for x in case.wrt:
        np.testing.assert_allclose(arrays[f"grad_{x}"], expected[x], rtol=RTOL, atol=1e-12, err_msg=f"d{case.of}/d{x}")


@pytest.mark.parametrize("case", [_param(c) for c in dataflow.CASES])
@settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_grad_matches_torch(case: Case, seed: int) -> None:
    check_case(case, seed)
