"""The corpora contain what they claim: loop-free dataflow, library nodes where intended, loops,
conditionals and nested SDFGs in the loop corpus, and a diverse, valid purity corpus."""

from __future__ import annotations

import dataclasses

import dace
import numpy as np
import pytest

from gradflow.verify.corpus import dataflow, loops
from gradflow.verify.corpus.case import Case

from . import purity
from .constructs import constructs


def _all_cases() -> list[Case]:
    return dataflow.CASES + loops.CASES


def test_case_records_are_well_formed():
    names = [c.name for c in _all_cases()]
    assert len(names) == len(set(names))
    for case in _all_cases():
        assert dataclasses.is_dataclass(case)
        with pytest.raises(dataclasses.FrozenInstanceError):
            case.name = "x"  # type: ignore[misc]
        program = case.program.f.__name__
        variant = case.name.startswith(program + "_") and (case.loop_bounds or case.forwarding is not None)
        assert case.name == program or variant, "case name and program name agree (or name a policy variant)"
        assert case.of == "S" and case.wrt
        a, b = case.inputs(seed=3), case.inputs(seed=3)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), "inputs are seeded"


def test_dataflow_corpus_is_loop_free_and_mostly_library_free():
    assert len(dataflow.CASES) >= 18
    library_free = 0
    with_library = 0
    for case in dataflow.CASES:
        k = constructs(case.to_sdfg(simplify=True))
        assert k["LoopRegion"] == 0 and k["ConditionalBlock"] == 0, case.name
        libs = sum(v for key, v in k.items() if key.startswith("LibraryNode:"))
        if libs:
            with_library += 1
        else:
            library_free += 1
    assert library_free >= 12  # mostly maps and tasklets: the element-wise rules are what it exercises
    assert with_library >= 3


def test_loop_corpus_has_loops_conditionals_and_nested_sdfgs():
    assert len(loops.CASES) >= 14
    seen = {"LoopRegion": 0, "ConditionalBlock": 0, "NestedSDFG": 0}
    for case in loops.CASES:
        k = constructs(case.to_sdfg(simplify=True))
        assert k["LoopRegion"] + k["ConditionalBlock"] + k["ConditionalEdge"] >= 1, case.name
        for key in seen:
            seen[key] += k[key] > 0
    assert seen["LoopRegion"] >= 14
    assert seen["ConditionalBlock"] >= 3
    assert seen["NestedSDFG"] >= 2


def test_purity_corpus_is_diverse_valid_and_fresh():
    first = purity.purity_corpus()
    second = purity.purity_corpus()
    assert len(first) >= 12
    assert all(a is not b for a, b in zip(first, second))
    found = {"LoopRegion": False, "ConditionalBlock": False, "NestedSDFG": False, "WCR": False,
             "LibraryNode:Reduce": False}
    for sdfg in first:
        assert isinstance(sdfg, dace.SDFG)
        sdfg.validate()
        k = constructs(sdfg)
        for key in found:
            found[key] |= k[key] > 0
    assert all(found.values()), found
    names = {s.name for s in first}
    assert {"api_nested_sdfg", "api_loop_region", "api_conditional_block"} <= names


@pytest.mark.parametrize("name", ["api_nested_sdfg", "api_loop_region", "api_conditional_block"])
def test_api_built_sdfgs_compute_their_reference(name):
    sdfg, ref = purity.api_references()[name]
    compiled = sdfg.compile()
    rng = np.random.default_rng(0)
    for sign in (1.0, -1.0):  # both branches of the conditional one
        X = rng.normal(size=6)
        X[0] = sign * abs(X[0])
        args = {"X": X.copy(), "S": np.zeros(1)}
        if "Y" in sdfg.arrays:
            args["Y"] = np.zeros(6)
        compiled(**args, N=6)
        np.testing.assert_allclose(args["S"][0], ref(X), rtol=1e-12)
