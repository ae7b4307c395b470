"""The immutable graph value that every pass consumes and produces.

A `Graph` owns a private `dace.SDFG`. Nobody outside gets that object to mutate: `Graph.of` copies what it is
given, `editable()` hands out a fresh deep copy, and `Graph.adopt` takes ownership of an SDFG its caller
built and promises not to touch again. The canonical fingerprint is a SHA-256 over the SDFG's JSON with the
volatile fields removed (memlet `guid`s are renewed by `copy.deepcopy`) and every graph (a state's dataflow,
a control-flow region's blocks) put in a canonical order, so equal programs hash equal however they were
built and in whichever process: "unchanged" is checkable, and builds can be cached by content across
processes.
"""

from __future__ import annotations

import copy
import hashlib
import json
from types import MappingProxyType
from typing import Any, Mapping

import attrs
import dace

from gradflow.core.dace_warnings import dace_set_connectors
from gradflow.core.errors import InvalidArgumentError
from gradflow.core.exact_subsets import exact_subsets

#: JSON keys that vary between equal programs, or only say where they came from, left out of the fingerprint:
#: memlet `guid`s (renewed by `copy.deepcopy`), source positions (the same program in another checkout is
#: the same program), and `cfg_list_id`s (a numbering that follows the order of the blocks).
VOLATILE_KEYS = frozenset({"guid", "debuginfo", "source_files", "cfg_list_id"})

#: Rounds of neighbourhood refinement when ordering the nodes of a graph (two tell apart the access nodes
#: of one array by what they connect, and the tasklets of one label by their data).
_REFINE_ROUNDS = 2


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


#: JSON types of the nodes whose `IN_x`/`OUT_x` connectors are names only: DaCe numbers them in whatever
#: order a transformation met the data (`LoopToMap` iterates over sets of names: the numbering follows the
#: hash seed), so the fingerprint renames them in an order of their own.
_SCOPE_NODES = frozenset({"MapEntry", "MapExit", "ConsumeEntry", "ConsumeExit"})
_SCOPE_PREFIXES = ("IN_", "OUT_")


def _masked(connector: Any) -> Any:
    """A connector as seen from the other end of an edge: scope connectors without their arbitrary suffix."""
    if isinstance(connector, str):
        for prefix in _SCOPE_PREFIXES:
            if connector.startswith(prefix):
                return prefix
    return connector


def _renamed_scope_connectors(graph: dict) -> dict:
    """`graph` (a state's JSON) with the `IN_x`/`OUT_x` connectors of every scope node renamed `IN_1`,
    `OUT_1`, ... in the order of what they carry (memlet, and the node and connector at the other end).

    A connector pair keeps one suffix; suffixes alike in all of that keep their order (a cache miss at
    worst). Renaming a node's connectors consistently with its edges does not change the program."""
    nodes, edges = graph["nodes"], graph["edges"]
    by_id = {str(n["id"]): n for n in nodes}
    renames: dict[str, dict[str, str]] = {}
    for node in nodes:
        if node.get("type") not in _SCOPE_NODES:
            continue
        attrs_ = node.get("attributes", {})
        names = [c for key in ("in_connectors", "out_connectors") for c in (attrs_.get(key) or {})]
        suffixes = sorted({c[len(p):] for c in names for p in _SCOPE_PREFIXES if c.startswith(p)})
        if not suffixes:
            continue
        me = str(node["id"])
        carried: dict[str, list[str]] = {x: [] for x in suffixes}
        for e in edges:
            for end, conn, other, other_conn in (("src", e.get("src_connector"), e.get("dst"), e.get("dst_connector")),
                                                 ("dst", e.get("dst_connector"), e.get("src"), e.get("src_connector"))):
                if str(e.get(end)) != me or not isinstance(conn, str):
                    continue
                for prefix in _SCOPE_PREFIXES:
                    if conn.startswith(prefix) and conn[len(prefix):] in carried:
                        far = by_id.get(str(other), {})
                        carried[conn[len(prefix):]].append(_digest([end, prefix, e.get("attributes"), far.get("type"),
                                                                    far.get("label"), _masked(other_conn)]))
        order = sorted(suffixes, key=lambda x: (sorted(carried[x]), suffixes.index(x)))
        mapping = {p + old: p + str(k + 1) for k, old in enumerate(order) for p in _SCOPE_PREFIXES}
        if any(old != new for old, new in mapping.items()):
            renames[me] = mapping
    if not renames:
        return graph

    def rename(node_id: Any, conn: Any) -> Any:
        return renames.get(str(node_id), {}).get(conn, conn) if isinstance(conn, str) else conn

    out_nodes = []
    for node in nodes:
        node_renames = renames.get(str(node["id"]))
        if node_renames:
            attrs_ = dict(node["attributes"])
            for key in ("in_connectors", "out_connectors"):
                if isinstance(attrs_.get(key), dict):
                    attrs_[key] = {node_renames.get(c, c): t for c, t in attrs_[key].items()}
            node = dict(node, attributes=attrs_)
        out_nodes.append(node)
    out_edges = [dict(e, src_connector=rename(e.get("src"), e.get("src_connector")),
                      dst_connector=rename(e.get("dst"), e.get("dst_connector"))) for e in edges]
    return dict(graph, nodes=out_nodes, edges=out_edges)


def _canonical_graph(graph: dict) -> dict:
    """`graph` (a state or a control-flow region, already canonical inside) with its nodes sorted by a
    structural key and every id that refers to them renumbered.

    The key of a node is its content without ids, refined by the keys of its neighbours (through which
    edges, in which direction) and of its scope; nodes alike in all of that are left in their order, which
    at worst makes two equal programs hash apart (a cache miss), never two different ones alike. Dataflow
    edges are sorted completely; interstate edges keep their relative order per source block, since the
    order of conditional out-edges may matter to code generation."""
    if not all(isinstance(n, dict) and isinstance(n.get("id"), int) for n in graph["nodes"]):
        return graph
    if graph.get("type") == "SDFGState":
        graph = _renamed_scope_connectors(graph)
    nodes, edges = graph["nodes"], graph["edges"]
    position = {str(n["id"]): k for k, n in enumerate(nodes)}
    refs = ("id", "scope_entry", "scope_exit")
    keys = [_digest({k: v for k, v in n.items() if k not in refs}) for n in nodes]
    links: list[list[tuple[str, str, int]]] = [[] for _ in nodes]
    for e in edges:
        src, dst = position.get(str(e.get("src"))), position.get(str(e.get("dst")))
        if src is None or dst is None:
            return graph  # not an id-linked graph after all: leave it as it is
        body = _digest({k: v for k, v in e.items() if k not in ("src", "dst")})
        links[src].append(("out", body, dst))
        links[dst].append(("in", body, src))
    scopes = [[position.get(str(n.get(r))) for r in ("scope_entry", "scope_exit")] for n in nodes]
    for _ in range(_REFINE_ROUNDS):
        keys = [_digest([keys[k], sorted((d, b, keys[o]) for d, b, o in links[k]),
                         [keys[s] if s is not None else None for s in scopes[k]]])
                for k in range(len(nodes))]
    order = sorted(range(len(nodes)), key=lambda k: (keys[k], k))
    new_id = {str(nodes[old]["id"]): new for new, old in enumerate(order)}

    def renumber(ref: Any) -> Any:
        return str(new_id[str(ref)]) if ref is not None and str(ref) in new_id else ref

    out_nodes = []
    for old in order:
        node = dict(nodes[old], id=new_id[str(nodes[old]["id"])])
        for r in ("scope_entry", "scope_exit"):
            if r in node:
                node[r] = renumber(node[r])
        out_nodes.append(node)
    out_edges = [dict(e, src=renumber(e["src"]), dst=renumber(e["dst"])) for e in edges]
    if graph.get("type") == "SDFGState":
        out_edges.sort(key=lambda e: (int(e["src"]), int(e["dst"]), _digest(e)))
    else:
        out_edges.sort(key=lambda e: int(e["src"]))  # stable: out-edges of a block keep their order
    out = dict(graph, nodes=out_nodes, edges=out_edges)
    if isinstance(graph.get("scope_dict"), dict):
        out["scope_dict"] = {str(renumber(k)): sorted(new_id.get(str(c), c) for c in v)
                             for k, v in graph["scope_dict"].items()}
    if isinstance(graph.get("start_block"), int):
        out["start_block"] = new_id[str(graph["start_block"])]
    return out


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = {k: _canonical(v) for k, v in obj.items() if k not in VOLATILE_KEYS}
        if isinstance(out.get("nodes"), list) and isinstance(out.get("edges"), list):
            out = _canonical_graph(out)
        return out
    if isinstance(obj, (list, tuple)):  # a conditional block's branches are (condition, region) tuples
        return [_canonical(v) for v in obj]
    return obj


def canonical_json(sdfg: dace.SDFG) -> str:
    """The SDFG's JSON in canonical form: what `fingerprint` hashes (and what to diff when two programs
    that should be equal hash apart)."""
    return json.dumps(_canonical(sdfg.to_json()), sort_keys=True, default=str)


def fingerprint(sdfg: dace.SDFG) -> str:
    """Canonical content hash of an SDFG: stable under `copy.deepcopy`, across processes and hash seeds,
    and under reordering of the nodes of a state or the blocks of a region."""
    return hashlib.sha256(canonical_json(sdfg).encode()).hexdigest()


def parse(program: Any, simplify: bool = True) -> dace.SDFG:
    """DaCe's parse of a `@dace.program` (anything with `to_sdfg`), the one way gradflow and its corpus
    parse: without DaCe's assumption that every symbol is positive (its frontend propagated a map's reads
    x0[i2], x0[3], x0[N - 2] to x0[3:N], and its simplify then fused that map's state with an unordered
    in-place write of x0[2]: fuzz seed 18300, program 147), its set-connector warning silenced."""
    with dace_set_connectors(), exact_subsets():
        return program.to_sdfg(simplify=simplify)


def as_sdfg(program: Any) -> dace.SDFG:
    """The SDFG of a `dace.SDFG` (itself) or of a `@dace.program` (parsed, simplified)."""
    if isinstance(program, dace.SDFG):
        return program
    if isinstance(program, Graph):
        return program.sdfg
    if callable(getattr(program, "to_sdfg", None)):
        try:
            sdfg = parse(program)
        except Exception as exc:  # DaCe's frontend raises many types; the cause stays chained
            name = getattr(program, "name", type(program).__name__)
            raise InvalidArgumentError(f"DaCe could not parse program '{name}': {type(exc).__name__}: {exc}",
                                       "the chained exception shows where") from exc
        if isinstance(sdfg, dace.SDFG):
            return sdfg
    raise InvalidArgumentError(
        f"expected a dace.SDFG or a @dace.program, got {type(program).__name__}",
        "wrap a Python function with @dace.program, or build a dace.SDFG",
    )


@attrs.frozen(eq=False)
class Graph:
    """An SDFG treated as a value, plus frozen metadata that passes attach (e.g. the AD interface).

    `sdfg` is borrowed for reading only; passes that edit call `editable()` and wrap the result with
    `Graph.adopt`. The purity tests compare fingerprints before and after every registered pass.

    A pipeline hands the graph one of its steps built to the next step without a copy (`_lend`): nobody
    else holds that intermediate value, so the next step's `editable()` may take its SDFG as is. The
    pipeline's input and output are never lent.
    """

    sdfg: dace.SDFG
    meta: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)))
    _fingerprint: list = attrs.field(factory=list, init=False, repr=False)  # memo cell
    _lender: list = attrs.field(factory=list, init=False, repr=False)  # the pipeline run that lends it

    @classmethod
    def of(cls, program: Any) -> "Graph":
        """Wrap a copy of a `dace.SDFG` or `@dace.program`; the argument is never modified afterwards."""
        if isinstance(program, Graph):
            return program
        sdfg = as_sdfg(program)
        if sdfg is program:
            sdfg = copy.deepcopy(sdfg)
        return cls(sdfg)

    @classmethod
    def adopt(cls, sdfg: dace.SDFG, meta: Mapping[str, Any] | None = None) -> "Graph":
        """Take ownership of an SDFG the caller built (no copy); the caller must not touch it again."""
        return cls(sdfg, meta or {})

    @property
    def fingerprint(self) -> str:
        if not self._fingerprint:
            self._fingerprint.append(fingerprint(self.sdfg))
        return self._fingerprint[0]

    def changed_since_fingerprint(self) -> bool:
        """True when someone mutated the borrowed SDFG after its fingerprint was taken."""
        return bool(self._fingerprint) and fingerprint(self.sdfg) != self._fingerprint[0]

    def editable(self) -> dace.SDFG:
        """A private deep copy for a pass to edit (the SDFG itself when a pipeline lent this value: it is an
        intermediate no one else holds, and it is not used again)."""
        if self._lender:
            self._lender.clear()
            self._fingerprint.clear()
            return self.sdfg
        return copy.deepcopy(self.sdfg)

    def _lend(self, run: object) -> None:
        """Mark this intermediate graph of pipeline run `run` as handed over (see the class docstring)."""
        self._lender[:] = [run]

    def _reclaim(self, run: object) -> None:
        """Undo `_lend` of run `run`, if it still holds (the value leaves the pipeline)."""
        if self._lender and self._lender[0] is run:
            self._lender.clear()

    def to_sdfg(self) -> dace.SDFG:
        """A copy to hand to users: what they do with it cannot reach this value."""
        return copy.deepcopy(self.sdfg)

    def with_meta(self, **updates: Any) -> "Graph":
        """The same SDFG with more metadata (the SDFG is shared: both values are immutable)."""
        new = Graph(self.sdfg, {**self.meta, **updates})
        new._fingerprint.extend(self._fingerprint)
        return new
