"""Pure analysis: a state as an ordered sequence of operations.

An operation is what reverse mode reverses as one unit: a top-level map scope (entry, body, exit), a
top-level tasklet, library node or nested SDFG, or a copy between two access nodes. Top-level access nodes
are the boundaries between operations; they are not part of any operation. The result is frozen facts
(node ids, not node objects) so it can be kept without pinning the graph.
"""

from __future__ import annotations

import re

import attrs
import networkx as nx
from dace import subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState
from dace.sdfg.utils import dfs_topological_sort

from gradflow.core.errors import NotDifferentiableError


@attrs.frozen
class Op:
    """One operation of a state; node ids are `state.node_id(node)`."""

    kind: str  # "map" | "tasklet" | "copy" | "library" | "nested" | "other"
    nodes: frozenset[int]  # compute nodes of the op (empty for a copy)
    reads: tuple[int, ...]  # boundary access nodes read by the op
    writes: tuple[int, ...]  # boundary access nodes written by the op
    label: str


def _kind(node: nd.Node) -> str:
    if isinstance(node, nd.MapEntry):
        return "map"
    if isinstance(node, nd.Tasklet):
        return "tasklet"
    if isinstance(node, nd.LibraryNode):
        return "library"
    if isinstance(node, nd.NestedSDFG):
        return "nested"
    return "other"


def decompose(state: SDFGState) -> list[Op]:
    """The operations of `state` in a topological order of their dataflow."""
    scope = state.scope_dict()
    boundary = {n for n in state.nodes() if isinstance(n, nd.AccessNode) and scope[n] is None}
    compute = [n for n in state.nodes() if n not in boundary]

    groups = nx.Graph()
    groups.add_nodes_from(compute)
    for e in state.edges():
        if e.src not in boundary and e.dst not in boundary:
            groups.add_edge(e.src, e.dst)

    ops: list[Op] = []
    for component in nx.connected_components(groups):
        members = sorted(component, key=state.node_id)  # a set: order by node id, not by object address
        tops = [n for n in members if scope[n] is None and not isinstance(n, nd.ExitNode)]
        if len(tops) > 1 and all(isinstance(n, nd.Tasklet) for n in tops):
            tops = sorted(tops, key=state.node_id)[:1]  # tasklets wired directly together: one operation
        if len(tops) != 1:
            names = ", ".join(sorted(str(n) for n in tops))
            raise NotDifferentiableError(f"state '{state.label}': cannot split dataflow into operations ({names})")
        head = tops[0]
        reads = sorted({state.node_id(e.src) for n in members for e in state.in_edges(n) if e.src in boundary})
        writes = sorted({state.node_id(e.dst) for n in members for e in state.out_edges(n) if e.dst in boundary})
        op = Op(_kind(head), frozenset(state.node_id(n) for n in members), tuple(reads), tuple(writes), str(head))
        ops.append(op)
    for e in state.edges():
        if e.src in boundary and e.dst in boundary:
            op = Op("copy", frozenset(), (state.node_id(e.src),), (state.node_id(e.dst),), f"copy {e.src}->{e.dst}")
            ops.append(op)

    # Order: op A before op B when A writes an access node that B reads.
    order = nx.DiGraph()
    order.add_nodes_from(range(len(ops)))
    writer_of: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        for w in op.writes:
            writer_of.setdefault(w, []).append(i)
    for j, op in enumerate(ops):
        for r in op.reads:
            for i in writer_of.get(r, []):
                if i != j:
                    order.add_edge(i, j, data=state.node(r).data)
    # Access nodes of the same array ordered by a path (read-before-write through another node) also order
    # ops, where what the reader reads may be what the writer writes (elements apart keep their freedom:
    # `x[2, M - 3] += 1` and `x[:, M - 2] *= x[1:, M - 1]` both read one node and write the next).
    for j, op in enumerate(ops):
        for r in op.reads:
            for i, other in enumerate(ops):
                if i == j:
                    continue
                for w in other.writes:
                    if (w != r and state.node(w).data == state.node(r).data
                            and nx.has_path(state.nx, state.node(r), state.node(w))
                            and any(_may_overlap(a, b) for a in _subsets_at(state, op, r, False) or [None]
                                    for b in _subsets_at(state, other, w, True) or [None])):
                        order.add_edge(j, i, data=state.node(r).data)
    _order_conflicts(state, ops, order)
    try:
        sequence = list(nx.lexicographical_topological_sort(order, key=lambda i: ops[i].label))
    except nx.NetworkXUnfeasible:
        raise _cycle_error(state, ops, order) from None
    return [ops[i] for i in sequence]


def source_line(label: str) -> str | None:
    """The source line DaCe's frontend wrote into a state's label (`assign_12_4` and `augassign_16_4_op4` are
    lines 12 and 16), or None."""
    found = re.search(r"_(\d+)(?:_\d+)?(?:_op\d+)?$", label)
    return found.group(1) if found else None


def _cycle_error(state: SDFGState, ops: list[Op], order: nx.DiGraph) -> NotDifferentiableError:
    """Operations each of which reads what another overwrites, all in one dataflow step: no sequence of them
    keeps every read before the write it must precede. Named by what each writes and reads of the arrays of
    the cycle, and by the source line DaCe's frontend put in the state's label (`assign_12_4`)."""
    cycle = nx.find_cycle(order)
    arrays = sorted({order.edges[i, j].get("data") for i, j in cycle} - {None})
    named = ", ".join(f"'{a}'" for a in arrays) or "an array"

    def parts(op: Op, written: bool) -> str:
        nodes = op.writes if written else op.reads
        found = {f"{state.node(n).data}[{sub}]" if sub is not None else state.node(n).data
                 for n in nodes if state.node(n).data in arrays for sub in _subsets_at(state, op, n, written)}
        return ", ".join(sorted(found)) or "?"

    steps = "; ".join(f"{parts(ops[i], True)} from {parts(ops[i], False)}" for i, _ in cycle)
    line = source_line(state.label)
    where = f"line {line}, " if line else ""
    first = arrays[0] if arrays else "x"
    return NotDifferentiableError(
        f"updates of {named} in one dataflow step ({where}DaCe's state '{state.label}') each read elements "
        f"another overwrites ({steps}): no order of them keeps every read before its overwrite",
        hint=f"copy what one update reads into a temporary first (`t = {first}[...].copy()`), or write the "
             "results into a new array")


def _touched(state: SDFGState, op: Op) -> list[tuple[str, subsets.Range | None, bool]]:
    """(array, subset or None for all of it, written?) for each boundary access of `op`."""
    return [(state.node(n).data, sub, written) for nodes, written in ((op.reads, False), (op.writes, True))
            for n in nodes for sub in _subsets_at(state, op, n, written)]


def _subsets_at(state: SDFGState, op: Op, node_id: int, written: bool) -> list[subsets.Range | None]:
    """What `op` reads from (or writes into) the access node `node_id`: the subsets of its memlets there
    (a map's outer memlet bounds what its iterations touch), None for all of it."""
    node = state.node(node_id)
    edges = state.in_edges(node) if written else state.out_edges(node)
    out = []
    for e in edges:
        inner = e.src if written else e.dst
        mine = (state.node_id(inner) in (op.reads if written else op.writes)) if op.kind == "copy" \
            else state.node_id(inner) in op.nodes
        if mine:
            sub = None if e.data.is_empty() else (e.data.get_dst_subset(e, state) if written
                                                   else e.data.get_src_subset(e, state))
            out.append(sub)
    return out


def _may_overlap(a: subsets.Range | None, b: subsets.Range | None) -> bool:
    if a is None or b is None:
        return True
    try:
        return subsets.intersects(a, b) is not False
    except (TypeError, ValueError):  # a subset DaCe cannot compare: assume they meet
        return True


def _conflict(touched_a: list, touched_b: list) -> bool:
    """Do two operations (their `_touched`) touch an element of one array, at least one of them writing it?"""
    return any(data == other and (written or written_b) and _may_overlap(sub, sub_b)
               for data, sub, written in touched_a for other, sub_b, written_b in touched_b)


def _order_conflicts(state: SDFGState, ops: list[Op], order: nx.DiGraph) -> None:
    """Operations that touch the same elements of an array, one writing, with no dataflow path between
    them (DaCe's state fusion makes such states: `x0[3] = x0[4]` then `x0[4] = -0.75` as two unconnected
    subgraphs) run in the order DaCe's code generator runs them (a depth-first topological order from the
    source nodes, by node id): their order is the program's meaning, and one chosen by label read the
    overwritten value (a wrong forward value). Operations without such a conflict keep their freedom."""
    sources = [n for n in state.nodes() if state.in_degree(n) == 0]
    position = {n: k for k, n in enumerate(dfs_topological_sort(state, sources))}

    def runs_at(op: Op) -> int:
        if op.nodes:
            return min(position[state.node(i)] for i in op.nodes)
        return position[state.node(op.writes[0])]  # a copy is emitted at its destination

    touched = [_touched(state, op) for op in ops]
    ranked = sorted(range(len(ops)), key=lambda i: runs_at(ops[i]))
    for x, i in enumerate(ranked):
        for j in ranked[x + 1:]:
            if (_conflict(touched[i], touched[j]) and not nx.has_path(order, i, j)
                    and not nx.has_path(order, j, i)):
                order.add_edge(i, j)


def constant_beta(node: object) -> float | None:
    """A BLAS-style node's `beta` (the factor of the output's old value: 0 overwrites it, 1 adds into it)
    as a number; 0 for a node without one; None when it is symbolic. One place compares it, as a float:
    SymPy's `Float(0.0) == 0` is False, which made a zero beta read as "updates its output"."""
    beta = getattr(node, "beta", 0)
    try:
        return float(beta)
    except TypeError:
        return None
