"""The tangent of a growable stack's heap push and pop (forward over reverse through a loop gradflow could
not bound: a while loop, a for loop counted from data).

The reverse program saves values on such a stack through a one-item staging array and two C++ tasklets
(`autodiff/tape.py`): a push appends the staging array to a heap buffer, a pop takes the top item back.
Its values pass through the heap, where the tangent engine cannot follow them, so each push that appends
a varied staging array also appends its tangent (same item size, right after it), and the matching pop
takes the tangent first, then the value: one heap, one record, pops still in the reverse order of pushes.
"""

from __future__ import annotations

import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.autodiff.tangent.mirror import StateMirror, tangent_connector
from gradflow.autodiff.tape import heap_call, heap_code


def _staging_edge(state: SDFGState, node: nd.Tasklet, kind: str):
    edges = state.in_edges(node) if kind == "push" else state.out_edges(node)
    return next(e for e in edges if (e.dst_conn if kind == "push" else e.src_conn) == "__item")


def varied_push(state: SDFGState, node: nd.Node, mirror: StateMirror) -> bool:
    """Whether `node` is a heap push of a staging array that has a tangent."""
    return heap_call(node) == "push" and mirror.has_tangent(_staging_edge(state, node, "push").data.data)


def dual_heap_call(state: SDFGState, node: nd.Tasklet, mirror: StateMirror) -> None:
    """The push (pop) `node` also appends (takes back) the tangent of its staging array."""
    kind = heap_call(node)
    assert kind is not None, f"'{node.label}' is not a heap push or pop"
    edge = _staging_edge(state, node, kind)
    if not mirror.has_tangent(edge.data.data):
        return
    scalar = state.sdfg.arrays[edge.data.data].total_size == 1
    twin = tangent_connector("__item")  # the connector `mirror.edge` gives the tangent
    node.code = dace.properties.CodeBlock(heap_code(kind, [("__item", scalar), (twin, scalar)]),
                                          dace.Language.CPP)
    mirror.edge(edge)
