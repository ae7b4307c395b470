"""Floating-point symbols computed from data, made values again (`demote_data_symbols`).

DaCe's frontend turns a scalar that a condition reads into a symbol assigned on an interstate edge: in

    for j in dace.map[0:P]:
        rx = r[j, 0]
        if rx * rx > 1.0:
            out[j] = rx / 2

`rx = r[j, 0]` becomes an assignment on the edge into the branch, and the tasklet computing `out[j]` reads
the symbol `rx` by name. A symbol is a constant to the code that reads it, so no derivative could flow
through it (reverse and forward mode refuse such reads, `analysis.symbols`). This pass gives each such
symbol a value: a transient scalar written, right after every edge that assigns the symbol, by a tasklet
computing the same expression from the same array elements through memlets; the tasklets that read the
symbol read that scalar instead. The symbol itself stays, for the conditions and loop headers that read
it (their decisions have no derivative).

A symbol is left alone (and its readers still refused) when it is read anywhere else than by Python
tasklet code and interstate edges (a memlet, a map range, a nested SDFG's symbols), when its SDFG is handed
its initial value from outside, when its value reads such a symbol, or when its value reads a symbol its
edge assigns after it (the old value, which the state after the edge no longer sees).
"""

from __future__ import annotations

import ast
import re
from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState
from returns.result import Success

from gradflow.analysis.symbols import assigned_types
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass
from gradflow.transforms.indirection import swap_element_reads

_NAME = re.compile(r"[A-Za-z_]\w*")


def _value(symbol: str) -> str:
    return f"gradflow_value_{symbol}"


def _code_names(tasklet: nd.Tasklet) -> set[str]:
    return set(_NAME.findall(tasklet.code.as_string))


def _candidates(sdfg: dace.SDFG) -> list[str]:
    """The floating-point symbols of `sdfg` assigned from arrays (directly or through one another) that
    the pass can demote (module doc)."""
    types = assigned_types(sdfg)
    floats = {n for n, t in types.items() if t in (dace.float32, dace.float64)}
    edges = [e for e in sdfg.all_interstate_edges() if e.data.assignments]
    reads: dict[str, set[str]] = {}
    for e in edges:
        for name, expr in e.data.assignments.items():
            if name in floats:
                reads.setdefault(name, set()).update(_NAME.findall(str(expr)))
    arrays = set(sdfg.arrays)
    computed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, names in reads.items():
            if name not in computed and (names & arrays or names & computed):
                computed.add(name)
                changed = True
    parent = sdfg.parent_nsdfg_node
    blocked = set(parent.symbol_mapping) & computed if parent is not None else set()
    for e in edges:  # a value reading a symbol the same edge assigns after it reads its old value, which
        # the state after the edge no longer sees
        order = list(e.data.assignments)
        for k, name in enumerate(order):
            if name in computed and set(_NAME.findall(str(e.data.assignments[name]))) & set(order[k + 1:]):
                blocked.add(name)
    for state in sdfg.states():
        for node in state.nodes():
            if isinstance(node, nd.Tasklet):
                if node.language != dace.dtypes.Language.Python:
                    blocked |= _code_names(node) & computed
            elif isinstance(node, nd.MapEntry):
                blocked |= {str(s) for s in node.map.range.free_symbols} & computed
            elif isinstance(node, nd.NestedSDFG):
                blocked |= {str(s) for v in node.symbol_mapping.values()
                            for s in dace.symbolic.pystr_to_symbolic(str(v)).free_symbols} & computed
        for e in state.edges():
            blocked |= {str(s) for s in e.data.free_symbols} & computed
    changed = True
    while changed:  # a value computed from a symbol left alone would take that symbol for a constant
        changed = False
        for name in sorted(computed - blocked):
            if reads[name] & blocked:
                blocked.add(name)
                changed = True
    kept = computed - blocked
    wanted = {n for state in sdfg.states() for node in state.nodes() if isinstance(node, nd.Tasklet)
              for n in _code_names(node) & kept - set(node.in_connectors) - set(node.out_connectors)}
    while True:  # and the symbols their values are computed from (a second run finds nothing to do)
        more = {n for w in wanted for n in reads[w] & kept} - wanted
        if not more:
            return sorted(wanted)
        wanted |= more


def _rename(code: str, names: dict[str, str]) -> str:
    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return ast.Name(names[node.id], node.ctx) if node.id in names else node

    return ast.unparse(Rename().visit(ast.parse(code)))


def _demote(sdfg: dace.SDFG, symbols: list[str]) -> None:
    types = assigned_types(sdfg)
    chosen = set(symbols)
    for name in symbols:
        if _value(name) not in sdfg.arrays:
            sdfg.add_scalar(_value(name), types[name], transient=True)
    made: set[nd.Tasklet] = set()
    # 1. after every edge assigning a chosen symbol, a state computing its value
    for region in list(sdfg.all_control_flow_regions()):
        for edge in list(region.edges()):
            assigned = [n for n in edge.data.assignments if n in chosen]
            if not assigned:
                continue
            state = region.add_state(f"value_of_{'_'.join(assigned)}")
            region.remove_edge(edge)
            region.add_edge(edge.src, state, edge.data)
            region.add_edge(state, edge.dst, dace.InterstateEdge())
            lines: list[str] = []
            inputs: dict[str, dace.Memlet] = {}
            local: set[str] = set()
            for name, expr in edge.data.assignments.items():  # in order: a later one may read an earlier one
                if name not in chosen:
                    continue  # (the state comes after the edge: a chosen value reads such a symbol's new value)
                value = ast.parse(str(expr), mode="eval").body
                code, reads = swap_element_reads(value, sdfg.arrays, "__a", len(inputs), whole_scalars=True)
                for array, subset in reads:
                    inputs[f"__a{len(inputs)}"] = dace.Memlet(f"{array}[{subset}]")
                used = {s for s in _NAME.findall(code) if s in chosen and s not in local}
                code = _rename(code, {s: f"__v_{s}" for s in used} | {s: f"__l_{s}" for s in local
                                                                      if s in _NAME.findall(code)})
                for s in used:
                    inputs[f"__v_{s}"] = dace.Memlet(f"{_value(s)}[0]")
                lines.append(f"__l_{name} = {code}")
                local.add(name)
            lines += [f"__o_{n} = __l_{n}" for n in assigned]
            tasklet = state.add_tasklet(f"value_of_{assigned[0]}", dict.fromkeys(inputs),
                                        dict.fromkeys(f"__o_{n}" for n in assigned), "\n".join(lines))
            made.add(tasklet)
            for conn, memlet in inputs.items():
                state.add_edge(state.add_read(memlet.data), None, tasklet, conn, memlet)
            for n in assigned:
                state.add_edge(tasklet, f"__o_{n}", state.add_write(_value(n)), None, dace.Memlet(f"{_value(n)}[0]"))
    # 2. tasklets read the values instead of the symbols
    for state in list(sdfg.states()):
        for node in list(state.nodes()):
            if not isinstance(node, nd.Tasklet) or node in made:
                continue
            read = sorted(_code_names(node) & chosen - set(node.in_connectors) - set(node.out_connectors))
            if read:
                _read_values(state, node, read)
    sdfg.reset_cfg_list()


def _read_values(state: SDFGState, tasklet: nd.Tasklet, used: list[str]) -> None:
    tasklet.code.as_string = _rename(tasklet.code.as_string, {s: f"__v_{s}" for s in used})
    scopes: list[nd.EntryNode] = []
    entry = state.entry_node(tasklet)
    while entry is not None:
        scopes.insert(0, entry)
        entry = state.entry_node(entry)
    for s in used:
        tasklet.add_in_connector(f"__v_{s}")
        state.add_memlet_path(state.add_read(_value(s)), *scopes, tasklet, dst_conn=f"__v_{s}",
                              memlet=dace.Memlet(f"{_value(s)}[0]"))


@register_pass
@attrs.frozen
class DemoteDataSymbols(Pass):
    """Floating-point symbols computed from data get values that tasklets read (module doc)."""

    name: ClassVar[str] = "demote_data_symbols"

    def run(self, graph: Graph) -> PassResult:
        if not any(_candidates(sub) for sub in graph.sdfg.all_sdfgs_recursive()):
            return Success(graph)
        sdfg = graph.editable()
        for sub in list(sdfg.all_sdfgs_recursive()):
            symbols = _candidates(sub)
            if symbols:
                _demote(sub, symbols)
        return Success(Graph.adopt(sdfg, graph.meta))
