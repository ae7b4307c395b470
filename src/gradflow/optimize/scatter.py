"""`own_scatter_writes`: stencil adjoints accumulate without atomics.

The adjoint of a stencil `B[i] = c * (A[i-1] + A[i] + A[i+1])` is a scatter: iteration `i` adds into
`gA[i-1]`, `gA[i]` and `gA[i+1]`. Each of those writes alone is owned by its iteration (`i + k` is a
different element for every `i`), but together neighbouring iterations hit the same element, so DaCe's
code generator makes every one of them an atomic update: on doubles a compare-and-swap loop, on one thread
as well, and a loop the C++ compiler cannot vectorize. Most of the backward time of the stencil kernels
went there.

This pass splits such a map into one map per class of writes whose ranges over the whole map are pairwise
disjoint (for a stencil, one per offset): the copies compute the same body and keep one class of the
accumulations each, the original keeps the first class and everything else it writes; a tasklet that leads
to none of a map's kept writes is left out of it (`_prune_dead`). In each map every
iteration owns the element it adds to, so the sums are plain `+=` and the maps stay parallel. Writes that
never meet (the four gate blocks `g[b, j + 64 k]` of an LSTM row) stay in one map: copying the body for
them would repeat its work, transcendentals included, once per block.
Each copy writes through an access node of its own (DaCe makes writes into one access node atomic when
their subsets intersect, whichever maps they come from), which an empty memlet orders before the original:
the copies read what the original reads before it overwrites any of it (reverse mode clears an adjoint
after reading it), and whatever reads the array after the original sees every sum.

Several sums of one tasklet into the same element in each iteration (the adjoints of two reads of
`B[i, j]`) are first added in the tasklet and written once: DaCe makes two writes into one element from
one map atomic, and the classes below would copy the body for each of them.

Applies to a top-level parallel map whose body is tasklets and scope-local data, whose conflicting
writes are sums into an array the map does not read or write otherwise, each at an index that is a map
parameter plus an offset in one dimension per parameter (so each write alone is injective).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import dace
import sympy as sp
from dace import dtypes, subsets, symbolic
from dace.frontend.operations import detect_reduction_type
from dace.memlet import Memlet
from dace.properties import CodeBlock
from dace.sdfg import nodes as nd
from dace.sdfg import propagation
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.names import private_copies
from gradflow.core.passes import Pass, PassResult, register_pass


def _owned(subset, params: set[sp.Symbol]) -> bool:
    """True when the index is a single element and every map parameter appears alone, plus an offset, in
    exactly one dimension (distinct iterations then write distinct elements)."""
    seen: set[sp.Symbol] = set()
    for begin, end, _step in subset.ndrange():
        if symbolic.simplify(begin - end) != 0:
            return False
        used = set(symbolic.pystr_to_symbolic(str(begin)).free_symbols) & params
        if not used:
            continue
        if len(used) > 1:
            return False
        p = used.pop()
        if p in seen or p in sp.sympify(begin - p).free_symbols:
            return False
        seen.add(p)
    return seen == params


def _is_sum(memlet: Memlet) -> bool:
    try:
        return detect_reduction_type(memlet.wcr) == dtypes.ReductionType.Sum
    except Exception:  # a WCR DaCe cannot classify is left alone
        return False


def _elementwise(state: dace.SDFGState, entry: nd.MapEntry) -> list[nd.Node] | None:
    body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    if all(isinstance(n, (nd.Tasklet, nd.AccessNode)) for n in body):
        return body
    return None


def _classes(state: dace.SDFGState, entry: nd.MapEntry, edges: list) -> list[list]:
    """`edges` (sums into one array) in classes whose members write pairwise disjoint ranges over the whole
    map, first fit in order; the first class stays with the original map. Disjoint writes into one array,
    such as the four gate blocks of an LSTM row, share a map without atomics (DaCe's code generator
    checks the same propagated ranges), so copying the body for them would only repeat its work."""
    outer = [propagation.propagate_memlet(state, e.data, entry, False).subset for e in edges]
    classes: list[list[int]] = []
    for i in range(len(edges)):
        for members in classes:
            if all(subsets.intersects(outer[i], outer[j]) is False for j in members):
                members.append(i)
                break
        else:
            classes.append([i])
    return [[edges[i] for i in members] for members in classes]


def _conflicts(state: dace.SDFGState, entry: nd.MapEntry) -> list[list[list]]:
    """Per array, the map's sum accumulations that conflict only with each other, in classes of writes
    that may share a map (`_classes`); only arrays that need more than one class."""
    exit_ = state.exit_node(entry)
    params = {symbolic.pystr_to_symbolic(p) for p in entry.map.params}
    read = {e.data.data for e in state.in_edges(entry) if e.data.data is not None}
    read |= {n.data for n in _elementwise(state, entry) if isinstance(n, nd.AccessNode)}
    groups: dict[str, list] = {}
    plain: set[str] = set()
    for e in state.in_edges(exit_):
        if e.data.data is None:
            continue
        if e.data.wcr is None:
            plain.add(e.data.data)
        else:
            groups.setdefault(e.data.data, []).append(e)
    found = []
    for data, edges in groups.items():
        if len(edges) < 2 or data in read or data in plain:
            continue
        outer = [e for e in state.out_edges(exit_) if e.data.data == data]
        if (all(_is_sum(e.data) and not e.data.dynamic and _owned(e.data.subset, params) for e in edges)
                and all(isinstance(e.dst, nd.AccessNode) for e in outer)):
            classes = _classes(state, entry, edges)
            if len(classes) > 1:
                found.append(classes)
    return found


def _same_element_sums(state: dace.SDFGState, entry: nd.MapEntry) -> list[list]:
    """Groups of two or more sums that one Python tasklet of the map writes into the same element of an
    array in each iteration (the adjoints of two reads of `B[i, j]`), through connectors used only there."""
    exit_ = state.exit_node(entry)
    params = {symbolic.pystr_to_symbolic(p) for p in entry.map.params}
    groups: dict[tuple, list] = {}
    for e in state.in_edges(exit_):
        if (e.data.data is not None and e.data.wcr is not None and isinstance(e.src, nd.Tasklet)
                and e.src.language == dtypes.Language.Python and _is_sum(e.data) and not e.data.dynamic
                and _owned(e.data.subset, params)
                and len(list(state.out_edges_by_connector(e.src, e.src_conn))) == 1):
            groups.setdefault((id(e.src), e.data.data, str(e.data.subset)), []).append(e)
    return [edges for edges in groups.values() if len(edges) > 1]


def _combine(state: dace.SDFGState, entry: nd.MapEntry, edges: list) -> None:
    """One sum in place of `edges`: their tasklet adds the values into the first one's output, and the
    others become local variables of its code."""
    exit_ = state.exit_node(entry)
    tasklet = edges[0].src
    first, others = edges[0].src_conn, [e.src_conn for e in edges[1:]]
    tasklet.code = CodeBlock(f"{tasklet.code.as_string}\n{first} = {' + '.join([first, *others])}",
                             dtypes.Language.Python)
    for e in edges[1:]:
        state.remove_edge(e)
        tasklet.remove_out_connector(e.src_conn)
        if any(x.dst_conn == e.dst_conn for x in state.in_edges(exit_)):
            continue
        out_conn = "OUT_" + e.dst_conn[len("IN_"):]
        for x in [x for x in state.out_edges(exit_) if x.src_conn == out_conn]:
            state.remove_edge(x)
            if state.degree(x.dst) == 0:
                state.remove_node(x.dst)
        exit_.remove_in_connector(e.dst_conn)
        exit_.remove_out_connector(out_conn)


def _parallel_elementwise_maps(state: dace.SDFGState) -> list[nd.MapEntry]:
    return [n for n in state.nodes()
            if isinstance(n, nd.MapEntry) and state.entry_node(n) is None
            and n.map.schedule != dtypes.ScheduleType.Sequential and _elementwise(state, n) is not None]


def _candidates(state: dace.SDFGState) -> list[tuple[nd.MapEntry, list[list]]]:
    found = []
    for node in state.nodes():
        if (isinstance(node, nd.MapEntry) and state.entry_node(node) is None
                and node.map.schedule != dtypes.ScheduleType.Sequential and _elementwise(state, node) is not None):
            groups = _conflicts(state, node)
            if groups:
                found.append((node, groups))
    return found


def _sink(sdfg: dace.SDFG, state: dace.SDFGState, dtype) -> nd.AccessNode:
    """A scope-local scalar that takes an output the copy does not keep (its value is never read)."""
    name, _ = sdfg.add_scalar("gradflow_unused", dtype, transient=True, storage=dtypes.StorageType.Register,
                              find_new_name=True)
    return state.add_access(name)


def _split_off(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry, keep: list) -> nd.MapEntry:
    """A copy of `entry`'s scope that writes only through the edges `keep` (in-edges of the map exit, sums
    into one array); returns its entry. Outputs the copy drops go to fresh scope-local scalars."""
    exit_ = state.exit_node(entry)
    body = _elementwise(state, entry)
    twin = {n: copy.deepcopy(n) for n in [entry, exit_, *body]}
    # The copy's scope-local data gets descriptors of its own (shared, DaCe declares it outside both maps).
    renamed = private_copies(sdfg, {n.data for n in body if isinstance(n, nd.AccessNode)
                                    and sdfg.arrays[n.data].transient})
    for n in twin.values():
        if isinstance(n, nd.AccessNode) and n.data in renamed:
            n.data = renamed[n.data]
        state.add_node(n)

    def moved(memlet: Memlet) -> Memlet:
        out = copy.deepcopy(memlet)
        if out.data in renamed:
            out.data = renamed[out.data]
        return out

    for e in state.in_edges(entry):
        state.add_edge(e.src, e.src_conn, twin[entry], e.dst_conn, copy.deepcopy(e.data))
    for n in [entry, *body]:
        for e in state.out_edges(n):
            if e.dst is not exit_:
                state.add_edge(twin[n], e.src_conn, twin[e.dst], e.dst_conn, moved(e.data))
            elif any(e is k for k in keep):
                state.add_edge(twin[n], e.src_conn, twin[exit_], e.dst_conn, copy.deepcopy(e.data))
            elif isinstance(n, nd.AccessNode):
                # scope-local data the original also writes out (a fused map's temporary that a later
                # state reads): the original writes it, the copy need not (a copy into a sink scalar
                # here declared the temporary where the copy's code could not see it)
                continue
            else:
                desc = sdfg.arrays[e.data.data]
                sink = _sink(sdfg, state, desc.dtype)
                state.add_edge(twin[n], e.src_conn, sink, None, Memlet(data=sink.data, subset="0"))
    # The copy writes through an access node of its own: DaCe makes writes into one access node atomic
    # when their subsets intersect, whichever maps they come from. That node precedes the original map.
    in_conns = {k.dst_conn for k in keep}
    out_conns = {"OUT_" + conn[len("IN_"):] for conn in in_conns}
    target = None
    for e in state.out_edges(exit_):
        if e.src_conn in out_conns:
            if target is None:
                target = state.add_access(e.dst.data)
                state.add_nedge(target, entry, Memlet())
            state.add_edge(twin[exit_], e.src_conn, target, e.dst_conn, copy.deepcopy(e.data))
    for conn in list(twin[exit_].in_connectors):
        if conn not in in_conns:
            twin[exit_].remove_in_connector(conn)
    for conn in list(twin[exit_].out_connectors):
        if conn not in out_conns:
            twin[exit_].remove_out_connector(conn)
    return twin[entry]


def _drop(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry, edge) -> None:
    """Remove the accumulation `edge` (an in-edge of `entry`'s exit) from the original map; its tasklet
    connector writes to a sink instead. The exit's connectors go with their last edge."""
    exit_ = state.exit_node(entry)
    state.remove_edge(edge)
    sink = _sink(sdfg, state, sdfg.arrays[edge.data.data].dtype)
    state.add_edge(edge.src, edge.src_conn, sink, None, Memlet(data=sink.data, subset="0"))
    if any(e.dst_conn == edge.dst_conn for e in state.in_edges(exit_)):
        return
    out_conn = "OUT_" + edge.dst_conn[len("IN_"):]
    for e in [e for e in state.out_edges(exit_) if e.src_conn == out_conn]:
        state.remove_edge(e)
    exit_.remove_in_connector(edge.dst_conn)
    exit_.remove_out_connector(out_conn)


def _prune_dead(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry) -> None:
    """Remove from the map's body the tasklets and data from which no path leads to the map's exit.

    A copy keeps one class of sums, so a tasklet that computes only other sums (the adjoint of another
    operand) writes sink scalars alone; so may the original's after its sums are dropped. Besides being
    work for nothing, such a tasklet does not lead to the exit, and DaCe's code generator then writes it
    after the map's loop, where the loop's parameters and scope-local data are not declared: the build
    failed (`gradflow fuzz --seed 14450`, program 36, a Hessian-vector product of a fused product)."""
    exit_ = state.exit_node(entry)
    body, frontier = set(), [entry]
    while frontier:
        for e in state.out_edges(frontier.pop()):
            if e.dst is not exit_ and e.dst not in body:
                body.add(e.dst)
                frontier.append(e.dst)
    alive, frontier = set(), [exit_]
    while frontier:
        for e in state.in_edges(frontier.pop()):
            if e.src in body and e.src not in alive:
                alive.add(e.src)
                frontier.append(e.src)
    tasklets = {n for n in body - alive if isinstance(n, nd.Tasklet) and n.language is dtypes.Language.Python}
    if not tasklets:
        return
    # with them go the data only they write (their sinks, a temporary between two of them)
    dead = [*tasklets, *(n for n in body - alive if isinstance(n, nd.AccessNode)
                         and all(e.src in tasklets for e in state.in_edges(n)))]
    names = {n.data for n in dead if isinstance(n, nd.AccessNode)}
    state.remove_nodes_from(dead)
    for conn in [c for c in entry.out_connectors if not any(e.src_conn == c for e in state.out_edges(entry))]:
        inner = "IN_" + conn[len("OUT_"):]
        for e in [e for e in state.in_edges(entry) if e.dst_conn == inner]:
            state.remove_edge(e)
        entry.remove_in_connector(inner)
        entry.remove_out_connector(conn)
    used = {n.data for st in sdfg.states() for n in st.data_nodes()}
    for name in names - used:
        if sdfg.arrays[name].transient:
            sdfg.remove_data(name, validate=False)


@register_pass
@attrs.frozen
class OwnScatterWrites(Pass):
    """Split stencil-adjoint maps so every accumulation is owned by its iteration (see the module docstring)."""

    name: ClassVar[str] = "own_scatter_writes"

    def run(self, graph: Graph) -> PassResult:
        states = [s for sub in graph.sdfg.all_sdfgs_recursive() for s in sub.states()]
        if not any(_candidates(s) or any(_same_element_sums(s, m) for m in _parallel_elementwise_maps(s))
                   for s in states):
            return Success(graph)
        sdfg = graph.editable()
        for sub in sdfg.all_sdfgs_recursive():
            for state in list(sub.states()):
                for entry in _parallel_elementwise_maps(state):
                    for edges in _same_element_sums(state, entry):
                        _combine(state, entry, edges)
                for entry, groups in _candidates(state):
                    extra = [members for classes in groups for members in classes[1:]]
                    # every copy is taken from the whole original, before any accumulation leaves it
                    copies = [_split_off(sub, state, entry, members) for members in extra]
                    for edge in (edge for members in extra for edge in members):
                        _drop(sub, state, entry, edge)
                    for each in [entry, *copies]:
                        _prune_dead(sub, state, each)
        return Success(Graph.adopt(sdfg, graph.meta))
