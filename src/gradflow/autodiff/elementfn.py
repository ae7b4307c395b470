"""An operation's per-element function, composed symbolically.

A top-level tasklet, or a map whose body is a DAG of tasklets and scope-local scalars, computes each output
element as a function of single input elements. `element_function` composes the body into one SymPy
expression per output port over one symbol per input port, so reversing it is one tasklet that SymPy
differentiates, however many tasklets the forward body had.
"""

from __future__ import annotations

import attrs
import dace
import networkx as nx
import sympy
from dace import dtypes, subsets
from dace.frontend.operations import detect_reduction_type
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import parse_tasklet


@attrs.frozen
class Port:
    """One element of an outer array that the operation reads or writes."""

    symbol: sympy.Symbol
    array: str
    subset: str  # in terms of the map parameters
    wcr: str | None = None  # write-conflict resolution of a write port ("sum"), None for plain writes


@attrs.frozen(eq=False)
class ElementFunction:
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    exprs: tuple[sympy.Expr, ...]  # one per output port, over the input port symbols
    map_entry: nd.MapEntry | None
    label: str


def _wcr_kind(wcr: str | None) -> str | None:
    """"sum" for an additive write-conflict resolution, else the reduction's name (not differentiated)."""
    if wcr is None:
        return None
    kind = detect_reduction_type(wcr)
    return "sum" if kind == dtypes.ReductionType.Sum else str(kind)


def _subset_str(memlet) -> str:
    subset = memlet.subset
    if subset is None:
        raise NotDifferentiableError(f"memlet {memlet} has no subset")
    if isinstance(subset, subsets.Range) and subset.num_elements() != 1:
        raise NotDifferentiableError(
            f"memlet {memlet} moves {subset.num_elements()} elements into a tasklet; "
            "only element-wise tasklets are differentiated"
        )
    return str(subset)


def _topological(state: SDFGState, nodes: list[nd.Node]) -> list[nd.Node]:
    inside = set(nodes)
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((e.src, e.dst) for n in nodes for e in state.out_edges(n) if e.dst in inside)
    return list(nx.lexicographical_topological_sort(g, key=lambda n: state.node_id(n)))


def element_function(state: SDFGState, members: list[nd.Node]) -> ElementFunction:
    """Compose the element function of an operation: a map scope, or top-level tasklets wired together."""
    entries = [n for n in members if isinstance(n, nd.MapEntry) and state.entry_node(n) is None]
    head = entries[0] if entries else members[0]
    where = f"'{head}' in state '{state.label}'"
    if entries:
        entry, exit_ = head, state.exit_node(head)
        body = list(state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes())
    else:
        entry, exit_ = None, None
        body = list(members)
    order = _topological(state, body)
    # Names code may read besides its connectors: symbols. The state's own symbols suffice (the SDFG-wide
    # `free_symbols` walks the whole graph, which grows as reverse mode builds the backward sweep).
    constants = set(map(str, state.free_symbols)) | set(state.sdfg.symbols)
    if entry is not None:
        constants |= set(entry.map.params)
    for n in body:
        if not isinstance(n, (nd.Tasklet, nd.AccessNode)):
            raise NotDifferentiableError(
                f"{where}: the map body holds {type(n).__name__} '{n}'; only tasklets and local scalars are "
                "differentiated inside a map",
                "nested maps that are not perfectly nested are not supported yet",
            )

    inputs: list[Port] = []
    outputs: list[Port] = []
    exprs: list[sympy.Expr] = []
    values: dict[tuple[nd.Node, str | None], sympy.Expr] = {}
    local: dict[nd.AccessNode, sympy.Expr] = {}

    def source_value(edge) -> sympy.Expr | None:
        if edge.data.is_empty():
            return None
        if edge.src is entry or (entry is None and isinstance(edge.src, nd.AccessNode)):
            port = Port(sympy.Symbol(f"__in{len(inputs)}", real=True), edge.data.data, _subset_str(edge.data))
            inputs.append(port)
            return port.symbol
        if isinstance(edge.src, nd.AccessNode):
            if edge.src not in local:
                raise NotDifferentiableError(f"{where}: local '{edge.src.data}' is read before it is written")
            return local[edge.src]
        return values[(edge.src, edge.src_conn)]

    def sink(edge, value: sympy.Expr) -> None:
        if edge.data.is_empty():
            return
        if edge.dst is exit_ or (exit_ is None and isinstance(edge.dst, nd.AccessNode)):
            outputs.append(Port(sympy.Symbol(f"__out{len(outputs)}", real=True), edge.data.data,
                                _subset_str(edge.data), _wcr_kind(edge.data.wcr)))
            exprs.append(value)
        elif isinstance(edge.dst, nd.AccessNode):
            if edge.data.wcr is not None:
                raise NotDifferentiableError(f"{where}: accumulation into scope-local '{edge.dst.data}'")
            local[edge.dst] = value
        else:
            values[(edge.dst, edge.dst_conn)] = value

    for node in order:
        if isinstance(node, nd.AccessNode):
            for e in state.in_edges(node):
                if e.src is entry and not e.data.is_empty():
                    local[node] = source_value(e)  # an element copied into a scope-local scalar
            if node in local:
                for e in state.out_edges(node):
                    sink(e, local[node])
            continue
        env = {}
        for e in state.in_edges(node):
            v = source_value(e)
            if v is not None and e.dst_conn is not None:
                env[e.dst_conn] = v
        if node.language != dtypes.Language.Python:
            raise NotDifferentiableError(f"{where}: tasklet '{node}' is written in {node.language.name}, not Python")
        produced = parse_tasklet(node.code.as_string, node.in_connectors, node.out_connectors, f"tasklet '{node}'",
                                 constants=constants)
        produced = {k: v.xreplace({sympy.Symbol(c, real=True): env[c] for c in env}) for k, v in produced.items()}
        for e in state.out_edges(node):
            if e.data.is_empty():
                continue
            if e.src_conn not in produced:
                raise NotDifferentiableError(f"{where}: tasklet '{node}' never assigns output '{e.src_conn}'")
            sink(e, produced[e.src_conn])
    return ElementFunction(tuple(inputs), tuple(outputs), tuple(exprs), entry, str(head))

