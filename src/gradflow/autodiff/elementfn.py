"""An operation's per-element function, composed symbolically.

A top-level tasklet, or a map whose body is a DAG of tasklets and scope-local scalars, computes each output
element as a function of single input elements. `element_function` composes the body into one SymPy
expression per output port over one symbol per input port, so reversing it is one tasklet that SymPy
differentiates, however many tasklets the forward body had.

A port is *indirect* when the code chooses the element through an index it computes (`x = arr[idx]`,
`arr[idx] = v`, a gather or scatter): its memlet covers the array, and `Port.index` is the element's index
as an expression over other ports (the index values read from data) and constants.
"""

from __future__ import annotations

import attrs
import networkx as nx
import numpy as np
import sympy
from dace import dtypes, subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion, SDFGState

from gradflow.analysis.loops import describe_loop
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.names import tape_array
from gradflow.core.symbolic import UNASSIGNED, Element, read_tasklet, stored_as
from gradflow.core.wcr import reduction_type


def _enclosing_loop(state: SDFGState) -> LoopRegion | None:
    region = state.parent_graph
    while region is not None and not isinstance(region, LoopRegion) and region is not state.sdfg:
        region = region.parent_graph
    return region if isinstance(region, LoopRegion) else None


def _pushing_loop(state: SDFGState, node: nd.Tasklet) -> LoopRegion | None:
    """The forward loop whose iterations push onto the tape `node` pushes or pops (a pop runs in the
    loop's reversal, whose counter hides whether the loop was a while loop)."""
    tapes = {e.data.data for e in state.all_edges(node) if e.data.data and tape_array(e.data.data)}
    for other in state.sdfg.states():
        if not any(n.data in tapes for n in other.data_nodes()):
            continue
        loop = _enclosing_loop(other)
        if loop is not None and "reverse_" not in loop.label:
            return loop
    return None


def foreign_code_hint(state: SDFGState, node: nd.Tasklet) -> str:
    """What to do about a tasklet in another language than Python that gradflow itself wrote into a program
    differentiated again ('' for one the user wrote): a growable tape's push or pop (a while loop without
    a bound, or a for loop whose trip count is read from data), or a tasklet of the optimizer."""
    if any(e.data.data and tape_array(e.data.data) for e in state.all_edges(node)):
        loop = _pushing_loop(state, node)
        if loop is not None and loop.loop_variable:  # a counted loop: only a data bound makes a tape growable
            return (f"it is the C++ code of a growable tape, kept for {describe_loop(loop)}, whose trip count is "
                    "read from data: pass the trip count as a scalar argument (a size, which gives the tape a "
                    "fixed size)")
        where = f" for {describe_loop(loop)}" if loop is not None else ""
        return (f"it is the C++ code of a growable tape{where} (a while loop without a bound): give the while "
                "loop a bound when building the gradient program (forwarding=gradflow.STORE_ALL.with_loop_bounds"
                "(...))")
    if "gradflow_" in node.label:  # the optimizer's tasklets are named after the accumulator they clear or fold
        return ("gradflow's optimizer wrote it: differentiate the gradient program built with optimize=False "
                "(and optimize the second-order program instead)")
    return ""


@attrs.frozen
class Port:
    """One element of an outer array that the operation reads or writes."""

    symbol: sympy.Symbol
    array: str
    subset: str  # in terms of the map parameters
    wcr: str | None = None  # write-conflict resolution of a write port ("sum"), None for plain writes
    #: indirect port: the element's index in the array, over other ports' symbols and constants (`subset`
    #: is then the part of the array the memlet covers)
    index: tuple[sympy.Expr, ...] | None = None

    @property
    def indirect(self) -> bool:
        return self.index is not None

    @property
    def key(self) -> tuple:
        """What identifies the element: array and subset, or array and index."""
        return (self.array, self.subset if self.index is None else self.index)


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
    kind = reduction_type(wcr)
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
    composer = _Composer(state, entry, exit_, where)
    for node in order:
        if isinstance(node, nd.AccessNode):
            composer.local_scalar(node)
        else:
            composer.tasklet(node, constants)
    _check_writes(where, composer.outputs)
    return ElementFunction(tuple(composer.inputs), tuple(composer.outputs), tuple(composer.exprs), entry,
                           str(head))


@attrs.define
class _Composer:
    """The element function of one operation as it is composed, node by node in topological order: the
    ports read and written so far, the expression of each output port, the value on each tasklet
    connector and in each scope-local scalar."""

    state: SDFGState
    entry: nd.MapEntry | None
    exit_: nd.MapExit | None
    where: str
    inputs: list[Port] = attrs.field(factory=list)
    outputs: list[Port] = attrs.field(factory=list)
    exprs: list[sympy.Expr] = attrs.field(factory=list)
    values: dict[tuple[nd.Node, str | None], sympy.Expr] = attrs.field(factory=dict)
    local: dict[nd.AccessNode, sympy.Expr] = attrs.field(factory=dict)

    def _from_outside(self, edge) -> bool:
        return edge.src is self.entry or (self.entry is None and isinstance(edge.src, nd.AccessNode))

    def _to_outside(self, edge) -> bool:
        return edge.dst is self.exit_ or (self.exit_ is None and isinstance(edge.dst, nd.AccessNode))

    def source_value(self, edge) -> sympy.Expr | None:
        """The value an edge carries: a new input port, a scope-local scalar, or a tasklet's output."""
        if edge.data.is_empty():
            return None
        if self._from_outside(edge):
            port = Port(sympy.Symbol(f"__in{len(self.inputs)}", real=True), edge.data.data, _subset_str(edge.data))
            self.inputs.append(port)
            return port.symbol
        if isinstance(edge.src, nd.AccessNode):
            if edge.src not in self.local:
                raise NotDifferentiableError(f"{self.where}: local '{edge.src.data}' is read before it is written")
            return self.local[edge.src]
        return self.values[(edge.src, edge.src_conn)]

    def sink(self, edge, value: sympy.Expr) -> None:
        """`value` leaves along `edge`: to an output port, a scope-local scalar or a tasklet's input."""
        if edge.data.is_empty():
            return
        value = _through_types(self.state, edge, value)
        if self._to_outside(edge):
            self.outputs.append(Port(sympy.Symbol(f"__out{len(self.outputs)}", real=True), edge.data.data,
                                     _subset_str(edge.data), _wcr_kind(edge.data.wcr)))
            self.exprs.append(value)
        elif isinstance(edge.dst, nd.AccessNode):
            if edge.data.wcr is not None:
                raise NotDifferentiableError(f"{self.where}: accumulation into scope-local '{edge.dst.data}'")
            self.local[edge.dst] = value
        else:
            self.values[(edge.dst, edge.dst_conn)] = value

    def local_scalar(self, node: nd.AccessNode) -> None:
        state = self.state
        for e in state.in_edges(node):
            if e.src is self.entry and not e.data.is_empty():
                self.local[node] = self.source_value(e)  # an element copied into a scope-local scalar
        if node in self.local:
            for e in state.out_edges(node):
                self.sink(e, self.local[node])

    def tasklet(self, node: nd.Tasklet, constants: set[str]) -> None:
        state, where = self.state, self.where
        if node.language != dtypes.Language.Python:
            raise NotDifferentiableError(f"{where}: tasklet '{node}' is written in {node.language.name}, not Python",
                                         foreign_code_hint(state, node))
        meaning = read_tasklet(node.code.as_string, node.in_connectors, node.out_connectors, f"tasklet '{node}'",
                               constants=constants)
        indexed_in = {el.conn for el in meaning.reads.values()}
        indexed_out = {w.element.conn for w in meaning.writes}
        array_edges = {}
        subst = {}
        for e in state.in_edges(node):
            if e.data.is_empty() or e.dst_conn is None:
                continue
            if e.dst_conn in indexed_in:
                array_edges[e.dst_conn] = e
                continue
            v = self.source_value(e)
            if v is not None:
                subst[sympy.Symbol(e.dst_conn, real=True)] = v
        for e in state.out_edges(node):
            if e.src_conn in indexed_out:
                array_edges[e.src_conn] = e
        tasklet = f"tasklet '{node}'"
        for symbol, el in meaning.reads.items():
            e = array_edges.get(el.conn)
            outer = e is not None and self._from_outside(e)
            port = _indirect_port(state, where, tasklet, e, el, subst, self.inputs, outer, "in")
            self.inputs.append(port)
            subst[symbol] = port.symbol
        subst = _numeric(subst)
        produced = {k: v.xreplace(subst) for k, v in meaning.outputs.items()}
        _check_arrays_indexed(tasklet, indexed_in | indexed_out, [*produced.values(), *subst.values()])
        for e in state.out_edges(node):
            if e.data.is_empty() or e.src_conn in indexed_out:
                continue
            if e.src_conn not in produced:
                raise NotDifferentiableError(f"{where}: tasklet '{node}' never assigns output '{e.src_conn}'")
            self.sink(e, _settle_unassigned(where, tasklet, e, produced[e.src_conn]))
        for write in meaning.writes:
            self._indexed_write(write, array_edges[write.element.conn], subst, tasklet)

    def _indexed_write(self, write, e, subst: dict, tasklet: str) -> None:
        """A write through an index the tasklet computes (`A[idx[i]] = v`, perhaps under a condition)."""
        value, condition = write.value.xreplace(subst), write.condition.xreplace(subst)
        wcr = _wcr_kind(e.data.wcr)
        if condition != sympy.true and wcr != "sum" and not _carries_gradient(self.state, e.data.data):
            return  # e.g. a failed index check recording itself in an int64 error flag
        if condition != sympy.true:
            if wcr != "sum":
                raise NotDifferentiableError(
                    f"{self.where}: {tasklet} overwrites an element chosen by an index only when {condition}",
                    "write unconditionally, or accumulate (a write-conflict sum)")
            value = sympy.Piecewise((value, condition), (0, True))
        port = _indirect_port(self.state, self.where, tasklet, e, write.element, subst, self.outputs,
                              self._to_outside(e), "out", e.data.wcr)
        self.outputs.append(port)
        self.exprs.append(value)


def _through_types(state: SDFGState, edge, value: sympy.Expr) -> sympy.Expr:
    """`value` as it arrives at the end of `edge`: a conversion to an integer type on the way (the tasklet's
    output connector, the destination's connector or data) truncates it, and no derivative flows through."""
    types = []
    if isinstance(edge.src, nd.Tasklet):
        types.append(edge.src.out_connectors.get(edge.src_conn))
    if isinstance(edge.dst, nd.Tasklet):
        types.append(edge.dst.in_connectors.get(edge.dst_conn))
    elif isinstance(edge.dst, nd.AccessNode):
        types.append(edge.dst.desc(state.sdfg).dtype)
    for dtype in types:
        if isinstance(dtype, dtypes.typeclass) and not isinstance(dtype, (dtypes.pointer, dtypes.vector)) \
                and dtype.type is not None:
            value = stored_as(value, dtype)
    return value


def _carries_gradient(state: SDFGState, array: str) -> bool:
    """Whether values of `array` can carry a gradient at all (floating point); writes into other arrays
    (integer indices, error flags) are no part of any element's derivative."""
    return np.dtype(state.sdfg.arrays[array].dtype.type).kind in "fc"


def _indirect_port(state: SDFGState, where: str, tasklet: str, edge, element: Element, subst: dict,
                   ports: list[Port], outer: bool, prefix: str, wcr: str | None = None) -> Port:
    """The port of an element that the code chooses through an index (`conn[index]`), in array coordinates.
    `outer`: the edge connects the tasklet to the operation's boundary (not to a scope-local node)."""
    if edge is None:
        raise NotDifferentiableError(f"{where}: {tasklet} indexes '{element.conn}', which no memlet connects")
    if not outer:
        raise NotDifferentiableError(f"{where}: {tasklet} indexes '{element.conn}', a scope-local array")
    memlet = edge.data
    desc = state.sdfg.arrays[memlet.data]
    subset = memlet.subset
    rank = len(desc.shape)
    if not isinstance(subset, subsets.Range) or subset.dims() != rank or len(element.index) != rank:
        raise NotDifferentiableError(
            f"{where}: {tasklet} indexes '{element.conn}' with {len(element.index)} indices through the memlet "
            f"{memlet}; only memlets over all {len(desc.shape)} dimensions of '{memlet.data}' are supported")
    index = []
    for (begin, _end, step), i in zip(subset, element.index):
        if step != 1:
            raise NotDifferentiableError(f"{where}: {tasklet} indexes through the strided memlet {memlet}")
        offset = sympy.sympify(str(begin))
        index.append(i.xreplace(subst) + offset if offset != 0 else i.xreplace(subst))
    symbol = sympy.Symbol(f"__{prefix}{len(ports)}", real=True)
    return Port(symbol, memlet.data, str(subsets.Range.from_array(desc)), _wcr_kind(wcr), tuple(index))


_TRUTH = (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanFunction, sympy.logic.boolalg.BooleanAtom)


def _numeric(subst: dict) -> dict:
    """`subst` with truth values (a comparison another tasklet of the scope computed, e.g. a mask) as the
    numbers 1 and 0 a tasklet reads: SymPy would otherwise decide `Ne(x > y, 0)` structurally (always true)."""
    return {k: sympy.Piecewise((1, v), (0, True)) if isinstance(v, _TRUTH) else v
            for k, v in subst.items()}


def _check_writes(where: str, outputs: list[Port]) -> None:
    """An element overwritten through an index may be any element of its array: no other write to that array
    may share the operation (which one lands last would depend on the data)."""
    for port in outputs:
        if port.indirect and port.wcr is None:
            others = [p for p in outputs if p is not port and p.array == port.array]
            if others:
                raise NotDifferentiableError(
                    f"{where}: overwrites an element of '{port.array}' chosen by an index and writes '{port.array}' "
                    "again in the same operation; which write lands last depends on the data",
                    "write the elements in separate operations, or accumulate (a write-conflict sum)")


def _check_arrays_indexed(tasklet: str, conns: set[str], exprs) -> None:
    """An array connector may only be read through an index."""
    for expr in exprs:
        bare = sorted(s.name for s in expr.free_symbols if s.name in conns)
        if bare:
            raise NotDifferentiableError(f"{tasklet} uses the array connector '{bare[0]}' without an index")


def _settle_unassigned(where: str, tasklet: str, edge, value: sympy.Expr) -> sympy.Expr:
    """An output the code leaves unassigned on some path. Through a dynamic memlet DaCe writes only where the
    code assigns: a write-conflict sum then adds nothing there, a plain write leaves the element's old value
    (which `complete_conditional_writes` makes an explicit input). Through any other memlet DaCe writes the
    connector's uninitialized value: undefined."""
    marks = [s for s in value.free_symbols if s.name.startswith(UNASSIGNED)]
    if not marks:
        return value
    if edge.data.dynamic and _wcr_kind(edge.data.wcr) == "sum":
        return value.xreplace({m: sympy.Integer(0) for m in marks})
    if edge.data.dynamic and edge.data.wcr is None:
        raise NotDifferentiableError(
            f"{where}: {tasklet} leaves output '{edge.src_conn}' unassigned on some path (the element then keeps "
            "its old value)",
            "normalize the program first (NORMALIZE's complete_conditional_writes reads the old value explicitly)")
    raise NotDifferentiableError(
        f"{where}: {tasklet} leaves output '{edge.src_conn}' unassigned on some path, and its memlet is not "
        "dynamic (or resolves conflicts other than by a sum): the element gets an undefined value there",
        "assign the output on every path, or make its memlet dynamic")
