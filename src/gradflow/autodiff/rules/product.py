"""Products: maps that reduce with a product write-conflict resolution (`P[0] *= f(x[i])` in a `dace.map`,
what a product `Reduce` expands to), and the shared reverse of a product the `Reduce` rule uses.

Forward: Y[o] = Y_old[o] * prod over the iterations i writing Y[o] of f(x_i). The derivative with respect to
one factor is the product of all the others, which division (P / f_i) gets wrong where factors are zero.
The reverse counts, per output element, the zero factors (`nz`), multiplies the non-zero ones (`pnz`) and
sums the zero ones (`sz`, whose value is 0), the old value included as one more factor; then the product
of the factors other than f is
- pnz / f when no factor is zero (f is then not zero either);
- pnz for the one zero factor when exactly one is zero, sz * pnz / f for the others;
- (sz - f) * pnz for either zero factor when exactly two are zero, 0 for the others;
- 0 for every factor when three or more are zero,
as `torch.prod`'s backward. The `sz` terms are 0 but not constant: differentiated again (a Hessian through
forward mode), they carry the tangent of the zero factors that a constant 0 would drop. Backward, in states:
1. nz = (Y_old == 0), pnz = Y_old or 1 where it is 0, sz = Y_old where it is 0, over Y;
2. nz[o] += (f(x_i) == 0), pnz[o] *= f(x_i) or 1 where it is 0, sz[o] += f(x_i) where it is 0, over the map;
3. g_x += g_Y[o] * others(f(x_i)) * df/dx over the map (write-conflict sum);
4. g_Y = g_Y * others(Y_old) -- what flows on to the old value of Y.
Elements of Y the map does not write keep nz, pnz and sz of Y_old alone, so their gradient passes unchanged.
"""

from __future__ import annotations

import copy

import dace
import sympy
from dace.sdfg import nodes as nd

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.elementfn import element_function
from gradflow.autodiff.emit import add_element_tasklet, full_index, map_ranges
from gradflow.autodiff.protocols import reverse_rule
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import assignments_code, derivative
from gradflow.core.wcr import PRODUCT, SUM, reduction_type


def others(factor: str, nz: str, pnz: str, sz: str) -> str:
    """Code for the product of all factors but `factor`, from the zero count, the non-zero product and the
    sum of the zero factors (module doc)."""
    f, z, p, s = (f"({v})" for v in (factor, nz, pnz, sz))
    one = f"({p} if {f} == 0 else {s} * {p} / {f})"
    two = f"(({s} - {f}) * {p} if {f} == 0 else 0.0)"
    return f"({p} / {f} if {z} == 0 else ({one} if {z} == 1 else ({two} if {z} == 2 else 0.0)))"


def product_reverse(ctx: ReverseContext, label: str, ranges: dict[str, str] | None, y: str, yo: str,
                    start: str | None, factor: sympy.Expr, values: dict[str, dace.Memlet],
                    grads: dict[sympy.Symbol, str]) -> tuple[str, str, str]:
    """Steps 1-3 of the module doc for Y[yo] *= factor over `ranges` (None: one tasklet). `start` is the
    array holding Y's value before the product (None: the product starts at 1), `values` the memlets of the
    symbols `factor` reads, `grads` the gradient element (`array[subset]`) of each symbol to differentiate.
    Returns the (nz, pnz, sz) arrays, for step 4."""
    sdfg = ctx.sdfg
    desc = sdfg.arrays[y]
    nz, _ = sdfg.add_array(f"gradflow_t_zeros_{y}", desc.shape, desc.dtype, transient=True, find_new_name=True)
    pnz, _ = sdfg.add_array(f"gradflow_t_nonzero_{y}", desc.shape, desc.dtype, transient=True, find_new_name=True)
    sz, _ = sdfg.add_array(f"gradflow_t_zerosum_{y}", desc.shape, desc.dtype, transient=True, find_new_name=True)
    full, index = full_index(sdfg, y)
    init_in = {"__y": dace.Memlet(f"{start}[{index}]")} if start else {}
    code = ("__z = (__y == 0)\n__p = (__y if __y != 0 else 1.0)\n__s = (__y if __y == 0 else 0.0)" if start
            else "__z = 0\n__p = 1.0\n__s = 0.0")
    add_element_tasklet(ctx.new_state(f"zeros_{label}_init"), f"zeros_init_{label}", full, init_in, code,
                        {"__z": dace.Memlet(f"{nz}[{index}]"), "__p": dace.Memlet(f"{pnz}[{index}]"),
                         "__s": dace.Memlet(f"{sz}[{index}]")})
    value = assignments_code([("__f", factor)], cse=False)
    add_element_tasklet(ctx.new_state(f"zeros_{label}"), f"zeros_{label}", ranges, copy.deepcopy(values),
                        f"{value}\n__z = (__f == 0)\n__p = (__f if __f != 0 else 1.0)\n"
                        "__s = (__f if __f == 0 else 0.0)",
                        {"__z": dace.Memlet(f"{nz}[{yo}]", wcr=SUM), "__p": dace.Memlet(f"{pnz}[{yo}]", wcr=PRODUCT),
                         "__s": dace.Memlet(f"{sz}[{yo}]", wcr=SUM)})
    lines, outputs, reads = [], {}, set(factor.free_symbols)
    for k, (symbol, grad) in enumerate(grads.items()):
        d = derivative(factor, symbol)
        if d == 0:
            continue
        lines.append((f"__gin{k}", sympy.Symbol("__share", real=True) * d))
        reads |= d.free_symbols
        outputs[f"__gin{k}"] = dace.Memlet(grad, wcr=SUM)
    if outputs:
        inputs = {name: copy.deepcopy(m) for name, m in values.items() if sympy.Symbol(name, real=True) in reads}
        inputs.update({"__z": dace.Memlet(f"{nz}[{yo}]"), "__p": dace.Memlet(f"{pnz}[{yo}]"),
                       "__s": dace.Memlet(f"{sz}[{yo}]"), "__g": dace.Memlet(f"{ctx.grad_of(y)}[{yo}]")})
        code = f"{value}\n__share = __g * {others('__f', '__z', '__p', '__s')}\n" + assignments_code(lines, cse=False)
        add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_{label}", ranges, inputs, code, outputs)
    return nz, pnz, sz


def pass_on(ctx: ReverseContext, label: str, y: str, start: str, nz: str, pnz: str, sz: str) -> None:
    """Step 4: the gradient of Y becomes that of its old value, Y_old's share of the product."""
    full, index = full_index(ctx.sdfg, y)
    g = ctx.grad_of(y)
    add_element_tasklet(ctx.new_state(f"reverse_{label}_old"), f"rev_old_{label}", full,
                        {"__y": dace.Memlet(f"{start}[{index}]"), "__z": dace.Memlet(f"{nz}[{index}]"),
                         "__p": dace.Memlet(f"{pnz}[{index}]"), "__s": dace.Memlet(f"{sz}[{index}]"),
                         "__g": dace.Memlet(f"{g}[{index}]")},
                        f"__o = __g * {others('__y', '__z', '__p', '__s')}", {"__o": dace.Memlet(f"{g}[{index}]")})


def _product_wcr(site: OpSite) -> bool:
    """The map writes an outer array with a product write-conflict resolution."""
    state, members = site.state, set(site.members())
    return any(isinstance(n, nd.MapExit) and e.dst not in members and e.data.wcr is not None
               and reduction_type(e.data.wcr) == dace.dtypes.ReductionType.Product
               for n in members for e in state.out_edges(n))


def _parts(site: OpSite, ctx: ReverseContext):
    ef = ctx.memo(("element_function", site.index), lambda: element_function(site.state, site.members()))
    where = f"'{site.op.label}' in state '{site.state.label}'"
    if len(ef.outputs) != 1 or ef.map_entry is None:
        raise NotDifferentiableError(f"{where}: a product reduction map must have exactly one output",
                                     "split the map so that the product is computed on its own")
    out = ef.outputs[0]
    if out.indirect or any(p.array == out.array or p.indirect for p in ef.inputs):
        raise NotDifferentiableError(f"{where}: the product map reads '{out.array}' or indexes an array",
                                     "compute the factors into an array first")
    return ef, out


@reverse_rule("map", priority=10, applies=_product_wcr)
class ProductWcrReverse:
    """Maps reducing with a product write-conflict resolution (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        ef, out = _parts(site, ctx)
        if ctx.grad_of(out.array) is None:
            return frozenset()
        return frozenset({p.array for p in ef.inputs} | {out.array})

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        ef, out = _parts(site, ctx)
        if ctx.grad_of(out.array) is None:
            return
        label = f"{site.state.label}_{out.array}"
        old = ctx.value_of(site.index, out.array)
        values = {p.symbol.name: dace.Memlet(f"{ctx.value_of(site.index, p.array)}[{p.subset}]") for p in ef.inputs}
        grads = {p.symbol: f"{ctx.grad_of(p.array)}[{p.subset}]" for p in ef.inputs if ctx.grad_of(p.array)}
        nz, pnz, sz = product_reverse(ctx, label, map_ranges(ef.map_entry), out.array, out.subset, old, ef.exprs[0],
                                  values, grads)
        pass_on(ctx, label, out.array, old, nz, pnz, sz)
