"""`merge_element_sums`: two maps that each write every element of a gradient buffer once become one.

An array read by two matrix-vector products (`y = (A @ x) @ A`, `s = r @ A; q = A @ p`) gets two
outer-product contributions to its gradient, each a map over the whole matrix: `gA[i, j] = u[i] v[j]`,
later `gA[i, j] += w[i] z[j]`. Each pass streams the matrix through memory (nb_bicg: 9.6 MB written, then
read and written again). Merged, one map computes both terms and writes each element once.

Applies to a pair in one control-flow region whose blocks form a chain: an earlier state holding only a
map that writes every element of `g` once (`analysis.access.ElementWrite`: plain or a sum) and access nodes,
and a later state holding only a map that adds into every element of `g` once and access nodes. The
earlier map moves to the later one, so nothing between them may touch `g`, write what it reads or assign
symbols; neither tasklet may name a map parameter in its code (they are renamed in memlets only). The
merged body computes both terms into scalars and writes their sum through the later map's path, with
the earlier map's resolution (a plain write stays a write).
"""

from __future__ import annotations

import copy
import re
from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd

from gradflow.analysis.access import ElementWrite, accesses, chain_of, element_write, touches
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass


@attrs.frozen
class _Single:
    """A state holding one top-level map (and access nodes) whose only output is an `ElementWrite`."""

    state: dace.SDFGState
    entry: nd.MapEntry
    target: nd.AccessNode
    write: ElementWrite


def _single(state: dace.SDFGState) -> _Single | None:
    entries = [n for n in state.nodes() if isinstance(n, nd.MapEntry) and state.entry_node(n) is None]
    if len(entries) != 1:
        return None
    entry, exit_ = entries[0], state.exit_node(entries[0])
    top = [n for n in state.nodes() if state.entry_node(n) is None and n is not entry and n is not exit_]
    body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    if not all(isinstance(n, nd.AccessNode) for n in top) or len(body) != 1 or state.out_degree(exit_) != 1:
        return None
    target = state.out_edges(exit_)[0].dst
    nodes = accesses(state, target.data) if isinstance(target, nd.AccessNode) else []
    if len(nodes) != 1 or state.out_degree(target) or state.in_degree(target) != 1:
        return None
    write = element_write(state, state.in_edges(target)[0])
    if write is None or write.tasklet is not body[0] or write.tasklet.language != dace.Language.Python:
        return None
    params = set(entry.map.params)
    code = write.tasklet.code.as_string
    if any(re.search(rf"\b{re.escape(p)}\b", code) for p in params):
        return None
    return _Single(state, entry, target, write)


def _reads(single: _Single) -> set[str]:
    return {e.data.data for e in single.state.in_edges(single.entry) if not e.data.is_empty()}


def _writes_any(block, names: set[str]) -> bool:
    """`block` may write one of `names` (a region: touches one at all)."""
    if not isinstance(block, dace.SDFGState):
        return any(touches(block, n) for n in names)
    return any(n.data in names and block.in_degree(n) for n in block.data_nodes())


def _pairs(sdfg: dace.SDFG) -> list[tuple[_Single, _Single]]:
    found = []
    for region in sdfg.all_control_flow_regions():
        order = chain_of(region) if region.nodes() else None
        if order is None:
            continue
        for j, block in enumerate(order):
            if not isinstance(block, dace.SDFGState):
                continue
            later = _single(block)
            if later is None or later.write.wcr is None:
                continue
            name = later.target.data
            earlier = _earlier(region, order, j, name)
            if earlier is not None and name not in _reads(earlier):
                found.append((earlier, later))
    return found


def _earlier(region, order: list, j: int, name: str) -> _Single | None:
    """The state before position j that last touches `name`, when it is a `_Single` whose map can move
    to position j."""
    between = []
    for k in range(j - 1, -1, -1):
        crossed = region.in_edges(order[k + 1])[0].data
        if crossed.assignments or not crossed.is_unconditional():
            return None
        if touches(order[k], name):
            if not isinstance(order[k], dace.SDFGState):
                return None
            single = _single(order[k])
            if single is None or single.target.data != name or any(_writes_any(b, _reads(single)) for b in between):
                return None
            return single
        between.append(order[k])
    return None


def _merge(earlier: _Single, later: _Single) -> None:
    sdfg, state = later.state.sdfg, later.state
    entry = state.entry_node(later.write.tasklet)
    rename = dict(zip(earlier.write.params, later.write.params))
    old = earlier.write.tasklet
    twin = state.add_tasklet(old.label + "_merged", dict(old.in_connectors), dict(old.out_connectors),
                             old.code.as_string, language=old.language)
    for edge in earlier.state.in_edges(old):
        if edge.data.is_empty():
            state.add_edge(entry, None, twin, None, dace.Memlet())
            continue
        memlet = copy.deepcopy(edge.data)
        # in two steps: the parameters may be the same names in another order
        memlet.subset.replace({dace.symbol(a): dace.symbol(f"__gf_sib{k}") for k, a in enumerate(rename)})
        memlet.subset.replace({dace.symbol(f"__gf_sib{k}"): dace.symbol(b) for k, b in enumerate(rename.values())})
        source = state.add_read(earlier.state.memlet_path(edge)[0].src.data)
        state.add_memlet_path(source, entry, twin, dst_conn=edge.dst_conn, memlet=memlet)
    dtype = sdfg.arrays[later.target.data].dtype
    first, _ = sdfg.add_scalar("gradflow_term", dtype, transient=True, find_new_name=True,
                               storage=dace.StorageType.Register)
    second, _ = sdfg.add_scalar("gradflow_term", dtype, transient=True, find_new_name=True,
                                storage=dace.StorageType.Register)
    leaf = later.write.leaf
    first_node, second_node = state.add_access(first), state.add_access(second)
    state.add_edge(twin, earlier.write.leaf.src_conn, first_node, None, dace.Memlet(f"{first}[0]"))
    state.remove_edge(leaf)
    state.add_edge(leaf.src, leaf.src_conn, second_node, None, dace.Memlet(f"{second}[0]"))
    total = state.add_tasklet("gradflow_sum_terms", {"__a": dtype, "__b": dtype}, {"__o": dtype}, "__o = __a + __b")
    state.add_edge(first_node, None, total, "__a", dace.Memlet(f"{first}[0]"))
    state.add_edge(second_node, None, total, "__b", dace.Memlet(f"{second}[0]"))
    memlet = copy.deepcopy(leaf.data)
    memlet.wcr = earlier.write.wcr
    state.add_edge(total, "__o", leaf.dst, leaf.dst_conn, memlet)
    for edge in later.write.edges:
        if edge is not leaf:
            edge.data.wcr = earlier.write.wcr
    scope = earlier.state.scope_subgraph(earlier.entry, include_entry=True, include_exit=True).nodes()
    earlier.state.remove_nodes_from([*scope, earlier.target])
    for node in list(earlier.state.data_nodes()):
        if earlier.state.degree(node) == 0:
            earlier.state.remove_node(node)


@register_pass
@attrs.frozen
class MergeElementSums(RewritePass):
    """Two maps each writing every element of a buffer once: one map (see the module docstring)."""

    name: ClassVar[str] = "merge_element_sums"

    strategy: ClassVar[str] = ONE_AT_A_TIME

    def matches(self, sdfg: dace.SDFG) -> list:
        return _pairs(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _merge(*match)
