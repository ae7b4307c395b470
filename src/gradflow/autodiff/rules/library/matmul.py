"""Matrix and vector products: `MatMul` (what `@`, `np.dot` and `np.matmul` become), `Gemm`, `Gemv` and
`Dot`, on any subsets of larger arrays (slices, a column used as a vector, one element as the result).

Each node is read as the product DaCe computes (`_factors.product_of`): `out[o] = alpha * Σ x[i] y[j]`, an
einsum over the operands' logical indices (e.g. `ij = ik, kj` for a Gemm, `i = ik, k` for a Gemv,
` = k, k` for a dot product). Its reverse is the same einsum moved around:
    gx[i] += alpha * Σ gout[o] y[j]        gy[j] += alpha * Σ x[i] gout[o]
each emitted by `_contract.contract` into exactly the subsets of the gradient buffers the operands occupy:
a `Gemm` or `Gemv` node with beta = 1 (BLAS once compiled) where the layout allows, else a map. Then the
output's gradient is cleared on its subset (scaled by beta for an in-place Gemm or Gemv update, kept for
an accumulating write). Batched products (3-D and more) go through `_batched`.
"""

from __future__ import annotations

import dace
from dace.libraries.blas import Dot, Gemv

from gradflow.analysis.ops import constant_beta
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.autodiff.protocols import library_rule
from gradflow.autodiff.rules.library._batched import batched_reverse
from gradflow.autodiff.rules.library._common import (
    Operand,
    accumulates,
    bilinear_needs,
    clear,
    disjoint,
    element,
    node_of,
    operands,
    ranges_over,
    where,
)
from gradflow.autodiff.rules.library._contract import Term, contract
from gradflow.autodiff.rules.library._factors import (
    Factor,
    Product,
    layout_issue,
    product_of,
)
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.wcr import SUM

#: Input connectors (first, second) and the output connector of each node class.
_CONNECTORS = {Dot: ("_x", "_y", "_result"), Gemv: ("_A", "_x", "_y")}


def _operands(site: OpSite) -> tuple[Operand, Operand, Operand, Operand | None]:
    """(first, second, output, output read back) of the node: a Gemm with beta != 0 reads C through `_c`,
    a Gemv through `_y`."""
    ins, outs = operands(site)
    first, second, out = _CONNECTORS.get(type(node_of(site)), ("_a", "_b", "_c"))
    return ins[first], ins[second], outs[out], ins.get(out)


def _alpha(node):
    """The node's alpha as the node holds it (a number): DaCe's expansions of the nodes emitted here
    compare it with numbers, which a string would break (`sdfg.compile()` of the result)."""
    return getattr(node, "alpha", 1)  # Dot has no alpha


def _product(site: OpSite) -> Product:
    """The product the site's node computes, or `NotDifferentiableError` saying why there is none."""
    node = node_of(site)
    a, b, c, c_in = _operands(site)
    product = product_of(node, a, b, c)
    if product is None:
        raise NotDifferentiableError(
            f"{where(site)}: operands {a.array}[{a.subset}], {b.array}[{b.subset}] -> {c.array}[{c.subset}] are not "
            "a matrix or vector product DaCe computes (after squeezing extent-1 dimensions)")
    if any(op.array == c.array and not disjoint(op.subset, c.subset) for op in (a, b)):
        raise NotDifferentiableError(f"{where(site)}: the product overwrites its own operand '{c.array}'",
                                     "write the result to a new array")
    if c_in is not None and (c_in.array != c.array or c_in.subset != c.subset):
        raise NotDifferentiableError(
            f"{where(site)}: it reads its output from {c_in.array}[{c_in.subset}] and writes {c.array}[{c.subset}]; "
            "DaCe passes one pointer for that connector, so such a node computes alpha * A @ B only (its "
            "expansions ignore C_in, the value read back)",
            "update the output in place (C = alpha * A @ B + beta * C), or add beta * C_in with a separate operation")
    if product.kind == "batched" and (getattr(node, "transA", False) or getattr(node, "transB", False)):
        raise NotDifferentiableError(f"{where(site)}: a batched product with transposed operands")
    issue = layout_issue(product, site.state.sdfg)
    if issue is not None:
        raise NotDifferentiableError(f"{where(site)}: {issue}",
                                     "copy the operand into an array of its own first (e.g. with np.copy)")
    return product


def _gram(product: Product) -> bool:
    """`X^T X` or `X X^T`: both factors are one operand, summed over the same dimension. Its gradient
    `X (G + G^T)` (or `(G + G^T) X`) is one product where the general rule makes two."""
    x, y = product.x, product.y
    return (product.kind == "gemm" and x.op.array == y.op.array and str(x.op.subset) == str(y.op.subset)
            and x.dims == y.dims and product.oi == "ij" and (product.xi, product.yi) in (("ki", "kj"), ("ik", "jk")))


def _symmetrized(ctx: ReverseContext, label: str, out: Term) -> Term:
    """`G + G^T` of the output's gradient `G` (square), in a new transient, as a factor lettered like `G`."""
    n = out.factor.sizes()[0]
    name, _ = ctx.sdfg.add_array(f"gradflow_t_{label}_sym", [n, n], ctx.sdfg.arrays[out.array].dtype, transient=True,
                                 find_new_name=True)
    add_element_tasklet(ctx.new_state(f"reverse_{label}_sym"), f"sym_{label}", {"__s0": f"0:{n}", "__s1": f"0:{n}"},
                        {"__a": dace.Memlet(out.at({"i": "__s0", "j": "__s1"})),
                         "__b": dace.Memlet(out.at({"i": "__s1", "j": "__s0"}))},
                        "__o = __a + __b", {"__o": dace.Memlet(f"{name}[__s0, __s1]")})
    whole = Operand("_c", name, dace.subsets.Range.from_array(ctx.sdfg.arrays[name]))
    return Term(name, Factor(whole, (0, 1)), out.letters)


def _dot_reverse(ctx: ReverseContext, label: str, out: Term, gx: Term, gy: Term, x: Term, y: Term) -> None:
    """Both gradients of a dot product `r = Σ x[k] y[k]` in one map: `gx[k] += g * y[k]`, `gy[k] += x[k] * g`.
    Two maps (the general route, one `contract` per operand) would walk the vectors twice; the columns of
    a Gram-Schmidt step are strided, one cache line per element."""
    params = {"k": "__k"}
    size = x.factor.sizes()[0]
    add_element_tasklet(ctx.new_state(f"reverse_{label}_gxy"), f"rev_{label}_gxy", {"__k": f"0:{size}"},
                        {"__g": dace.Memlet(out.at({})), "__x": dace.Memlet(x.at(params)),
                         "__y": dace.Memlet(y.at(params))},
                        "__ox = __g * __y\n__oy = __x * __g",
                        {"__ox": dace.Memlet(gx.at(params), wcr=SUM), "__oy": dace.Memlet(gy.at(params), wcr=SUM)})


@library_rule("MatMul", "Gemm", "Gemv", "Dot")
class ProductReverse:
    """Reverse of a matrix or vector product on any subsets (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        a, b, c, _ = _operands(site)
        return bilinear_needs(ctx, a, b, c)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node = node_of(site)
        a, b, c, _ = _operands(site)
        product = _product(site)  # checked even when inactive: such a node computes something else
        gc = ctx.grad_of(c.array)
        if gc is None:
            return
        label = f"{site.state.label}_{node.label}"
        alpha = _alpha(node)
        if product.kind == "batched":
            values = {op.array: ctx.value_of(site.index, op.array) for op in (a, b)}
            batched_reverse(ctx, label, a, b, c, values, alpha)
        else:
            out = Term(gc, product.out, product.oi)
            x = Term(ctx.value_of(site.index, product.x.op.array), product.x, product.xi)
            y = Term(ctx.value_of(site.index, product.y.op.array), product.y, product.yi)
            gx, gy = ctx.grad_of(x.factor.op.array), ctx.grad_of(y.factor.op.array)
            if gx and gy and product.kind == "dot" and gx != gy:
                _dot_reverse(ctx, label, out, Term(gx, x.factor, x.letters), Term(gy, y.factor, y.letters), x, y)
                gx = gy = None
            if gx and _gram(product):
                both = _symmetrized(ctx, label, out)
                contract(ctx, f"{label}_g{x.factor.op.conn}", Term(gx, x.factor, x.letters), both, y, alpha)
                gx = gy = None
            if gx:
                contract(ctx, f"{label}_g{x.factor.op.conn}", Term(gx, x.factor, x.letters), out, y, alpha)
            if gy:
                contract(ctx, f"{label}_g{y.factor.op.conn}", Term(gy, y.factor, y.letters), x, out, alpha)
        self._finish(site, ctx, c, label)

    @staticmethod
    def _finish(site: OpSite, ctx: ReverseContext, c: Operand, label: str) -> None:
        """The output's old value: cleared (overwritten), scaled by beta (updated in place), or kept (a
        write-conflict sum)."""
        node = node_of(site)
        if accumulates(c, site):
            return
        beta = getattr(node, "beta", 0)
        if constant_beta(node) == 0.0:
            clear(ctx, c, label)
            return
        ranges, params = ranges_over(c, "__k")
        index = element(c, params)
        g = ctx.grad_of(c.array)
        add_element_tasklet(ctx.new_state(f"scale_{label}"), f"scale_{c.array}", ranges or None,
                            {"__g": dace.Memlet(f"{g}[{index}]")}, f"__o = ({beta}) * __g",
                            {"__o": dace.Memlet(f"{g}[{index}]")})
