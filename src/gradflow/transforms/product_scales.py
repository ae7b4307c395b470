"""`fold_product_scales`: a constant factor of a matrix product's operand becomes the product's `alpha`.

NumPy code writes `ALPHA * A @ x`, which parses as `(ALPHA * A) @ x`: a map writing the scaled matrix
into a temporary as large as `A`, then the product reading it. For a matrix-vector product that map is
as much memory traffic as the product itself, and reverse mode doubles it (the gradient of the temporary,
then `ALPHA` times it into `A`'s). BLAS multiplies by `alpha` for free: `ALPHA * (A @ x)` is the same
product up to rounding (`alpha * Σ a_ij x_j` against `Σ (alpha a_ij) x_j`).

The pass rewrites, in every state, a map and a `MatMul`, `Gemm` or `Gemv` node when all of this holds:
the map holds one tasklet `t[p] = c * s[p]` (or `s[p] * c`), with `c` a number and `p` the map's
parameters, over the whole of `t` (same shape and type as `s`); `t` is a transient that this map writes,
this product reads, and nothing else in the SDFG names; the product does not write `s`. The product then
reads `s` directly, with `alpha` multiplied by `c`. `Dot` (no `alpha`) and batched products (DaCe's
`BatchedMatMul` ignores `alpha`) are left alone.

It runs in `NORMALIZE` (reverse mode then sees one product, whose rule scales both gradients by
`alpha`) and at the start of `OPTIMIZE` (a program compiled forward only gets the same product).
"""

from __future__ import annotations

import ast
import numbers
from typing import ClassVar

import attrs
import dace
import sympy
from dace.libraries.blas import Gemm, Gemv, MatMul
from dace.sdfg import nodes as nd
from dace.sdfg.graph import MultiConnectorEdge

from gradflow.analysis.access import named_by_control
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass

#: the operand connectors of each product node that `alpha` multiplies
_OPERANDS = {MatMul: ("_a", "_b"), Gemm: ("_a", "_b"), Gemv: ("_A", "_x")}


@attrs.frozen
class ScaledOperand:
    """A product `node` reading transient `scaled` (= `factor` * `source`) written by the map `entry`."""

    node: nd.LibraryNode
    edge: MultiConnectorEdge[dace.Memlet]  # the product's in-edge from the temporary
    entry: nd.MapEntry
    source: nd.AccessNode
    scaled: nd.AccessNode
    factor: float | int


def _number(node: ast.AST) -> float | int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.Constant) and isinstance(node.value, numbers.Real) and not isinstance(node.value, bool):
        return node.value
    return None


def _factor(tasklet: nd.Tasklet, inp: str, out: str) -> float | int | None:
    """`c` when the tasklet's code is `out = c * inp` or `out = inp * c` (any parentheses), else None."""
    if tasklet.language != dace.dtypes.Language.Python:
        return None
    try:
        body = ast.parse(tasklet.code.as_string).body
    except SyntaxError:
        return None
    if len(body) != 1 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1:
        return None
    target, value = body[0].targets[0], body[0].value
    if not (isinstance(target, ast.Name) and target.id == out and isinstance(value, ast.BinOp)
            and isinstance(value.op, ast.Mult)):
        return None
    for one, other in ((value.left, value.right), (value.right, value.left)):
        if isinstance(other, ast.Name) and other.id == inp and _number(one) is not None:
            return _number(one)
    return None


def indexes_whole(sdfg: dace.SDFG, entry: nd.MapEntry, name: str, subset) -> bool:
    """`subset` is `name[p0, p1, ...]` for the map's parameters in order, and the map covers all of `name`."""
    shape = sdfg.arrays[name].shape
    params = entry.map.params
    if len(shape) != len(params) or len(subset) != len(params):
        return False
    for (begin, end, step), size, (lo, hi, st), param in zip(entry.map.range, shape, subset, params):
        if step != 1 or sympy.simplify(sympy.sympify(begin)) != 0 or sympy.simplify(end - (size - 1)) != 0:
            return False
        if str(lo) != param or str(hi) != param or st != 1:
            return False
    return True


def _named_elsewhere(sdfg: dace.SDFG, name: str, node: nd.AccessNode) -> bool:
    """Anything in `sdfg` but `node` names `name`: another access node, an interstate edge, a loop's or a
    conditional's code."""
    if any(isinstance(n, nd.AccessNode) and n.data == name and n is not node for n, _ in sdfg.all_nodes_recursive()):
        return True
    return named_by_control(sdfg, name)


def _squeezed_rank(memlet) -> int:
    return sum(1 for size in memlet.subset.size() if size != 1)


def _plain_product(state: dace.SDFGState, node: nd.LibraryNode, scaled_edge) -> bool:
    """A `MatMul` that DaCe specializes to a Gemm or Gemv (which apply `alpha`): the scaled operand is a
    matrix and no operand has more than two dimensions of extent other than 1 (`Dot` and `BatchedMatMul`
    ignore `alpha`). `Gemm` and `Gemv` nodes apply it as they are."""
    if not isinstance(node, MatMul):
        return True
    ranks = [_squeezed_rank(e.data) for e in state.all_edges(node)]
    return _squeezed_rank(scaled_edge.data) == 2 and max(ranks) <= 2


def _scaled_operand(state: dace.SDFGState, node: nd.LibraryNode, edge) -> ScaledOperand | None:
    sdfg = state.sdfg
    scaled = edge.src
    if not isinstance(scaled, nd.AccessNode) or state.in_degree(scaled) != 1 or state.out_degree(scaled) != 1:
        return None
    desc = sdfg.arrays[scaled.data]
    if not desc.transient or isinstance(desc, dace.data.View) or _named_elsewhere(sdfg, scaled.data, scaled):
        return None
    [write] = state.in_edges(scaled)
    if not isinstance(write.src, nd.MapExit) or write.data.wcr is not None:
        return None
    entry = state.entry_node(write.src)
    if state.entry_node(entry) is not None:
        return None
    body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    if len(body) != 1 or not isinstance(body[0], nd.Tasklet) or state.in_degree(entry) != 1:
        return None
    tasklet = body[0]
    [read_in] = state.in_edges(entry)
    ins, outs = state.in_edges(tasklet), state.out_edges(tasklet)
    source = read_in.src
    if (len(ins) != 1 or len(outs) != 1 or not isinstance(source, nd.AccessNode) or outs[0].data.wcr is not None
            or ins[0].data.data != source.data or outs[0].data.data != scaled.data):
        return None
    src_desc = sdfg.arrays[source.data]
    if isinstance(src_desc, dace.data.View) or src_desc.dtype != desc.dtype:
        return None
    if len(src_desc.shape) != len(desc.shape) or any(
            sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) != 0 for a, b in zip(src_desc.shape, desc.shape)):
        return None
    if not (indexes_whole(sdfg, entry, scaled.data, outs[0].data.subset)
            and indexes_whole(sdfg, entry, source.data, ins[0].data.subset)):
        return None
    if any(e.data.data == source.data for e in state.out_edges(node)):
        return None  # the product would read what it writes
    factor = _factor(tasklet, ins[0].dst_conn, outs[0].src_conn)
    if factor is None:
        return None
    return ScaledOperand(node, edge, entry, source, scaled, factor)


def _candidates(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, ScaledOperand]]:
    found = []
    for state in sdfg.states():
        for node in state.nodes():
            conns = _OPERANDS.get(type(node))
            if conns is None:
                continue
            for edge in state.in_edges(node):
                if edge.dst_conn in conns and _plain_product(state, node, edge):
                    match = _scaled_operand(state, node, edge)
                    if match is not None:
                        found.append((state, match))
    return found


def _fold(state: dace.SDFGState, match: ScaledOperand) -> None:
    sdfg = state.sdfg
    node, edge = match.node, match.edge
    memlet = dace.Memlet(data=match.source.data, subset=edge.data.subset)
    state.add_edge(match.source, None, node, edge.dst_conn, memlet)
    scope = state.scope_subgraph(match.entry, include_entry=True, include_exit=True).nodes()
    state.remove_nodes_from(list(scope) + [match.scaled])
    sdfg.remove_data(match.scaled.data, validate=False)
    alpha = node.alpha * match.factor
    node.alpha = int(alpha) if isinstance(alpha, numbers.Integral) else float(alpha)


@register_pass
@attrs.frozen
class FoldProductScales(RewritePass):
    """A product reading `c * s` through a temporary reads `s`, with `alpha` times `c` (module doc)."""

    name: ClassVar[str] = "fold_product_scales"

    strategy: ClassVar[str] = ONE_AT_A_TIME  # a fold changes the operands of the next
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _fold(*match)
