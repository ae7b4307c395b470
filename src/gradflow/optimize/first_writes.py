"""`overwrite_zeroed_products`: a gradient buffer whose first writer is a matrix product is not zeroed.

Reverse mode zeroes every gradient buffer before the backward sweep and lets each contribution add into
it; a matrix product's contribution is a `Gemm` with beta = 1 (`C += A B`). When that Gemm is the first
thing after the zeroing to touch the buffer and it covers all of it, the zeros are never needed: beta = 0
(`C = A B`, which BLAS computes without reading C) gives the same buffer, and the zeroing map goes. The
gradient of a convolution's unfolded input is such a buffer: 4.7 MB zeroed per backward call of a
16-channel residual block.

Applies where the zeroing map (`a[...] = 0` over the whole array, no inputs) and the Gemm lie in one
control-flow region whose blocks form a chain, the Gemm's state later in it; nothing in the states in
between, the rest of the zeroing state, the Gemm's state or the interstate edges crossed touches the
array, and the Gemm is its only writer there (a `_c` output covering it, no `_cin` input).
"""

from __future__ import annotations

import re
from typing import ClassVar, Iterator

import attrs
import dace
from dace.libraries.blas.nodes.gemm import Gemm
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass


def _covers(sdfg: dace.SDFG, memlet: dace.Memlet) -> bool:
    whole = dace.subsets.Range.from_array(sdfg.arrays[memlet.data])
    return memlet.subset is not None and memlet.subset.covers(whole) and memlet.wcr is None


def _zeroing(state: dace.SDFGState) -> Iterator[tuple[nd.MapEntry, nd.AccessNode]]:
    """Top-level maps of `state` with no inputs whose one tasklet writes 0 over a whole array."""
    for entry in state.nodes():
        if not isinstance(entry, nd.MapEntry) or state.entry_node(entry) is not None or state.in_degree(entry):
            continue
        body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
        exit_ = state.exit_node(entry)
        outs = state.out_edges(exit_)
        if (len(body) != 1 or not isinstance(body[0], nd.Tasklet) or body[0].in_connectors or len(outs) != 1
                or not isinstance(outs[0].dst, nd.AccessNode)):
            continue
        code = body[0].code.as_string.replace(" ", "").strip()
        if code.split("=")[-1] in ("0", "0.0") and _covers(state.sdfg, outs[0].data):
            yield entry, outs[0].dst


def _accesses(state: dace.SDFGState, name: str) -> list[nd.AccessNode]:
    return [n for n in state.data_nodes() if n.data == name]


def _named_in_code(block, name: str) -> bool:
    """`name` appears in a loop's or a conditional's own code (its condition, init or update) in `block`."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    for region in block.all_control_flow_regions():
        codes = []
        if isinstance(region, LoopRegion):
            codes = [region.loop_condition, region.init_statement, region.update_statement]
        elif isinstance(region, ConditionalBlock):
            codes = [condition for condition, _ in region.branches]
        if any(code is not None and word.search(code.as_string) for code in codes):
            return True
    return False


def _touches(block, name: str) -> bool:
    if isinstance(block, dace.SDFGState):
        return bool(_accesses(block, name))
    return (any(isinstance(n, nd.AccessNode) and n.data == name for n, _ in block.all_nodes_recursive())
            or any(name in e.data.free_symbols for e in block.all_interstate_edges(recursive=True))
            or _named_in_code(block, name))


def _first_gemm(state: dace.SDFGState, name: str) -> Gemm | None:
    """The Gemm (beta 1, no `_cin`) that is the only writer of `name` in `state`, covering it, when no
    node of `state` reads it."""
    nodes = _accesses(state, name)
    if len(nodes) != 1 or state.out_degree(nodes[0]) or state.in_degree(nodes[0]) != 1:
        return None
    edge = state.in_edges(nodes[0])[0]
    gemm = edge.src
    if (not isinstance(gemm, Gemm) or edge.src_conn != "_c" or gemm.beta != 1 or "_cin" in gemm.in_connectors
            or not _covers(state.sdfg, edge.data)):
        return None
    return gemm


def _chain(region: ControlFlowRegion) -> list | None:
    """The blocks of `region` in order when they form a chain, else None."""
    start = region.start_block
    order, block = [start], start
    while region.out_degree(block):
        if region.out_degree(block) != 1:
            return None
        block = region.out_edges(block)[0].dst
        if block in order:
            return None
        order.append(block)
    return order if len(order) == len(region.nodes()) else None


def _candidates(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.MapEntry, nd.AccessNode, Gemm]]:
    found = []
    for region in sdfg.all_control_flow_regions():
        if not isinstance(region, ControlFlowRegion) or not region.nodes():
            continue
        order = _chain(region)
        if order is None:
            continue
        for k, block in enumerate(order):
            if not isinstance(block, dace.SDFGState):
                continue
            for entry, target in _zeroing(block):
                name = target.data
                if len(_accesses(block, name)) != 1 or block.out_degree(target):
                    continue
                for j in range(k + 1, len(order)):
                    edge = region.in_edges(order[j])[0]
                    if name in edge.data.free_symbols:
                        break
                    if _touches(order[j], name):
                        if isinstance(order[j], dace.SDFGState):
                            gemm = _first_gemm(order[j], name)
                            if gemm is not None:
                                found.append((block, entry, target, gemm))
                        break
    return found


@register_pass
@attrs.frozen
class OverwriteZeroedProducts(Pass):
    """A zeroed buffer whose first writer is a covering Gemm (beta 1): beta 0, no zeroing (see the module
    docstring)."""

    name: ClassVar[str] = "overwrite_zeroed_products"

    def run(self, graph: Graph) -> PassResult:
        if not any(_candidates(s) for s in graph.sdfg.all_sdfgs_recursive()):
            return Success(graph)
        sdfg = graph.editable()
        for sub in sdfg.all_sdfgs_recursive():
            for state, entry, target, gemm in _candidates(sub):
                gemm.beta = 0
                scope = state.scope_subgraph(entry, include_entry=True, include_exit=True).nodes()
                state.remove_nodes_from([*scope, target])
        return Success(Graph.adopt(sdfg, graph.meta))
