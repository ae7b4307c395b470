"""The tangent counterpart of a state's dataflow: one tangent access node per access node of a varied
array, and the memlet paths of the tangents laid next to the values' through the same map scopes."""

from __future__ import annotations

import copy
from typing import Mapping

import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.core.errors import NotDifferentiableError

#: the prefix of a tangent connector of a tasklet or library node (and inside map connectors' names)
TAN = "gft_"


def tangent_connector(conn: str) -> str:
    """The connector that carries the tangent of connector `conn` of a tasklet, map scope or library node."""
    for scope in ("IN_", "OUT_"):
        if conn.startswith(scope):
            return scope + TAN + conn[len(scope):]
    return TAN + conn


class StateMirror:
    """Tangent access nodes and edges of one state, each made once.

    `tangents` maps an array to its tangent array (only varied arrays have one); `connectors` maps a
    (node, connector) pair to the tangent connector when it is not `tangent_connector(conn)` (a nested
    SDFG's connectors are the names of its inner tangent arrays)."""

    def __init__(self, state: SDFGState, tangents: Mapping[str, str],
                 connectors: Mapping[tuple[int, str], str] | None = None) -> None:
        self.state = state
        self.tangents = tangents
        self.connectors = dict(connectors or {})
        self._nodes: dict[nd.AccessNode, nd.AccessNode] = {}
        self._edges: set[int] = set()

    def has_tangent(self, array: str | None) -> bool:
        return array is not None and array in self.tangents

    def node(self, node: nd.Node) -> nd.Node:
        """The tangent access node of an access node (made once); any other node is its own counterpart."""
        if not isinstance(node, nd.AccessNode):
            return node
        if node not in self._nodes:
            self._nodes[node] = self.state.add_access(self.tangents[node.data])
        return self._nodes[node]

    def connector(self, node: nd.Node, conn: str | None) -> str | None:
        if conn is None or isinstance(node, nd.AccessNode):
            return conn
        return self.connectors.get((id(node), conn), tangent_connector(conn))

    def memlet(self, memlet: dace.Memlet) -> dace.Memlet:
        """`memlet` over the tangent of its array (subsets, write-conflict and volume kept)."""
        twin = copy.deepcopy(memlet)
        twin.data = self.tangents[memlet.data]
        return twin

    def edge(self, edge) -> None:
        """The tangent of one edge (once): between the counterparts of its ends, on tangent connectors."""
        if id(edge) in self._edges:
            return
        self._edges.add(id(edge))
        src, dst = self.node(edge.src), self.node(edge.dst)
        src_conn, dst_conn = self.connector(edge.src, edge.src_conn), self.connector(edge.dst, edge.dst_conn)
        for node, conn, add in ((src, src_conn, "out"), (dst, dst_conn, "in")):
            if conn is None or isinstance(node, nd.AccessNode):
                continue
            have = node.out_connectors if add == "out" else node.in_connectors
            if conn not in have:
                original = edge.src if add == "out" else edge.dst
                kind = original.out_connectors if add == "out" else original.in_connectors
                dtype = kind.get(edge.src_conn if add == "out" else edge.dst_conn)
                if isinstance(node, (nd.EntryNode, nd.ExitNode)):
                    dtype = None
                # (a nested SDFG's in/out array has one connector name on both sides: forced)
                (node.add_out_connector if add == "out" else node.add_in_connector)(conn, dtype, force=True)
        self.state.add_edge(src, src_conn, dst, dst_conn, self.memlet(edge.data))

    def path(self, edge) -> None:
        """The tangent of the whole memlet path through `edge` (from its source access node, through the
        map entries, or to its destination access node through the map exits)."""
        for hop in self.state.memlet_path(edge):
            if not self.has_tangent(hop.data.data):
                raise NotDifferentiableError(
                    f"state '{self.state.label}': the memlet {hop.data} carries a value whose array has no tangent")
            self.edge(hop)
