"""Normalization of conditional writes: a tasklet that assigns an output only on some paths.

DaCe's frontend turns a masked assignment `a[a <= 0.1] = 1.0` into a map whose tasklet runs
`if __in_cond: __out = 1.0` and writes `a[i]` through a *dynamic* memlet: where the condition is false,
nothing is written and the element keeps its old value. The old value is then an input the graph does not
show: reverse mode would neither store it before it is overwritten nor pass its gradient on, and
recomputation would take the map for a full definition of `a`. The pass `complete_conditional_writes` makes
the read explicit: the tasklet gets an input connector reading the element it writes, and its code starts
by assigning that old value to the output (`__out = __prev___out`), so every path assigns it and the map
reads and writes `a[i]`, an in-place update (`A[i] = f(A[i])`) like any other.

Outputs written with a write-conflict resolution are left alone (a path that writes nothing adds nothing),
and so are tasklets whose code reverse mode cannot read anyway (it reports those itself).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import dace
from dace.properties import CodeBlock
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.core.errors import NotDifferentiableError
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.core.symbolic import read_tasklet, unassigned


def _scope_chain(state: SDFGState, node: nd.Node) -> list[nd.EntryNode]:
    """The map entries around `node`, outermost first."""
    chain: list[nd.EntryNode] = []
    entry = state.entry_node(node)
    while entry is not None:
        chain.insert(0, entry)
        entry = state.entry_node(entry)
    return chain


def _partial_outputs(state: SDFGState, tasklet: nd.Tasklet) -> list:
    """Out edges of outputs written through a dynamic, plain memlet into an array outside the scope, which
    the code leaves unassigned on some path."""
    if tasklet.language != dace.dtypes.Language.Python:
        return []
    edges = [e for e in state.out_edges(tasklet)
             if not e.data.is_empty() and e.data.dynamic and e.data.wcr is None]
    if not edges:
        return []
    constants = {str(s) for s in state.free_symbols} | set(state.sdfg.symbols)
    for entry in _scope_chain(state, tasklet):
        constants |= set(entry.map.params)
    try:
        meaning = read_tasklet(tasklet.code.as_string, tasklet.in_connectors, tasklet.out_connectors,
                               constants=constants)
    except NotDifferentiableError:
        return []
    scope = state.scope_dict()
    found = []
    for e in edges:
        value = meaning.outputs.get(e.src_conn)
        if value is None or unassigned(e.src_conn) not in value.free_symbols:
            continue
        target = state.memlet_path(e)[-1].dst
        if isinstance(target, nd.AccessNode) and scope[target] is None:
            found.append(e)
    return found


def _complete(state: SDFGState, tasklet: nd.Tasklet, edge) -> None:
    conn = edge.src_conn
    prev = f"__prev_{conn}"
    while prev in tasklet.in_connectors or prev in tasklet.out_connectors:
        prev = "_" + prev
    array = edge.data.data
    tasklet.add_in_connector(prev)
    tasklet.code = CodeBlock(f"{conn} = {prev}\n{tasklet.code.as_string}", tasklet.language)
    memlet = dace.Memlet(data=array, subset=copy.deepcopy(edge.data.subset))
    state.add_memlet_path(state.add_read(array), *_scope_chain(state, tasklet), tasklet, dst_conn=prev,
                          memlet=memlet)


def _sites(sdfg: dace.SDFG) -> list:
    return [(state, node, e) for state in sdfg.states() for node in state.nodes() if isinstance(node, nd.Tasklet)
            for e in _partial_outputs(state, node)]


@register_pass
@attrs.frozen
class CompleteConditionalWrites(RewritePass):
    """Outputs a tasklet assigns on some paths only read the element's old value explicitly (module doc)."""

    name: ClassVar[str] = "complete_conditional_writes"

    def matches(self, sdfg: dace.SDFG) -> list:
        return _sites(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _complete(*match)
