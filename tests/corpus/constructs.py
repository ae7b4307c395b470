"""Which DaCe constructs an SDFG contains (used to check that the corpora cover what they claim)."""

from __future__ import annotations

from collections import Counter

import dace
from dace.sdfg import nodes


def constructs(sdfg: dace.SDFG) -> Counter:
    """Counts of control-flow region kinds, node kinds and WCR memlets, recursively (nested SDFGs too)."""
    out: Counter = Counter()
    for region in sdfg.all_control_flow_regions(recursive=True):
        kind = type(region).__name__
        if kind != "SDFG":
            out[kind] += 1
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.NestedSDFG):
            out["NestedSDFG"] += 1
        elif isinstance(node, nodes.LibraryNode):
            out["LibraryNode:" + type(node).__name__] += 1
        elif isinstance(node, nodes.MapEntry):
            out["Map"] += 1
        elif isinstance(node, nodes.Tasklet):
            out["Tasklet"] += 1
        elif isinstance(node, dace.SDFGState):
            out["State"] += 1
    for edge, _ in sdfg.all_edges_recursive():
        memlet = getattr(edge.data, "wcr", None)
        if memlet is not None:
            out["WCR"] += 1
        if isinstance(edge.data, dace.InterstateEdge) and not edge.data.is_unconditional():
            out["ConditionalEdge"] += 1  # unstructured control flow (branches and loops built with the API)
    return out
