"""Op-level reverse rules of library nodes (issue 4).

Each case is a `@dace.program` with symbolic sizes built around one kind of library node, reduced to a
scalar through a random weight (so the cotangent reaching the node is not constant). It is differentiated
twice and each result compiled once:
- route "rule": the default pipeline, where the node is kept whole and reversed by its rule in the library table;
- route "expand": every library node expanded first, so its maps and tasklets are differentiated instead.
Hypothesis then varies the sizes (including 1 and non-square) and the data: the op-level gradient must
match `torch.autograd` (float64, rtol 1e-9) and the expansion route (the two-routes property).
"""

from __future__ import annotations

import functools

import dace
import numpy as np
import pytest
import torch
from dace.sdfg import nodes as nd
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.autodiff.passes import Reverse
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.core.rule_table import RuleTable
from gradflow.runtime.compile import compile_sdfg
from tests.rules.library_cases import CASES, CASES_BY_NAME, LibCase

RTOL = 1e-9


def _expanding_pipeline(case: LibCase) -> Pipeline:
    """The default AD pipeline with an empty library table: every library node is expanded."""
    return gradflow.ad_pipeline(Reverse(tuple(case.wrt), ("S",))).with_rules(library=RuleTable("library"))


@functools.cache
def _grad_sdfg(name: str, route: str) -> dace.SDFG:
    case = CASES_BY_NAME[name]
    sdfg = case.program.to_sdfg(simplify=True)
    pipeline = _expanding_pipeline(case) if route == "expand" else None
    return gradflow.grad(sdfg, wrt=list(case.wrt), of="S", pipeline=pipeline)


@functools.cache
def _compiled(name: str, route: str):
    return compile_sdfg(Graph.adopt(_grad_sdfg(name, route)))


def _library_nodes(sdfg: dace.SDFG) -> set[str]:
    return {type(n).__name__ for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nd.LibraryNode)}


def _run(case: LibCase, route: str, inputs: dict, sizes: dict) -> dict:
    arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
    arrays["S"] = np.zeros(1)
    for x in case.wrt:
        arrays[f"grad_{x}"] = np.full_like(inputs[x], np.nan)
    _compiled(case.name, route)(**arrays, **sizes)
    return arrays


def _torch(case: LibCase, inputs: dict) -> tuple[float, dict]:
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in case.wrt) for k, v in inputs.items()}
    out = case.torch_fn(**tensors)
    grads = torch.autograd.grad(out, [tensors[x] for x in case.wrt])
    return float(out.detach()), {x: g.numpy() for x, g in zip(case.wrt, grads)}


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_node_kept_whole_by_default(name: str) -> None:
    """The rule route really reverses the library node: it survives normalization (it has a rule)."""
    case = CASES_BY_NAME[name]
    assert case.node in _library_nodes(_grad_sdfg(name, "rule"))
    assert case.node not in _library_nodes(_grad_sdfg(name, "expand")) or case.node == "Reduce"


@pytest.mark.parametrize("name", [c.name for c in CASES])
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rule_matches_torch_and_expansion(name: str, data) -> None:
    case = CASES_BY_NAME[name]
    sizes = {s: data.draw(st.integers(1, 5), label=s) for s in case.symbols}
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    inputs = case.make_inputs(np.random.default_rng(seed), sizes)
    value, expected = _torch(case, inputs)
    by_rule = _run(case, "rule", inputs, sizes)
    by_expansion = _run(case, "expand", inputs, sizes)
    np.testing.assert_allclose(by_rule["S"][0], value, rtol=RTOL, atol=1e-12)
    for x in case.wrt:
        np.testing.assert_allclose(by_rule[f"grad_{x}"], expected[x], rtol=RTOL, atol=1e-12,
                                   err_msg=f"rule route, dS/d{x}, sizes {sizes}")
        np.testing.assert_allclose(by_rule[f"grad_{x}"], by_expansion[f"grad_{x}"], rtol=RTOL, atol=1e-12,
                                   err_msg=f"rule vs expansion route, dS/d{x}, sizes {sizes}")
