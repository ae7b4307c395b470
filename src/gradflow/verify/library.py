"""Two-route checks of the library table: each op-level rule against torch and against the expansion.

Each case of `corpus/library.py` is differentiated twice and each result compiled once:
- route "rule": the default pipeline, which keeps the library node whole and reverses it with its rule;
- route "expand": the same pipeline with an empty library table, so the node is expanded into maps and
  tasklets first and those are differentiated instead.
A check draws sizes and data, and requires the rule route to match `torch.autograd` (float64, rtol 1e-9)
and the expansion route (the two-routes property).
"""

from __future__ import annotations

import functools
from typing import Mapping

import dace
import numpy as np
import torch
from dace.sdfg import nodes as nd

from gradflow.api import grad_graph
from gradflow.autodiff.passes import Reverse, ad_pipeline
from gradflow.core.graph import Graph, parse
from gradflow.core.rule_table import RuleTable
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.compare import CheckFailure, agree
from gradflow.verify.corpus.library import CASES, CASES_BY_NAME, LibCase

RTOL, ATOL = 1e-9, 1e-12
ROUTES = ("rule", "expand")


@functools.cache
def differentiated(name: str, route: str) -> Graph:
    case = CASES_BY_NAME[name]
    pipeline = None
    if route == "expand":
        pipeline = ad_pipeline(Reverse(tuple(case.wrt), ("S",))).with_rules(library=RuleTable("library"))
    return grad_graph(parse(case.program), list(case.wrt), "S", pipeline=pipeline)


@functools.cache
def compiled(name: str, route: str):
    return compile_sdfg(differentiated(name, route))


def library_nodes(sdfg: dace.SDFG) -> set[str]:
    return {type(n).__name__ for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nd.LibraryNode)}


def rules_used(name: str) -> tuple[str, ...]:
    return differentiated(name, "rule").meta["ad"].rules_used


def kept_whole(name: str) -> None:
    """`CheckFailure` unless the rule route keeps the case's node whole and the expansion route does not."""
    case = CASES_BY_NAME[name]
    if case.node not in library_nodes(differentiated(name, "rule").sdfg):
        raise CheckFailure(f"{name}: the default pipeline expanded the {case.node} node it has a rule for")
    if case.node != "Reduce" and case.node in library_nodes(differentiated(name, "expand").sdfg):
        raise CheckFailure(f"{name}: the expansion route kept the {case.node} node")


def _run(case: LibCase, route: str, inputs: dict, sizes: Mapping[str, int]) -> dict:
    arrays = {k: v.copy() for k, v in inputs.items()}
    arrays["S"] = np.zeros(1)
    for x in case.wrt:
        arrays[f"grad_{x}"] = np.full_like(inputs[x], np.nan)
    compiled(case.name, route)(**arrays, **sizes)
    return arrays


def _torch(case: LibCase, inputs: dict) -> tuple[float, dict]:
    tensors = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k in case.wrt) for k, v in inputs.items()}
    out = case.torch_fn(**tensors)
    grads = torch.autograd.grad(out, [tensors[x] for x in case.wrt])
    return float(out.detach()), {x: g.numpy() for x, g in zip(case.wrt, grads)}


def check(name: str, sizes: Mapping[str, int], seed: int) -> float:
    """Both routes of case `name` at `sizes` on the data of `seed`: the worst relative error, or
    `CheckFailure` naming the route, the gradient and the sizes."""
    case = CASES_BY_NAME[name]
    inputs = case.make_inputs(np.random.default_rng(seed), dict(sizes))
    value, expected = _torch(case, inputs)
    by_rule = _run(case, "rule", inputs, sizes)
    by_expansion = _run(case, "expand", inputs, sizes)
    worst = agree(by_rule["S"][0], value, rtol=RTOL, atol=ATOL, what=f"{name}: value")
    for x in case.wrt:
        worst = max(worst, agree(by_rule[f"grad_{x}"], expected[x], rtol=RTOL, atol=ATOL,
                                 what=f"{name}: rule route vs torch, dS/d{x}, sizes {dict(sizes)}"))
        worst = max(worst, agree(by_rule[f"grad_{x}"], by_expansion[f"grad_{x}"], rtol=RTOL, atol=ATOL,
                                 what=f"{name}: rule vs expansion route, dS/d{x}, sizes {dict(sizes)}"))
    return worst


def sizes_for(name: str, rng: np.random.Generator) -> dict[str, int]:
    """Sizes in 1..5 (1 and non-square included) for a check that is not driven by hypothesis."""
    return {s: int(rng.integers(1, 6)) for s in CASES_BY_NAME[name].symbols}


def names() -> tuple[str, ...]:
    return tuple(c.name for c in CASES)
