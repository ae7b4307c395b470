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


@dace.program
def add_scaled(X: dace.float64[N], Z: dace.float64[N], Y: dace.float64[N]):
    for i in dace.map[0:N]:
        Y[i] = X[i] + 2 * Z[i]


def _map_entry(sdfg: dace.SDFG) -> tuple[dace.SDFGState, dace.nodes.MapEntry]:
    return next((s, n) for s in sdfg.states() for n in s.nodes() if isinstance(n, dace.nodes.MapEntry))


def _connector_of(sdfg: dace.SDFG, data: str) -> str:
    state, entry = _map_entry(sdfg)
    return next(e.dst_conn for e in state.in_edges(entry) if e.data.data == data)


def _swap_scope_connectors(sdfg: dace.SDFG) -> dace.SDFG:
    """A copy whose map entry carries X and Z through each other's connector names (the same program)."""
    sdfg = copy.deepcopy(sdfg)
    state, entry = _map_entry(sdfg)
    names = sorted(c[3:] for c in entry.in_connectors if c.startswith("IN_"))
    assert len(names) == 2
    swap = {names[0]: names[1], names[1]: names[0]}
    for e in state.in_edges(entry):
        e._dst_conn = "IN_" + swap[e.dst_conn[3:]]
    for e in state.out_edges(entry):
        e._src_conn = "OUT_" + swap[e.src_conn[4:]]
    return sdfg


def test_fingerprint_ignores_the_names_of_scope_connectors() -> None:
    sdfg = add_scaled.to_sdfg()
    swapped = _swap_scope_connectors(sdfg)
    swapped.validate()
    assert _connector_of(swapped, "X") == _connector_of(sdfg, "Z")
    assert fingerprint(swapped) == fingerprint(sdfg)
    # the data still tells the connectors apart: reading Z where X was read is another program
    other = copy.deepcopy(sdfg)
    for e in _map_entry(other)[0].edges():
        if e.data.data == "X":
            e.data.data = "Z"
    assert fingerprint(other) != fingerprint(sdfg)
