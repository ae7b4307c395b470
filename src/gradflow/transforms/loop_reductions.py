"""`raise_loop_reductions`: a loop that takes the maximum (or minimum) of a row element by element becomes
a `Reduce` node.

    m = X[i, 0]
    for j in range(1, M):
        m = max(m, X[i, j])

runs one scalar `max` per element, a chain of dependent operations the C++ compiler cannot vectorize,
and reverse mode tapes `m` and the element read at every iteration (two pushes and two pops per element)
to reverse it. As `m = max(m, reduce_max(X[i, 1:M]))` the forward is a vectorized reduction
(`library/vector_reduce.py`) and the reverse is the `Reduce` rule's: one comparison per element with the
stored maximum, no tape. Max and min are exact in any order, so the values are the loop's; a tie between
elements gets its gradient split equally (as torch's `amax`), where the loop gave it to one of them.

The pass rewrites a counted loop of step 1 or -1 whose body is one state of access nodes and Python
tasklets, where every memlet moves one element, when: the state leaves exactly one element `acc` that
lives after the loop holding `max(acc, X[e(j)])` (or `min`), with `acc`'s initial value read in the
state; `e(j)` has the loop variable `j` in one dimension, as `j + c`, and `X` is written nowhere in the
loop; every other array the state writes is a transient that nothing outside the state names; nothing after
the loop reads the loop variable's last value (outside loops that define it anew). The loop
becomes one state: `Reduce(X[e(lo):e(hi)])` into a new one-element transient (identity: the type's lowest
or highest value, as DaCe's `np.max` and `np.min`), then `acc = max(acc, that)`.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
import networkx as nx
import sympy
from dace import dtypes, symbolic
from dace.libraries.standard import Reduce
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion

from gradflow.analysis.access import named_by_control
from gradflow.analysis.loops import assigned_symbols, counted_loop
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass
from gradflow.core.symbolic import read_tasklet
from gradflow.transforms.idioms import read_elsewhere

_KINDS = {sympy.Max: "max", sympy.Min: "min"}


@attrs.frozen
class LoopReduction:
    """`loop` computes `acc[acc_index] = kind(acc[acc_index], source[subset over the loop])`."""

    loop: LoopRegion
    kind: str
    acc: str
    acc_index: str
    source: str
    subset: str  # of `source`, the loop variable replaced by the range it takes
    locals: tuple[str, ...]  # the body's own transients, which go with it


def _element(memlet) -> bool:
    return memlet.subset is not None and memlet.subset.num_elements() == 1 and memlet.wcr is None


def _values(state: dace.SDFGState):
    """(value of each access node the state writes, element read behind each symbol); None if the state is
    not a dataflow of one-element moves between access nodes and Python tasklets."""
    nodes = state.nodes()
    if not all(isinstance(n, (nd.AccessNode, nd.Tasklet)) for n in nodes):
        return None
    if not all(_element(e.data) for e in state.edges() if not e.data.is_empty()):
        return None
    reads: dict[sympy.Symbol, tuple[str, str]] = {}
    written: dict[nd.AccessNode, sympy.Expr] = {}
    produced: dict[tuple[nd.Tasklet, str], sympy.Expr] = {}

    def value(edge) -> sympy.Expr:
        src = edge.src
        if isinstance(src, nd.Tasklet):
            return produced[(src, edge.src_conn)]
        if src in written:
            return written[src]
        key = (edge.data.data, str(edge.data.subset))
        for symbol, k in reads.items():
            if k == key:
                return symbol
        symbol = sympy.Symbol(f"__r{len(reads)}", real=True)
        reads[symbol] = key
        return symbol

    for node in nx.lexicographical_topological_sort(state.nx, key=lambda n: state.node_id(n)):
        ins = [e for e in state.in_edges(node) if not e.data.is_empty()]
        if isinstance(node, nd.AccessNode):
            if len(ins) > 1:
                return None
            if ins:
                written[node] = value(ins[0])
            continue
        if node.language != dtypes.Language.Python:
            return None
        try:
            meaning = read_tasklet(node.code.as_string, node.in_connectors, node.out_connectors,
                                   constants=map(str, state.sdfg.free_symbols))
        except Exception:  # noqa: BLE001 - code the reader cannot read (UnsupportedCode, ...) is not a match
            return None
        if meaning.reads or meaning.writes:
            return None
        subst = {sympy.Symbol(e.dst_conn, real=True): value(e) for e in ins}
        for conn, expr in meaning.outputs.items():
            produced[(node, conn)] = expr.xreplace(subst)
    return written, reads


def _named_outside(sdfg: dace.SDFG, name: str, state: dace.SDFGState) -> bool:
    return (any(isinstance(n, nd.AccessNode) and n.data == name and s is not state
                for n, s in sdfg.all_nodes_recursive())
            or named_by_control(sdfg, name))


def _range_of(subset: str, var: str, interval) -> str | None:
    """`subset` (one element) with the dimension holding `var` as `var + c` made the range it takes."""
    dims = [sympy.sympify(symbolic.pystr_to_symbolic(d.strip())) for d in subset.split(",")]
    v = symbolic.symbol(var)
    holding = [k for k, d in enumerate(dims) if var in map(str, d.free_symbols)]
    if len(holding) != 1:
        return None
    d = dims[holding[0]].subs({s: v for s in dims[holding[0]].free_symbols if str(s) == var})
    offset = sympy.simplify(d - v)
    if var in map(str, offset.free_symbols):
        return None
    lo, hi = interval
    parts = [symbolic.symstr(x) for x in dims]
    parts[holding[0]] = f"{symbolic.symstr(lo + offset)}:{symbolic.symstr(hi + offset)} + 1"
    return ", ".join(parts)


def _match(sdfg: dace.SDFG, loop: LoopRegion) -> LoopReduction | None:
    blocks = loop.nodes()
    if len(blocks) != 1 or not isinstance(blocks[0], dace.SDFGState):
        return None
    state = blocks[0]
    counted = counted_loop(loop, assigned_symbols(loop))
    if counted is None or abs(counted.step) != 1 or read_elsewhere(sdfg, loop, counted.var):
        return None
    found = _values(state)
    if found is None:
        return None
    written, reads = found
    keys = {(n.data, str(e.data.subset)) for n in written for e in state.in_edges(n)}
    live = [n for n in written if not sdfg.arrays[n.data].transient or _named_outside(sdfg, n.data, state)]
    if len(live) != 1:
        return None
    acc = live[0]
    [write] = state.in_edges(acc)
    acc_key = (acc.data, str(write.data.subset))
    expr = written[acc]
    if type(expr) not in _KINDS or len(expr.args) != 2:
        return None
    init = [s for s, k in reads.items() if k == acc_key]
    if len(init) != 1 or init[0] not in expr.args:
        return None
    [other] = [a for a in expr.args if a != init[0]]
    if other not in reads:
        return None
    source, subset = reads[other]
    if source in {n.data for n in written} or any(k[0] == source for k in keys):
        return None
    if counted.var in map(str, sympy.sympify(symbolic.pystr_to_symbolic(str(write.data.subset))).free_symbols):
        return None
    ranged = _range_of(subset, counted.var, counted.interval())
    if ranged is None:
        return None
    others = tuple(sorted({n.data for n in written if n is not acc}))
    if acc.data in others or any(sdfg.arrays[name].transient is False for name in others):
        return None
    return LoopReduction(loop, _KINDS[type(expr)], acc.data, str(write.data.subset), source, ranged, others)


def _candidates(sdfg: dace.SDFG) -> list[LoopReduction]:
    found = []
    for region in sdfg.all_control_flow_regions():
        if isinstance(region, LoopRegion):
            match = _match(sdfg, region)
            if match is not None:
                found.append(match)
    return found


def _raise(sdfg: dace.SDFG, r: LoopReduction) -> None:
    region = r.loop.parent_graph
    was_start = region.start_block is r.loop
    state = region.add_state(f"{r.loop.label}_{r.kind}", is_start_block=was_start)
    for e in list(region.in_edges(r.loop)):
        region.add_edge(e.src, state, e.data)
    for e in list(region.out_edges(r.loop)):
        region.add_edge(state, e.dst, e.data)
    region.remove_node(r.loop)
    dtype = sdfg.arrays[r.acc].dtype
    identity = dtypes.min_value(dtype) if r.kind == "max" else dtypes.max_value(dtype)
    partial, _ = sdfg.add_array(f"gradflow_{r.kind}_{r.acc}", [1], dtype, transient=True, find_new_name=True)
    red = Reduce(f"{r.kind}_{r.acc}", wcr=f"lambda a, b: {r.kind}(a, b)", axes=None, identity=identity)
    state.add_node(red)
    state.add_edge(state.add_read(r.source), None, red, None, dace.Memlet(f"{r.source}[{r.subset}]"))
    result = state.add_access(partial)
    state.add_edge(red, None, result, None, dace.Memlet(f"{partial}[0]"))
    combine = state.add_tasklet(f"{r.kind}_{r.acc}_combine", {"__a": None, "__b": None}, {"__out": None},
                                f"__out = {r.kind}(__a, __b)")
    state.add_edge(state.add_read(r.acc), None, combine, "__a", dace.Memlet(f"{r.acc}[{r.acc_index}]"))
    state.add_edge(result, None, combine, "__b", dace.Memlet(f"{partial}[0]"))
    state.add_edge(combine, "__out", state.add_write(r.acc), None, dace.Memlet(f"{r.acc}[{r.acc_index}]"))
    for name in r.locals:
        if not any(isinstance(n, nd.AccessNode) and n.data == name for n, _ in sdfg.all_nodes_recursive()):
            sdfg.remove_data(name, validate=False)


@register_pass
@attrs.frozen
class RaiseLoopReductions(RewritePass):
    """A loop taking the max or min of a row element by element becomes a `Reduce` (see the module doc)."""

    name: ClassVar[str] = "raise_loop_reductions"

    strategy: ClassVar[str] = ONE_AT_A_TIME  # a raise changes the loops around the next
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _raise(sdfg, match)
