"""Normalization of accesses through index arrays (gathers `A[idx[i]]`, scatters `A[idx[i]] = v`, `+= v`).

DaCe's frontend writes such an access in one of two ways:
- a tasklet that indexes an array connector (`__out = __arr[__inp0]`, `__out[__ind_0] = __inp`), whose memlet
  should cover every element the index may choose; the frontend's scatter `A[idx] = v` gives it the extent
  of `idx` instead (`A[0:M]`), which would make reverse mode store too little of `A` before it is
  overwritten;
- a symbol read from the index array on an interstate edge (`idx_index = idx[i]`) and memlets
  `A[idx_index]`: inside a map (in the nested SDFG of its body) and inside loops.
The pass `lower_indirection` brings both to one form, the first: a symbol read from data whose only uses are
single-element memlets is replaced by tasklets that read the index and index the array (after which DaCe's
simplification inlines the nested SDFG into its map), and every memlet through which a tasklet indexes an
array is widened to the whole array (dynamic). The replacement needs the symbol's value to be the same
where it is used: the index array is never written in that SDFG, the value reads no other changing symbol
(a loop variable of the loops around the assignment is fine: the uses must lie in the same iteration, after
the assignment). Symbols it cannot replace are left alone; reverse mode rejects them with a message naming
the state and symbol.
"""

from __future__ import annotations

import ast
import copy
import re
from typing import ClassVar

import attrs
import dace
import networkx as nx
from dace import subsets
from dace.sdfg import nodes as nd
from dace.sdfg.graph import Edge
from dace.sdfg.state import ConditionalBlock, LoopRegion, SDFGState
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass
from gradflow.transforms.views import simplify


def indexed_connectors(tasklet: nd.Tasklet) -> set[str]:
    """The connectors the tasklet's (Python) code indexes: `conn[...]`."""
    if tasklet.language != dace.dtypes.Language.Python:
        return set()
    try:
        tree = ast.parse(tasklet.code.as_string.strip())
    except SyntaxError:
        return set()
    conns = set(tasklet.in_connectors) | set(tasklet.out_connectors)
    return {n.value.id for n in ast.walk(tree)
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in conns}


# ---- widening ------------------------------------------------------------------------------------------------


def _widen(sdfg: dace.SDFG, dry: bool = False) -> bool:
    """Memlets through which a tasklet indexes an array (at offset zero) cover the whole array, dynamically
    (`dry`: only say whether any would change)."""
    changed = False
    for state in sdfg.states():
        for tasklet in [n for n in state.nodes() if isinstance(n, nd.Tasklet)]:
            conns = indexed_connectors(tasklet)
            if not conns:
                continue
            edges = [e for e in state.in_edges(tasklet) if e.dst_conn in conns] + \
                    [e for e in state.out_edges(tasklet) if e.src_conn in conns]
            for edge in edges:
                if edge.data.is_empty():
                    continue
                desc = sdfg.arrays[edge.data.data]
                whole = subsets.Range.from_array(desc)
                sub = edge.data.subset
                if not (isinstance(sub, subsets.Range) and sub.dims() == whole.dims()
                        and all(b == 0 and s == 1 for b, _, s in sub)):
                    continue  # indices are relative to the memlet's start: the memlet has to be right
                for e in state.memlet_path(edge):
                    if e.data.data != edge.data.data or (e.data.subset == whole and e.data.dynamic):
                        continue
                    if dry:
                        return True
                    e.data.subset = subsets.Range.from_array(desc)
                    e.data.dynamic = True
                    changed = True
    return changed


# ---- symbols read from data ----------------------------------------------------------------------------------


@attrs.frozen
class _Candidate:
    symbol: str
    edge: Edge[dace.InterstateEdge]  # the interstate edge assigning it
    code: str  # its value as tasklet code, reading the element `reads[k]` as `__i<k>`
    reads: tuple[tuple[str, str], ...]  # (array, subset) of each element the value reads


def _index_code(expr: ast.expr, arrays) -> tuple[str, tuple[tuple[str, str], ...]]:
    """`expr` with every array element it reads replaced by a connector `__i<k>`, and those elements."""
    code, reads = swap_element_reads(copy.deepcopy(expr), arrays, "__i")
    return code, tuple(reads)


def swap_element_reads(expr: ast.expr, arrays, prefix: str, start: int = 0,
                       whole_scalars: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """The code of `expr` (changed in place) with each element of `arrays` it reads (`A[i, 0]`; with
    `whole_scalars`, also an array named alone, a scalar container, as element 0) replaced by a connector
    `<prefix><k>` (k from `start` on), and the (array, subset) of each."""
    reads: list[tuple[str, str]] = []

    class Swap(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
            if isinstance(node.value, ast.Name) and node.value.id in arrays:
                # `obs[j, 0]`: a tuple slice unparses as "(j, 0)", which a memlet would read as one tuple
                dims = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                reads.append((node.value.id, ", ".join(ast.unparse(d) for d in dims)))
                return ast.Name(f"{prefix}{start + len(reads) - 1}", ast.Load())
            return self.generic_visit(node)

        def visit_Name(self, node: ast.Name) -> ast.AST:
            if whole_scalars and node.id in arrays:
                reads.append((node.id, "0"))
                return ast.Name(f"{prefix}{start + len(reads) - 1}", ast.Load())
            return node

    return ast.unparse(Swap().visit(expr)), reads


def _array_reads(expr: ast.expr, arrays) -> list[ast.Subscript]:
    return [n for n in ast.walk(expr)
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in arrays]


def _written_arrays(sdfg: dace.SDFG) -> set[str]:
    out = set()
    for state in sdfg.states():
        for n in state.data_nodes():
            if state.in_degree(n) > 0:
                out.add(n.data)
    return out


def _enclosing_loop_variables(region) -> set[str]:
    """Variables of the loops `region` lies in (itself included): constant within one iteration of it."""
    out = set()
    while region is not None and not isinstance(region, dace.SDFG):
        if isinstance(region, LoopRegion) and region.loop_variable:
            out.add(region.loop_variable)
        region = region.parent_graph
    return out


def _candidates(sdfg: dace.SDFG) -> list[_Candidate]:
    """Symbols assigned once, from array elements the SDFG never writes, on an edge whose value cannot change
    before the uses `_dominated` admits (it reads no symbol assigned elsewhere, except variables of the loops
    around the edge, which change only between iterations)."""
    assigned: dict[str, list] = {}
    for edge in sdfg.all_interstate_edges():
        for name, value in edge.data.assignments.items():
            assigned.setdefault(name, []).append((edge, value))
    loop_vars = {r.loop_variable for r in sdfg.all_control_flow_regions() if getattr(r, "loop_variable", None)}
    written = _written_arrays(sdfg)
    found = []
    for name, sites in assigned.items():
        if len(sites) != 1 or name in loop_vars:
            continue
        edge, value = sites[0]
        try:
            expr = ast.parse(str(value), mode="eval").body
        except SyntaxError:
            continue
        reads = _array_reads(expr, sdfg.arrays)
        # the `.value` of each read is an ast.Name (`_array_reads` keeps only those); mypy cannot see that
        if not reads or any(r.value.id in written  # type: ignore[attr-defined]
                            or _array_reads(r.slice, sdfg.arrays) for r in reads):
            continue
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        names -= {r.value.id for r in reads}  # type: ignore[attr-defined]  # an ast.Name, as above
        changing = (set(assigned) | loop_vars) - _enclosing_loop_variables(edge.src.parent_graph)
        if names & changing:
            continue
        code, elements = _index_code(expr, sdfg.arrays)
        found.append(_Candidate(name, edge, code, elements))
    return found


def _mentions(text: str, symbol: str) -> bool:
    return re.search(rf"\b{re.escape(symbol)}\b", text) is not None


def _uses(sdfg: dace.SDFG, symbol: str, assigning) -> list | None:
    """(state, edge) of every memlet using `symbol`, or None when anything else uses it (control flow, map
    ranges, tasklet code, shapes, nested SDFGs)."""
    for edge in sdfg.all_interstate_edges():
        texts = [edge.data.condition.as_string] + [str(v) for v in edge.data.assignments.values()]
        if edge is assigning:
            texts = texts[:1]
        if any(_mentions(t, symbol) for t in texts):
            return None
    for region in sdfg.all_control_flow_regions():
        texts = []
        if isinstance(region, LoopRegion):
            texts = [c.as_string for c in (region.loop_condition, region.init_statement, region.update_statement)
                     if c is not None]
        elif isinstance(region, ConditionalBlock):
            texts = [c.as_string for c, _ in region.branches if c is not None]
        if any(_mentions(t, symbol) for t in texts):
            return None
    for desc in sdfg.arrays.values():
        if symbol in {str(s) for s in desc.free_symbols}:
            return None
    uses = []
    for state in sdfg.states():
        for node in state.nodes():
            if isinstance(node, nd.NestedSDFG) and any(_mentions(str(v), symbol) for v in node.symbol_mapping.values()):
                return None
            if isinstance(node, nd.MapEntry) and _mentions(str(node.map.range), symbol):
                return None
            if isinstance(node, nd.Tasklet) and _mentions(node.code.as_string, symbol):
                return None
        scope = state.scope_dict()
        for edge in state.edges():
            if edge.data.is_empty() or symbol not in {str(s) for s in edge.data.free_symbols}:
                continue
            if scope[edge.src] is not None or scope[edge.dst] is not None:
                return None  # inside a map: not a single element of the state
            uses.append((state, edge))
    return uses


def _dominated(candidate: _Candidate, states) -> bool:
    """Every state in `states` runs after the assignment, in the same iteration of the loops around it: it
    lies in the region of the assigning edge, inside a block that the edge's destination dominates there (and
    only the assigning edge enters that destination)."""
    region, dst = candidate.edge.src.parent_graph, candidate.edge.dst
    if region.in_degree(dst) != 1:
        return False
    idom = nx.immediate_dominators(region.nx, region.start_block)
    for state in states:
        block = state
        while block.parent_graph is not region:
            block = block.parent_graph
            if block is None or isinstance(block, dace.SDFG):
                return False  # outside the region: after its loop, or before it
        while block is not dst:
            parent = idom.get(block)
            if parent is None or parent is block:
                return False
            block = parent
    return True


class _Rewriter:
    """Replaces the memlets of one state that use `symbol` by tasklets that read the index and index the array."""

    def __init__(self, sdfg: dace.SDFG, candidate: _Candidate) -> None:
        self.sdfg = sdfg
        self.candidate = candidate
        self.code = candidate.code

    def _element(self, subset: subsets.Range) -> str | None:
        """The code index of `subset` (one element) with the symbol replaced by the index variable."""
        if subset.num_elements() != 1:
            return None
        parts = []
        for begin, _end, _step in subset:
            parts.append(re.sub(rf"\b{re.escape(self.candidate.symbol)}\b", "(__idx)", str(begin)))
        return ", ".join(parts)

    def _uses_symbol(self, subset) -> bool:
        return subset is not None and self.candidate.symbol in {str(s) for s in subset.free_symbols}

    def check(self, state: SDFGState, edge) -> bool:
        src_sub, dst_sub = edge.data.get_src_subset(edge, state), edge.data.get_dst_subset(edge, state)
        src_uses, dst_uses = self._uses_symbol(src_sub), self._uses_symbol(dst_sub)
        if src_uses == dst_uses:
            return False
        if src_uses:
            return isinstance(edge.src, nd.AccessNode) and self._element(src_sub) is not None
        return isinstance(edge.dst, nd.AccessNode) and self._element(dst_sub) is not None

    def _indirection(self, state: SDFGState, label: str, array: str, index: str, read: bool, wcr=None):
        inputs = {f"__i{k}" for k in range(len(self.candidate.reads))}
        if read:
            inputs.add("__arr")
            code = f"__idx = {self.code}\n__out = __arr[{index}]"
            outputs = {"__out"}
        else:
            inputs.add("__inp")
            code = f"__idx = {self.code}\n__arr[{index}] = __inp"
            outputs = {"__arr"}
        tasklet = state.add_tasklet(label, inputs, outputs, code)
        for k, (arr, sub) in enumerate(self.candidate.reads):
            state.add_edge(state.add_read(arr), None, tasklet, f"__i{k}", dace.Memlet(f"{arr}[{sub}]"))
        whole = dace.Memlet(data=array, subset=subsets.Range.from_array(self.sdfg.arrays[array]), wcr=wcr,
                            dynamic=True, volume=1)
        return tasklet, whole

    def _scalar(self, like: str) -> str:
        name, _ = self.sdfg.add_scalar(f"gradflow_elem_{like}", self.sdfg.arrays[like].dtype, transient=True,
                                       find_new_name=True)
        return name

    def rewrite(self, state: SDFGState, edge) -> None:
        memlet = edge.data
        src_sub, dst_sub = memlet.get_src_subset(edge, state), memlet.get_dst_subset(edge, state)
        label = f"indirect_{self.candidate.symbol}"
        state.remove_edge(edge)
        if self._uses_symbol(src_sub):  # a gather from edge.src
            array = edge.src.data
            index = self._element(src_sub)
            assert index is not None  # `check` accepted this edge: its subset is one element
            tasklet, whole = self._indirection(state, label, array, index, read=True)
            state.add_edge(edge.src, None, tasklet, "__arr", whole)
            if isinstance(edge.dst, nd.AccessNode):
                state.add_edge(tasklet, "__out", edge.dst, None, dace.Memlet(data=edge.dst.data, subset=dst_sub))
            else:
                tmp = self._scalar(array)
                node = state.add_access(tmp)
                state.add_edge(tasklet, "__out", node, None, dace.Memlet(f"{tmp}[0]"))
                state.add_edge(node, None, edge.dst, edge.dst_conn, dace.Memlet(f"{tmp}[0]"))
        else:  # a scatter into edge.dst
            array = edge.dst.data
            index = self._element(dst_sub)
            assert index is not None  # `check` accepted this edge: its subset is one element
            tasklet, whole = self._indirection(state, label, array, index, read=False, wcr=memlet.wcr)
            state.add_edge(tasklet, "__arr", edge.dst, None, whole)
            if isinstance(edge.src, nd.AccessNode):
                state.add_edge(edge.src, None, tasklet, "__inp", dace.Memlet(data=edge.src.data, subset=src_sub))
            else:
                tmp = self._scalar(array)
                node = state.add_access(tmp)
                state.add_edge(edge.src, edge.src_conn, node, None, dace.Memlet(f"{tmp}[0]"))
                state.add_edge(node, None, tasklet, "__inp", dace.Memlet(f"{tmp}[0]"))


def _lower_symbols(sdfg: dace.SDFG) -> bool:
    changed = False
    for candidate in _candidates(sdfg):
        uses = _uses(sdfg, candidate.symbol, candidate.edge)
        if not uses:
            continue
        rewriter = _Rewriter(sdfg, candidate)
        if not all(rewriter.check(state, edge) for state, edge in uses):
            continue
        if not _dominated(candidate, {state for state, _ in uses}):
            continue
        for state, edge in uses:
            rewriter.rewrite(state, edge)
        del candidate.edge.data.assignments[candidate.symbol]
        if candidate.symbol in sdfg.symbols:
            sdfg.remove_symbol(candidate.symbol)
        changed = True
    return changed


@register_pass
@attrs.frozen
class LowerIndirection(Pass):
    """Accesses through index arrays become tasklets indexing whole-array memlets (module doc)."""

    name: ClassVar[str] = "lower_indirection"

    def run(self, graph: Graph) -> PassResult:
        subs = list(graph.sdfg.all_sdfgs_recursive())
        if not any(_candidates(sub) for sub in subs) and not any(_widen(sub, dry=True) for sub in subs):
            return Success(graph)
        sdfg = graph.editable()
        lowered = False
        for sub in list(sdfg.all_sdfgs_recursive()):
            lowered |= _lower_symbols(sub)
        if lowered:
            simplify(sdfg)
        widened = False
        for sub in sdfg.all_sdfgs_recursive():
            widened |= _widen(sub)
        if not (lowered or widened):
            return Success(graph)
        return Success(Graph.adopt(sdfg, graph.meta))
