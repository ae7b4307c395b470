"""Zero tangents: what an operation writes from values that carry none."""

from __future__ import annotations

import copy

import dace
from dace import subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.autodiff.emit import subset_elements
from gradflow.autodiff.tangent.mirror import StateMirror, tangent_connector


def zero_subset(state: SDFGState, node: nd.AccessNode, subset: subsets.Range) -> None:
    """node's array[subset] = 0, written into `node`."""
    ranges, _, element = subset_elements(subset, "__z")
    state.add_mapped_tasklet(f"zero_{node.data}", ranges, {}, "__o = 0",
                             {"__o": dace.Memlet(f"{node.data}[{element}]")}, output_nodes={node.data: node},
                             external_edges=True)


def zero_path(state: SDFGState, mirror: StateMirror, edge) -> None:
    """The tangent of what `edge` carries out of a scope-local node without tangent into an array with one:
    zero, from a tasklet in the same scope, along the tangent of the rest of the edge's path."""
    path = state.memlet_path(edge)
    first = path[0]
    entry = state.entry_node(first.src)
    zero = state.add_tasklet(f"zero_tangent_{first.src.data}", {}, {"__z"}, "__z = 0")
    if entry is not None:
        state.add_nedge(entry, zero, dace.Memlet())
    dst_conn = tangent_connector(first.dst_conn) if first.dst_conn is not None else None
    if dst_conn is not None and dst_conn not in first.dst.in_connectors:
        first.dst.add_in_connector(dst_conn)
    subset = copy.deepcopy(first.data.get_dst_subset(first, state))
    twin = dace.Memlet(data=mirror.tangents[path[-1].data.data], subset=subset, wcr=first.data.wcr)
    state.add_edge(zero, "__z", mirror.node(first.dst), dst_conn, twin)
    for hop in path[1:]:
        mirror.edge(hop)
