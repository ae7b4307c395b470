"""`forward_broadcasts`: reads of an array that only repeats another one's elements read those instead.

The reverse of a sum (`S = np.sum(x)`, or over some axes) spreads the sum's gradient over the summed array:
a map writing `g_x[i, j] = g_S[0]` (or `g_s[i]` for a sum over rows), read by the next operation's
reverse map. The broadcast is a full write of `g_x` and a full read of it, where the value is one scalar
(or one vector); every NPBench kernel ends with such a sum. XLA and torch fuse it away; here, the reader
reads `g_S[0]` itself and the broadcast goes.

A broadcast is a top-level map whose one tasklet copies (`out = in`) `s[f(p)]`, one element of another
array chosen by the map's parameters `p`, into `t[p]`, over the whole of `t`: a plain write, or a sum
into what an earlier operation wrote (the sum's gradient added to the gradient of its summands, which
the operation after the sum gave them; softmax's `e / sum(e)`). It is forwarded when `t` is a transient
whose access nodes after the map all read it in states later in the same chain of blocks
(`analysis.access.chain_of`), each reaching only Python tasklets, one element each, with nothing on the way
(the blocks in between, the interstate edges crossed, the reading states) writing `s` or `t`, and whose
other access nodes come before the map, in a region no loop runs again. Each read `t[e]` becomes
`s[f(e)]` (a plain write) or `t[e] + s[f(e)]` (a sum); the map goes, and `t` with it when nothing else
names it.
"""

from __future__ import annotations

import ast
from typing import ClassVar, Iterator

import attrs
import dace
import sympy
from dace import subsets
from dace.frontend.operations import detect_reduction_type
from dace.properties import CodeBlock
from dace.sdfg import nodes as nd
from dace.sdfg.state import ControlFlowRegion

from gradflow.analysis.access import accesses, chained_states, control_names, touches
from gradflow.analysis.loops import in_loop
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass
from gradflow.optimize.dead_stores import KEPT_LIFETIMES
from gradflow.transforms.product_scales import indexes_whole


@attrs.frozen
class Broadcast:
    """`target` (array `t`) written as `t[p] = source[index(p)]` by the map `entry` of `state`, read by
    `readers` (state, access node) later."""

    state: dace.SDFGState
    entry: nd.MapEntry
    target: nd.AccessNode
    source: str
    index: tuple[sympy.Expr, ...]
    params: tuple[str, ...]
    readers: tuple[tuple[dace.SDFGState, nd.AccessNode], ...]
    adds: bool  # `t[p] += source[index(p)]` (t written before): readers add the element to what they read


def _is_copy(tasklet: nd.Tasklet, inp: str, out: str) -> bool:
    if tasklet.language != dace.dtypes.Language.Python:
        return False
    try:
        body = ast.parse(tasklet.code.as_string).body
    except SyntaxError:
        return False
    return (len(body) == 1 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
            and isinstance(body[0].targets[0], ast.Name) and body[0].targets[0].id == out
            and isinstance(body[0].value, ast.Name) and body[0].value.id == inp)


def _element(subset) -> tuple[sympy.Expr, ...] | None:
    """The index of a one-element subset, else None."""
    if any(begin != end for begin, end, _ in subset.ndrange()):
        return None
    return tuple(sympy.sympify(begin) for begin, _, _ in subset.ndrange())


def _sum(memlet: dace.Memlet) -> bool:
    return memlet.wcr is not None and detect_reduction_type(memlet.wcr) == dace.dtypes.ReductionType.Sum


def _producers(state: dace.SDFGState):
    """(map entry, target access node, source array, source index, adds) of the broadcasts in `state`."""
    sdfg = state.sdfg
    for entry in state.nodes():
        if not isinstance(entry, nd.MapEntry) or state.entry_node(entry) is not None or state.in_degree(entry) != 1:
            continue
        body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
        outs = state.out_edges(state.exit_node(entry))
        if len(body) != 1 or not isinstance(body[0], nd.Tasklet) or len(outs) != 1:
            continue
        tasklet, target = body[0], outs[0].dst
        ins, writes = state.in_edges(tasklet), state.out_edges(tasklet)
        if len(ins) != 1 or len(writes) != 1 or not isinstance(target, nd.AccessNode):
            continue
        adds = _sum(outs[0].data) and _sum(writes[0].data)
        if (not adds and (outs[0].data.wcr or writes[0].data.wcr)) or not _is_copy(tasklet, ins[0].dst_conn,
                                                                                  writes[0].src_conn):
            continue
        source = ins[0].data.data
        index = _element(ins[0].data.subset) if source is not None else None
        params = set(entry.map.params)
        if (index is None or source == target.data
                or not {str(x) for i in index for x in sympy.sympify(i).free_symbols} <= params
                or not indexes_whole(sdfg, entry, target.data, writes[0].data.subset)):
            continue
        yield entry, target, source, index, adds


def _writes(state: dace.SDFGState, name: str) -> bool:
    return any(state.in_degree(n) for n in accesses(state, name))


def _reads_elements(state: dace.SDFGState, node: nd.AccessNode) -> bool:
    """Every path out of `node` ends in a Python tasklet reading one element."""
    for edge in state.out_edges(node):
        if not isinstance(edge.dst, (nd.MapEntry, nd.Tasklet)):
            return False
        for leaf in state.memlet_tree(edge).leaves():
            if (not isinstance(leaf.dst, nd.Tasklet) or leaf.dst.language != dace.dtypes.Language.Python
                    or _element(leaf.data.subset) is None):
                return False
    return True


def _named(block, name: str) -> list[nd.AccessNode]:
    if isinstance(block, dace.SDFGState):
        return accesses(block, name)
    return [n for n, _ in block.all_nodes_recursive() if isinstance(n, nd.AccessNode) and n.data == name]


def _readers(order: list, k: int, region: ControlFlowRegion, name: str, source: str):
    """The access nodes of `name` in the blocks after `order[k]`, up to the first block that writes `name`
    or `source` (or whose incoming edge is conditional or names either); None if one of them does anything
    but read one element per tasklet."""
    found = []
    for block in order[k + 1:]:
        edge = region.in_edges(block)[0]
        if not edge.data.is_unconditional() or {name, source} & set(map(str, edge.data.free_symbols)):
            break
        if not isinstance(block, dace.SDFGState):
            if touches(block, name) or touches(block, source):
                break
            continue
        if _writes(block, name) or _writes(block, source):
            break
        for node in accesses(block, name):
            if not _reads_elements(block, node):
                return None
            found.append((block, node))
    return found


def _candidates(sdfg: dace.SDFG) -> Iterator[Broadcast]:
    """The broadcasts to forward, in program order (lazily: the driver takes the first, then matches again).
    Where arrays are named is indexed once per call, so each candidate costs the blocks it scans."""
    named: dict[str, int] | None = None
    by_control: frozenset[str] | None = None
    for region, order, k, block in chained_states(sdfg):
        for entry, target, source, index, adds in _producers(block):
            name = target.data
            desc = sdfg.arrays[name]
            if (not desc.transient or isinstance(desc, dace.data.View) or desc.lifetime in KEPT_LIFETIMES
                    or accesses(block, name) != [target] or block.out_degree(target) or _writes(block, source)):
                continue
            readers = _readers(order, k, region, name, source)
            if not readers:
                continue
            if named is None:
                named, by_control = _access_counts(sdfg), control_names(sdfg)
            # accesses before the broadcast: it overwrites or adds to what they leave, once (no loop runs
            # them again after it); an addition needs what they wrote
            before = [n for b in order[:k] for n in _named(b, name)] if not in_loop(block) else []
            if named.get(name, 0) != len(readers) + 1 + len(before) or (adds and not before) or name in by_control:
                continue
            yield Broadcast(block, entry, target, source, index, tuple(entry.map.params), tuple(readers), adds)


def _access_counts(sdfg: dace.SDFG) -> dict[str, int]:
    """How many access nodes name each array, in `sdfg` and everything nested in it."""
    counts: dict[str, int] = {}
    for n, _ in sdfg.all_nodes_recursive():
        if isinstance(n, nd.AccessNode):
            counts[n.data] = counts.get(n.data, 0) + 1
    return counts


def _element_of_source(b: Broadcast, subset) -> dace.Memlet:
    """The element of the source that `t[subset]` (one element) repeats."""
    at = dict(zip(b.params, _element(subset)))
    index = [sympy.sympify(i).subs({x: at[str(x)] for x in sympy.sympify(i).free_symbols}, simultaneous=True)
             for i in b.index]
    return dace.Memlet(data=b.source, subset=subsets.Range([(i, i, 1) for i in index]))


def _add_to_readers(sdfg: dace.SDFG, b: Broadcast) -> None:
    """Each tasklet reading `t[e]` reads it as a part and `source[f(e)]` as another, and adds them."""
    for state, node in b.readers:
        new = state.add_access(b.source)
        for edge in list(state.out_edges(node)):
            for e in state.memlet_tree(edge).leaves():
                path = [x.src for x in state.memlet_path(e)][1:] + [e.dst]
                tasklet, conn = e.dst, e.dst_conn
                part, spread = f"{conn}_part", f"{conn}_spread"
                while part in tasklet.in_connectors or spread in tasklet.in_connectors:
                    part, spread = part + "_", spread + "_"
                tasklet.remove_in_connector(conn)
                tasklet.add_in_connector(part)
                tasklet.add_in_connector(spread)
                state.remove_edge(e)
                state.add_edge(e.src, e.src_conn, tasklet, part, e.data)
                state.add_memlet_path(new, *path, dst_conn=spread, memlet=_element_of_source(b, e.data.subset))
                tasklet.code = CodeBlock(f"{conn} = {part} + {spread}\n" + tasklet.code.as_string,
                                         dace.dtypes.Language.Python)


def _forward(sdfg: dace.SDFG, b: Broadcast) -> None:
    if b.adds:
        _add_to_readers(sdfg, b)
    else:
        _read_source(sdfg, b)
    scope = b.state.scope_subgraph(b.entry, include_entry=True, include_exit=True).nodes()
    sources = [e.src for e in b.state.in_edges(b.entry)]
    b.state.remove_nodes_from([*scope, b.target])
    for n in sources:
        if isinstance(n, nd.AccessNode) and b.state.degree(n) == 0:
            b.state.remove_node(n)
    if not any(isinstance(n, nd.AccessNode) and n.data == b.target.data for n, _ in sdfg.all_nodes_recursive()):
        sdfg.remove_data(b.target.data, validate=False)


def _read_source(sdfg: dace.SDFG, b: Broadcast) -> None:
    """Each tasklet reading `t[e]` reads `source[f(e)]` instead."""
    for state, node in b.readers:
        new = state.add_access(b.source)
        for edge in list(state.out_edges(node)):
            tree = state.memlet_tree(edge)
            for child in tree.traverse_children(include_self=False):
                e = child.edge
                if isinstance(e.dst, nd.Tasklet):
                    e.data = _element_of_source(b, e.data.subset)
                else:  # between nested map entries: all of the source (a superset)
                    e.data = dace.Memlet.from_array(b.source, sdfg.arrays[b.source])
            memlet = (_element_of_source(b, edge.data.subset) if isinstance(edge.dst, nd.Tasklet)
                      else dace.Memlet.from_array(b.source, sdfg.arrays[b.source]))
            state.add_edge(new, edge.src_conn, edge.dst, edge.dst_conn, memlet)
            state.remove_edge(edge)
        state.remove_node(node)


@register_pass
@attrs.frozen
class ForwardBroadcasts(RewritePass):
    """Reads of a transient that repeats elements of another array read that array (see the module doc)."""

    name: ClassVar[str] = "forward_broadcasts"

    strategy: ClassVar[str] = ONE_AT_A_TIME  # a forwarded broadcast may be the source of the next
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> Iterator[Broadcast]:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _forward(sdfg, match)
