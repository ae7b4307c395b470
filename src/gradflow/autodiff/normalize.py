"""Normalization: the passes that run before reverse mode, each pure (Graph in, new Graph out), and
`NORMALIZE`, the one pipeline of them that `ad_pipeline` and the nested-SDFG rule both use.

- `lift_control_flow` (`lifting.py`): branches and loops written as conditional interstate edges become
  `ConditionalBlock`s and `LoopRegion`s;
- `lower_breaks` (`jumps.py`): `break` becomes a flag and guarded conditionals;
- `raise_convolutions` (`idioms.py`): loop nests computing a 2-D convolution (NPBench's form) become a
  `Convolution` library node, reversed at op level (before `remove_views`, which rewrites the
  copy of each pixel's result the pattern ends with);
- `remove_views` (`views.py`): accesses through View nodes are rewritten onto the viewed array, or the
  view becomes an array of its own;
- `expand_library_nodes`: library nodes without a reverse rule are expanded into maps and tasklets
  (then `simplify` inlines the nested SDFGs that expansions create, and the views those make are removed
  as `remove_views` does; before the expansions, since an expansion bakes its operands' layouts into the
  nested SDFG it makes);
- `fold_product_scales` (`transforms/product_scales.py`): `(c * A) @ x` reads `A` with the product's
  `alpha` times `c`, so no scaled copy of `A` is made (nor its gradient);
- `hoist_row_products` (`row_products.py`): a loop of vector-matrix products over the columns of a matrix
  reads rows of one matrix product computed before it;
- `raise_loop_reductions` (`loop_reductions.py`): a loop taking the max or min of a row element by element
  becomes a `Reduce` node;
- `lower_indirection` (`indirection.py`): accesses through index arrays become tasklets that index
  whole-array memlets;
- `demote_data_symbols` (`data_symbols.py`): floating-point symbols DaCe made of values computed from
  data (a scalar a condition reads) get transient scalars that the tasklets reading them read instead, so
  derivatives flow through them (after the last pass that runs DaCe's `simplify`, which would undo it);
- `complete_conditional_writes` (`conditional_writes.py`): a tasklet output assigned on some paths only
  reads the old value of its element explicitly;
- `bound_transient_shapes` (`shapes.py`): transients sized by loop variables get their upper-bound size;
- `fuse_maps` (`transforms/fusion.py`): element-wise chains become one map, so reverse mode sees one
  operation (and no temporaries) where the frontend wrote several;
- `collapse_maps`: perfectly nested maps become one multi-dimensional map;
- `split_operations`: every state is split into a chain of states holding one operation each, so that
  "before operation k" is a place in the control flow where a value can be stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState
from dace.transformation.dataflow import MapCollapse
from returns.result import Success

from gradflow.analysis.ops import decompose
from gradflow.autodiff.protocols import LIBRARY, library_rule_for
from gradflow.autodiff.rules import default_library_rules
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, Pipeline, register_pass, table_field
from gradflow.core.rule_table import RuleTable
from gradflow.transforms.views import simplify


def _unresolvable(node: nd.LibraryNode) -> bool:
    """DaCe would pick an implementation the node does not have. Its choice: the node's own, the class's
    default, the library's, then the config's `library.<lib>.default_implementation`, which for DaCe 2.0.0b1's
    `linalg` library is "OpenBLAS", an implementation `TensorDot` lacks."""
    name = getattr(type(node), "_dace_library_name", "")
    impl = node.implementation or type(node).default_implementation
    if impl is None and name:
        impl = dace.library._DACE_REGISTERED_LIBRARIES[name].default_implementation
    if impl is None and name:
        try:
            impl = dace.Config.get("library", name, "default_implementation")
        except KeyError:
            return False
    return impl is not None and impl not in node.implementations and impl != nd.AI_IMPLEMENTATION_NAME


@register_pass
@attrs.frozen
class ExpandLibraryNodes(Pass):
    """Expand every library node that has no op-level rule in `library_rules`, then simplify. A node whose
    default implementation does not exist (`_unresolvable`) is given its `pure` one, for the expansion here
    and, when it is kept whole, for compilation."""

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

        def unresolvable(sdfg: dace.SDFG) -> list[nd.LibraryNode]:
            return [n for n, _ in sdfg.all_nodes_recursive()
                    if isinstance(n, nd.LibraryNode) and _unresolvable(n) and "pure" in n.implementations]

        if not any(pending(s) for s in graph.sdfg.all_sdfgs_recursive()) and not unresolvable(graph.sdfg):
            return Success(graph)
        sdfg = graph.editable()
        expanded = False
        for _ in range(32):  # expansions may produce further library nodes
            for node in unresolvable(sdfg):
                node.implementation = "pure"
            work = [(s, n) for sub in sdfg.all_sdfgs_recursive() for s, n in pending(sub)]
            if not work:
                break
            for state, node in work:
                node.expand(state)
            expanded = True
        if expanded:
            simplify(sdfg)  # also removes the views the expansions made (the program's own went before)
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
        # node ids, in order: the new state's node order (and everything derived from it) is the same in
        # every process, whatever the addresses of the node objects
        members = [state.node(i) for i in sorted(op.nodes)]
        inside = set(members)
        mapped: dict[nd.Node, nd.Node] = {}
        for node in members:
            new.add_node(node)
            mapped[node] = node
        for i in sorted(set(op.reads) | set(op.writes)):
            original = state.node(i)
            mapped[original] = nd.AccessNode(original.data)
            new.add_node(mapped[original])
        for e in state.edges():
            if op.kind == "copy":
                belongs = state.node_id(e.src) in op.reads and state.node_id(e.dst) in op.writes
            else:
                belongs = e.src in inside or e.dst in inside
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


def normalize_pipeline(library_rules: RuleTable | None = None, keep_loops: Iterable[str] = ()) -> "Pipeline":
    """The normalization pipeline; `library_rules` decides which library nodes stay whole (default: the
    built-in table), and the loops labelled in `keep_loops` are not made maps (loops a forwarding policy
    checkpoints by name). Reverse mode needs its output: structured control flow, one operation per state,
    no views, no breaks."""
    from gradflow.transforms.conditional_writes import CompleteConditionalWrites
    from gradflow.transforms.data_symbols import DemoteDataSymbols
    from gradflow.transforms.fusion import FuseMaps
    from gradflow.transforms.idioms import RaiseConvolutions
    from gradflow.transforms.indirection import LowerIndirection
    from gradflow.transforms.jumps import LowerBreaks
    from gradflow.transforms.lifting import LiftControlFlow
    from gradflow.transforms.loop_reductions import RaiseLoopReductions
    from gradflow.transforms.parallel_loops import LoopsToMaps
    from gradflow.transforms.product_scales import FoldProductScales
    from gradflow.transforms.row_products import HoistRowProducts
    from gradflow.transforms.shapes import BoundTransientShapes
    from gradflow.transforms.views import RemoveViews

    expand = ExpandLibraryNodes(library_rules if library_rules is not None else default_library_rules())
    return Pipeline((LiftControlFlow(), LowerBreaks(), RaiseConvolutions(), RemoveViews(), expand, FoldProductScales(),
                     HoistRowProducts(), RaiseLoopReductions(), LowerIndirection(), DemoteDataSymbols(),
                     CompleteConditionalWrites(),
                     BoundTransientShapes(), LoopsToMaps(keep_loops, ragged=False), FuseMaps(), CollapseMaps(),
                     SplitOperations()))


#: The normalization pipeline with the built-in library table.
NORMALIZE = normalize_pipeline()
