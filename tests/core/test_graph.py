"""The graph value: copies on the way in, canonical fingerprints, private editable copies."""

from __future__ import annotations

import copy

import dace

from gradflow.core.graph import Graph, fingerprint

N = dace.symbol("N")


@dace.program
def scale(X: dace.float64[N], Y: dace.float64[N]):
    Y[:] = 2 * X


def test_fingerprint_stable_under_deepcopy_but_not_under_edits() -> None:
    sdfg = scale.to_sdfg()
    assert fingerprint(sdfg) == fingerprint(copy.deepcopy(sdfg))
    edited = copy.deepcopy(sdfg)
    edited.add_array("Z", [3], dace.float64)
    assert fingerprint(edited) != fingerprint(sdfg)


def test_of_copies_and_editable_is_private() -> None:
    sdfg = scale.to_sdfg()
    graph = Graph.of(sdfg)
    taken = graph.fingerprint
    assert graph.sdfg is not sdfg and taken == fingerprint(sdfg)
    mine = graph.editable()
    mine.add_array("Z", [3], dace.float64)
    assert "Z" not in graph.sdfg.arrays and not graph.changed_since_fingerprint()
    graph.sdfg.add_array("W", [3], dace.float64)  # someone mutates the borrowed SDFG: detectable
    assert graph.changed_since_fingerprint()


def test_with_meta_shares_the_sdfg() -> None:
    graph = Graph.of(scale.to_sdfg())
    tagged = graph.with_meta(note=1)
    assert tagged.sdfg is graph.sdfg and tagged.meta["note"] == 1 and "note" not in graph.meta
    assert tagged.fingerprint == graph.fingerprint


def test_graph_of_a_program_parses_it() -> None:
    graph = Graph.of(scale)
    assert set(graph.sdfg.arrays) >= {"X", "Y"}
