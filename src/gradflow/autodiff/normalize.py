"""Normalization: the passes that run before reverse mode, each pure (Graph in, new Graph out), and
`NORMALIZE`, the one pipeline of them that `ad_pipeline` and the nested-SDFG rule both use.

- `lift_control_flow` (`lifting.py`): branches and loops written as conditional interstate edges become
  `ConditionalBlock`s and `LoopRegion`s;
- `lower_breaks` (`jumps.py`): `break` becomes a flag and guarded conditionals;
- `remove_views` (`views.py`): accesses through View nodes are rewritten onto the viewed array;
- `expand_library_nodes`: library nodes without a reverse rule are expanded into maps and tasklets
  (then `simplify` inlines the nested SDFGs that expansions create);
- `bound_transient_shapes` (`shapes.py`): transients sized by loop variables get their upper-bound size;
- `collapse_maps`: perfectly nested maps become one multi-dimensional map;
- `split_operations`: every state is split into a chain of states holding one operation each, so that
  "before operation k" is a place in the control flow where a value can be stored.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState
from dace.transformation.dataflow import MapCollapse
from returns.result import Success

from gradflow.analysis.ops import decompose
from gradflow.autodiff.rules import LIBRARY, default_library_rules, library_rule_for
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, Pipeline, register_pass, table_field
from gradflow.core.rule_table import RuleTable


@register_pass
@attrs.frozen
class ExpandLibraryNodes(Pass):
    """Expand every library node that has no op-level rule in `library_rules`, then simplify."""

    library_rules: RuleTable = table_field(LIBRARY, default_library_rules)
    name: ClassVar[str] = "expand_library_nodes"

    def keep(self, node: nd.LibraryNode) -> bool:
        return library_rule_for(self.library_rules, node) is not None

    def run(self, graph: Graph) -> PassResult:
        def pending(sdfg: dace.SDFG) -> list[tuple[SDFGState, nd.LibraryNode]]:
            return [
                (state, node)
                for state in sdfg.states()
                for node in state.nodes()
                if isinstance(node, nd.LibraryNode) and not self.keep(node)
            ]

        if not any(pending(s) for s in graph.sdfg.all_sdfgs_recursive()):
            return Success(graph)
        sdfg = graph.editable()
        for _ in range(32):  # expansions may produce further library nodes
            work = [(s, n) for sub in sdfg.all_sdfgs_recursive() for s, n in pending(sub)]
            if not work:
                break
            for state, node in work:
                node.expand(state)
        sdfg.simplify()
        return Success(Graph.adopt(sdfg, graph.meta))


@register_pass
@attrs.frozen
class CollapseMaps(Pass):
    """Merge perfectly nested maps into one map (their reversal is then one map, too)."""

    name: ClassVar[str] = "collapse_maps"

    def run(self, graph: Graph) -> PassResult:
        def nested_maps(sdfg: dace.SDFG) -> bool:
            return any(
                isinstance(n, nd.MapEntry) and s.entry_node(n) is not None
                for s in sdfg.states()
                for n in s.nodes()
            )

        if not nested_maps(graph.sdfg):
            return Success(graph)
        sdfg = graph.editable()
        sdfg.apply_transformations_repeated(MapCollapse, validate=False)
        return Success(Graph.adopt(sdfg, graph.meta))


def _split_state(state: SDFGState) -> None:
    ops = decompose(state)
    if len(ops) <= 1:
        return
    cfg = state.parent_graph
    was_start = cfg.start_block is state
    chain: list[SDFGState] = []
    for k, op in enumerate(ops):
        new = cfg.add_state(f"{state.label}_op{k}")
        members = {state.node(i) for i in op.nodes}
        mapped: dict[nd.Node, nd.Node] = {}
        for node in members:
            new.add_node(node)
            mapped[node] = node
        for i in set(op.reads) | set(op.writes):
            original = state.node(i)
            mapped[original] = nd.AccessNode(original.data)
            new.add_node(mapped[original])
        for e in state.edges():
            if op.kind == "copy":
                belongs = state.node_id(e.src) in op.reads and state.node_id(e.dst) in op.writes
            else:
                belongs = e.src in members or e.dst in members
            if belongs:
                new.add_edge(mapped[e.src], e.src_conn, mapped[e.dst], e.dst_conn, e.data)
        for node in members:
            if isinstance(node, nd.NestedSDFG):
                node.sdfg.parent = new
        chain.append(new)
    for a, b in zip(chain, chain[1:]):
        cfg.add_edge(a, b, dace.InterstateEdge())
    for e in cfg.in_edges(state):
        cfg.add_edge(e.src, chain[0], e.data)
    for e in cfg.out_edges(state):
        cfg.add_edge(chain[-1], e.dst, e.data)
    cfg.remove_node(state)
    if was_start:
        cfg.start_block = cfg.node_id(chain[0])


@register_pass
@attrs.frozen
class SplitOperations(Pass):
    """Give every operation a state of its own (see `gradflow.analysis.ops`)."""

    name: ClassVar[str] = "split_operations"

    def run(self, graph: Graph) -> PassResult:
        if all(len(decompose(s)) <= 1 for s in graph.sdfg.states()):
            return Success(graph)
        sdfg = graph.editable()
        for state in list(sdfg.states()):
            _split_state(state)
        sdfg.reset_cfg_list()
        return Success(Graph.adopt(sdfg, graph.meta))


def normalize_pipeline(library_rules: RuleTable | None = None) -> "Pipeline":
    """The normalization pipeline; `library_rules` decides which library nodes stay whole (default: the
    built-in table). Reverse mode needs its output: structured control flow, one operation per state, no
    views, no breaks."""
    from gradflow.autodiff.jumps import LowerBreaks
    from gradflow.autodiff.lifting import LiftControlFlow
    from gradflow.autodiff.shapes import BoundTransientShapes
    from gradflow.autodiff.views import RemoveViews

    expand = ExpandLibraryNodes(library_rules if library_rules is not None else default_library_rules())
    return Pipeline((LiftControlFlow(), LowerBreaks(), RemoveViews(), expand, BoundTransientShapes(), CollapseMaps(),
                     SplitOperations()))


#: The normalization pipeline with the built-in library table.
NORMALIZE = normalize_pipeline()
