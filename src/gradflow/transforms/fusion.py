"""`fuse_maps`: element-wise chains become one map (DaCe's `MapFusionVertical`, on a private copy).

The Python frontend writes `B[1:-1] = 0.33 * (A[:-2] + A[1:-1] + A[2:])` as three maps with two
temporary arrays. Fused, the chain is one map whose intermediates are scope-local scalars: one pass over
memory instead of three, and, when it runs before reverse mode (it is a step of `NORMALIZE`), one
operation whose element function the element-wise rule differentiates as a whole, with no gradient
buffers, tape entries or backward maps for the temporaries.

Only maps whose bodies are tasklets (and scope-local data) are fused: a map over a nested SDFG or a
library node is an operation of its own for reverse mode. A pair is fused only when gradflow proves that
it keeps the results (`analysis.dependence.fusion_keeps_results`: every array both maps touch, one writing
it, is touched at one injective index in both); DaCe's applicability check is not the proof.

Before fusing, a map whose only result is a temporary that one reader reads in part runs only the
iterations whose elements are read (`analysis.dependence.read_part_of_a_map` proves the others dead). The
Runge-Kutta stage `x = y + h * k` followed by `z[1:] = w[1:] * x[:-1]` writes N elements of which the
product reads N - 1: trimmed to those, the two maps range alike and fuse, and `x` becomes a scalar.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.propagation import propagate_memlets_scope
from dace.transformation.dataflow import MapFusionVertical
from dace.transformation.passes import pattern_matching
from dace.transformation.passes.analysis import FindSingleUseData
from returns.result import Success

from gradflow.analysis.dependence import fusion_keeps_results, read_part_of_a_map
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass


def elementwise_scope(state: dace.SDFGState, entry: nd.MapEntry, python_only: bool = False) -> bool:
    """The map's body is tasklets and scope-local data (`python_only`: tasklets in Python, whose only
    effects are their outputs)."""
    body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    return all(isinstance(n, nd.AccessNode) or (isinstance(n, nd.Tasklet) and (
        not python_only or n.language == dace.dtypes.Language.Python)) for n in body)


class ElementwiseMapFusion(MapFusionVertical):
    """`MapFusionVertical` restricted to maps whose bodies are tasklets and scope-local data."""

    def can_be_applied(self, graph, expr_index, sdfg, permissive=False) -> bool:
        first = graph.entry_node(self.first_map_exit)
        if not (elementwise_scope(graph, first) and elementwise_scope(graph, self.second_map_entry)):
            return False
        # gradflow's own proof that fusing keeps the results; DaCe's check must agree too (it rewrites)
        if not fusion_keeps_results(graph, first, self.second_map_entry):
            return False
        return super().can_be_applied(graph, expr_index, sdfg, permissive)


def _trim_dead_iterations(sdfg: dace.SDFG) -> bool:
    """Give each top-level element-wise map whose result is read only in part the range of that part (see
    the module docstring), until none does (a trimmed map reads less of its own producers); whether any
    map changed."""
    trimmed = False
    while _trim_once(sdfg):
        trimmed = True
    return trimmed


def _trim_once(sdfg: dace.SDFG) -> bool:
    changed = False
    for state in sdfg.states():
        scopes = state.scope_dict()
        for entry in [n for n in state.nodes() if isinstance(n, nd.MapEntry) and scopes[n] is None]:
            if not elementwise_scope(state, entry, python_only=True):
                continue
            part = read_part_of_a_map(sdfg, state, entry)
            if part is None:
                continue
            entry.map.range = part
            propagate_memlets_scope(sdfg, state, state.scope_tree()[entry])
            changed = True
    return changed


def _map_count(sdfg: dace.SDFG) -> int:
    return sum(isinstance(n, nd.MapEntry) for n, _ in sdfg.all_nodes_recursive())


@register_pass
@attrs.frozen
class FuseMaps(Pass):
    """Fuse producer/consumer element-wise maps over the same range (see the module docstring)."""

    name: ClassVar[str] = "fuse_maps"

    def run(self, graph: Graph) -> PassResult:
        if _map_count(graph.sdfg) < 2:
            return Success(graph)
        sdfg = graph.editable()
        trimmed = _trim_dead_iterations(sdfg)
        single_use = FindSingleUseData().apply_pass(sdfg, {})
        # (see DaCe's FullMapFusion) Edges into and out of the fused map are kept as they were rather than
        # merged per array: merging would need a memlet propagation per fusion (most of the pass's time on
        # stencils), and the kept memlets stay exact.
        fusion = ElementwiseMapFusion(_single_use_data=single_use, never_consolidate_edges=True)
        applied = pattern_matching.PatternMatchAndApplyRepeated([fusion], permissive=False, validate=False,
                                                                print_report=False, progress=False) \
            .apply_pass(sdfg, {FindSingleUseData.__name__: single_use})
        if not applied and not trimmed:
            return Success(graph)
        return Success(Graph.adopt(sdfg, graph.meta))
