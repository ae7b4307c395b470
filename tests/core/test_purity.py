"""Every registered pass leaves its input graph untouched, over a corpus of diverse SDFGs.

A pass may succeed or fail (a typed failure value) on a given program; either way the input's canonical
fingerprint must be what it was before.
"""

from __future__ import annotations

import functools

import pytest
from returns.result import Failure

from gradflow.core.errors import GradflowError
from gradflow.core.graph import Graph, fingerprint
from gradflow.core.passes import registered_passes
from tests.corpus.purity import purity_corpus


@functools.cache
def corpus() -> tuple[Graph, ...]:
    return tuple(Graph.of(s) for s in purity_corpus())


def test_corpus_is_large_enough() -> None:
    assert len(corpus()) >= 10


@pytest.mark.parametrize("name", sorted(registered_passes()))
def test_pass_is_pure(name: str) -> None:
    pass_ = registered_passes()[name]()
    for graph in corpus():
        before = graph.fingerprint
        result = pass_(graph)
        assert fingerprint(graph.sdfg) == before, f"pass '{name}' mutated '{graph.sdfg.name}'"
        if isinstance(result, Failure):
            assert isinstance(result.failure(), GradflowError)
        else:
            assert isinstance(result.unwrap(), Graph)
