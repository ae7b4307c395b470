"""Gradient checks of whole programs: the dataflow and loop corpora against `torch.autograd`.

A program is differentiated once per forwarding policy and compiled once (content cache); each check
runs it on the data of one seed of the case's own generator and compares the value and every gradient
with torch (float64, rtol 1e-9). The rules the differentiation used (`ADInterface.rules_used`) tell which
reverse and control rules the check verifies.
"""

from __future__ import annotations

import functools

import numpy as np

from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.compare import CheckFailure, agree
from gradflow.verify.corpus import dataflow, loops
from gradflow.verify.corpus.case import Case, run_compiled, torch_grads, torch_value

RTOL, ATOL = 1e-9, 1e-12
OVERFLOW = "gradflow_overflow"


def cases() -> tuple[Case, ...]:
    return tuple(dataflow.CASES) + tuple(loops.CASES)


#: Cases of other corpora (e.g. the NPBench kernels of the test suite) checked by name, see `adopt`.
_ADOPTED: dict[str, Case] = {}


def adopt(cases) -> None:
    """Make cases of another corpus checkable by name here (their names must be new)."""
    for case in cases:
        if case_named(case.name, missing=None) not in (None, case):
            raise ValueError(f"a different case is already named '{case.name}'")
        _ADOPTED[case.name] = case


def case_named(name: str, missing=KeyError) -> Case:
    for corpus in (dataflow.CASES_BY_NAME, loops.CASES_BY_NAME, _ADOPTED):
        if name in corpus:
            return corpus[name]
    if missing is KeyError:
        raise KeyError(name)
    return missing


def bounded(case: Case, policy: Forwarding) -> Forwarding:
    """`policy` with the case's while-loop bounds, if it has any (else while loops get a growable tape)."""
    return policy.with_loop_bounds(**case.loop_bounds) if case.loop_bounds else policy


def differentiated(name: str, policy: Forwarding = STORE_ALL, optimize: bool = True) -> Graph:
    """The `grad` result of case `name` under `policy` (with `meta["ad"]`), as a frozen graph; with
    `optimize=False`, without the optimization stage."""
    # one cache key however the defaults are spelled (`(name, policy)` and `(name, policy, True)` alike)
    return _differentiated(name, policy, optimize)


@functools.cache
def _differentiated(name: str, policy: Forwarding, optimize: bool) -> Graph:
    from gradflow.api import grad_graph

    case = case_named(name)
    return grad_graph(case.to_sdfg(), list(case.wrt), case.of, "grad_", None, forwarding_of(case, policy),
                      optimize=optimize)


def forwarding_of(case: Case, policy: Forwarding = STORE_ALL) -> Forwarding:
    """The policy a case is differentiated under: its own (checkpointing) if it has one, else `policy`, with
    the case's while-loop bounds."""
    return bounded(case, case.forwarding if case.forwarding is not None else policy)


@functools.cache
def _compiled(name: str, policy: Forwarding, optimize: bool):
    return compile_sdfg(differentiated(name, policy, optimize))


def rules_used(name: str, policy: Forwarding = STORE_ALL) -> tuple[str, ...]:
    return differentiated(name, policy).meta["ad"].rules_used


def outputs(name: str, seed: int, policy: Forwarding = STORE_ALL, optimize: bool = True) -> dict[str, np.ndarray]:
    """Every array after running case `name` differentiated under `policy` on the data of `seed`."""
    case = case_named(name)
    graph = differentiated(name, policy, optimize)
    inputs = case.inputs(seed)
    extra = {f"grad_{x}": np.full_like(inputs[x], np.nan) for x in case.wrt}  # overwritten, never read
    if OVERFLOW in graph.sdfg.arrays:
        extra[OVERFLOW] = np.full(1, -1, dtype=np.int64)
    arrays = run_compiled(case, _compiled(name, policy, optimize), {**inputs, **extra})
    if OVERFLOW in graph.sdfg.arrays and arrays[OVERFLOW][0] != 0:
        raise CheckFailure(f"{name}: a loop broke a limit of its build (a while loop its bound, "
                           f"{dict(case.loop_bounds)}, or a checkpointed loop its planned trip count)")
    return arrays


def check(name: str, seed: int, policy: Forwarding = STORE_ALL) -> float:
    """Run case `name` differentiated under `policy` on the data of `seed`; the worst relative error of
    its value and gradients against torch, or `CheckFailure`."""
    case = case_named(name)
    inputs = case.inputs(seed)
    arrays = outputs(name, seed, policy)
    worst = agree(arrays[case.of][0], torch_value(case, inputs), rtol=RTOL, atol=ATOL, what=f"{name}: value")
    expected = torch_grads(case, inputs)
    for x in case.wrt:
        worst = max(worst, agree(arrays[f"grad_{x}"], expected[x], rtol=RTOL, atol=ATOL,
                                 what=f"{name}: d{case.of}/d{x} ({policy.name})"))
    return worst
