"""`hoist_row_products`: a loop computing one row of a matrix product per iteration computes the whole
product once, before the loop, and reads its rows.

PolyBench's covariance and correlation (NPBench's form) fill a triangle row by row:

    for i in range(M):
        cov[i, i:M] = data[:, i] @ data[:, i:M] / (N - 1)

a vector-matrix product per iteration, each reading a column of `data` and the block to its right: BLAS-2
speed (each element of `data` fetched from memory once per row), about M^2 N / 2 multiply-adds. The
product of all columns, `full = data^T @ data`, is one BLAS-3 `Gemm` of twice that work that runs many
times faster, and reverse mode differentiates it as one product (two more `Gemm`s) instead of a
vector-matrix product and an outer product per iteration. JAX's and torch's versions of these kernels
do this.

A `MatMul` in a state of a counted loop's body is hoisted when all of this holds: its first operand is
one column `X[r0:r1, c]` and its second a block of columns `Y[r0:r1, b0:b1]` of 2-D arrays, with the rows
the same range for both and independent of the loop (no loop variable, nothing assigned in the loop);
no node in the loop writes `X` or `Y`; the column `c` is the loop variable plus a constant, and the loop
runs about once per column of `X` (the trip count and the column count differ by a constant: the
product of all columns is then at most about twice the work the loop did); the product is not
transposed, has `beta` 0 and no `_cin`, and writes an access node. A new state before the loop computes
`full = alpha * X[r0:r1, :]^T @ Y[r0:r1, :]` (a `MatMul` with `transA`, a `Gemm` once specialized), and
the node becomes a copy of `full[c, b0:b1]`.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
import sympy
from dace import symbolic
from dace.libraries.blas import MatMul
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion

from gradflow.analysis.loops import assigned_symbols, counted_loop
from gradflow.analysis.ops import constant_beta
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass


@attrs.frozen
class RowProduct:
    """`node` in `state` of `loop` computes row `column` of `first^T @ second` over `rows`, columns `cols`."""

    loop: LoopRegion
    state: dace.SDFGState
    node: MatMul
    first: str
    second: str
    rows: tuple  # (begin, end) inclusive
    column: sympy.Expr
    cols: tuple  # (begin, end) inclusive, of the second operand


def _written(loop: LoopRegion) -> set[str]:
    return {n.data for n, state in loop.all_nodes_recursive()
            if isinstance(n, nd.AccessNode) and isinstance(state, dace.SDFGState) and state.in_degree(n)}


def _edges(state: dace.SDFGState, node: MatMul):
    ins = {e.dst_conn: e for e in state.in_edges(node)}
    outs = state.out_edges(node)
    return ins.get("_a"), ins.get("_b"), (outs[0] if len(outs) == 1 else None), set(ins) - {"_a", "_b"}


def _loop_invariant(expr, variant: set[str]) -> bool:
    return not {str(s) for s in sympy.sympify(expr).free_symbols} & variant


def _match(loop: LoopRegion, state: dace.SDFGState, node: MatMul, var: str, trips, variant: set[str],
           written: set[str]) -> RowProduct | None:
    sdfg = state.sdfg
    a, b, c, others = _edges(state, node)
    if a is None or b is None or c is None or others or node.transA or node.transB or constant_beta(node) != 0.0:
        return None
    if c.data.wcr is not None or not isinstance(c.dst, nd.AccessNode):
        return None
    if a.data.data in written or b.data.data in written:
        return None
    xa, xb = sdfg.arrays[a.data.data], sdfg.arrays[b.data.data]
    if len(xa.shape) != 2 or len(xb.shape) != 2 or xa.dtype != xb.dtype:
        return None
    (ra0, ra1, sa), (ca0, ca1, _) = a.data.subset.ndrange()
    (rb0, rb1, sb), (cb0, cb1, sc) = b.data.subset.ndrange()
    if sa != 1 or sb != 1 or sc != 1 or ca0 != ca1:
        return None
    if sympy.simplify(ra0 - rb0) != 0 or sympy.simplify(ra1 - rb1) != 0:
        return None
    if not (_loop_invariant(ra0, variant) and _loop_invariant(ra1, variant)):
        return None
    offset = sympy.simplify(sympy.sympify(ca0) - symbolic.symbol(var))
    if not offset.is_Integer:
        return None  # the column is not the loop variable plus a constant
    if not sympy.simplify(trips - xa.shape[1]).is_Integer:
        return None  # the loop does not run about once per column
    out = c.data.subset if c.data.data == c.dst.data else c.data.dst_subset
    if out is None or len([s for s in out.size() if s != 1]) != 1:
        return None
    return RowProduct(loop, state, node, a.data.data, b.data.data, (ra0, ra1), sympy.sympify(ca0), (cb0, cb1))


def _candidates(sdfg: dace.SDFG) -> list[RowProduct]:
    found = []
    for loop in sdfg.all_control_flow_regions():
        if not isinstance(loop, LoopRegion):
            continue
        assigned = assigned_symbols(loop)
        counted = counted_loop(loop, assigned)
        if counted is None:
            continue
        numerator, divisor = counted.trip_count()
        if divisor != 1:
            continue
        variant = set(assigned) | {counted.var}
        written = _written(loop)
        for state in loop.nodes():
            if not isinstance(state, dace.SDFGState):
                continue
            for node in state.nodes():
                if type(node) is MatMul:
                    match = _match(loop, state, node, counted.var, numerator, variant, written)
                    if match is not None:
                        found.append(match)
    return found


def _hoist(sdfg: dace.SDFG, r: RowProduct) -> None:
    region = r.loop.parent_graph
    x, y = sdfg.arrays[r.first], sdfg.arrays[r.second]
    full, _ = sdfg.add_array(f"gradflow_full_{r.first}_{r.second}", [x.shape[1], y.shape[1]], x.dtype,
                             transient=True, find_new_name=True)
    was_start = region.start_block is r.loop
    before = region.add_state(f"hoisted_{r.state.label}", is_start_block=was_start)
    for e in list(region.in_edges(r.loop)):
        region.add_edge(e.src, before, e.data)
        region.remove_edge(e)
    region.add_edge(before, r.loop, dace.InterstateEdge())
    rows = f"{symbolic.symstr(r.rows[0])}:{symbolic.symstr(r.rows[1])} + 1"
    product = MatMul("row_products", alpha=r.node.alpha, beta=0, transA=True)
    before.add_node(product)
    before.add_edge(before.add_read(r.first), None, product, "_a",
                    dace.Memlet(f"{r.first}[{rows}, 0:{symbolic.symstr(x.shape[1])}]"))
    before.add_edge(before.add_read(r.second), None, product, "_b",
                    dace.Memlet(f"{r.second}[{rows}, 0:{symbolic.symstr(y.shape[1])}]"))
    before.add_edge(product, "_c", before.add_write(full), None, dace.Memlet.from_array(full, sdfg.arrays[full]))

    state, node = r.state, r.node
    [out] = state.out_edges(node)
    sources = list(dict.fromkeys(e.src for e in state.in_edges(node)))
    target_subset = out.data.subset if out.data.data == out.dst.data else out.data.dst_subset
    row = f"{symbolic.symstr(r.column)}, {symbolic.symstr(r.cols[0])}:{symbolic.symstr(r.cols[1])} + 1"
    state.add_edge(state.add_read(full), None, out.dst, out.dst_conn,
                   dace.Memlet(data=full, subset=row, other_subset=str(target_subset)))
    state.remove_node(node)
    for n in sources:
        if state.degree(n) == 0:
            state.remove_node(n)


@register_pass
@attrs.frozen
class HoistRowProducts(RewritePass):
    """A loop of vector-matrix products over the columns of a matrix reads rows of one matrix product
    computed before it (see the module doc)."""

    name: ClassVar[str] = "hoist_row_products"

    strategy: ClassVar[str] = ONE_AT_A_TIME  # a hoist replaces the loop the next match is in
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _hoist(sdfg, match)
