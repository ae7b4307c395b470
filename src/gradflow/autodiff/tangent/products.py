"""Tangents of map outputs written with a product write-conflict resolution (`P[o] *= g(x_i)` over a map).

Such maps are rare in users' programs but every reverse of a product writes one (its non-zero product of
the factors, `rules/product.py`), so a Hessian-vector product of any program with `np.prod` needs them.
A dual tasklet cannot give them: the tangent of a product is not a product of tangents. With Y_old one
more factor, d Y = sum over factors f of df * prod(others), exact where factors are zero as in the
`Reduce` rule (`library.py`): per output element the product of the non-zero factors `p`, their count of
zeros `z`, `sum df / f` over the non-zero factors `r` and `sum df` over the zero ones `t`; then tY = p r
with no zero, p t with one, 0 with more. Three states are put *before* the map's own (which is kept as it
is): Y and tY still hold their old values there, and the map reads no array it writes.
"""

from __future__ import annotations

import dace
import sympy
from dace import dtypes
from dace.sdfg import nodes as nd

from gradflow.autodiff.context import OpSite
from gradflow.autodiff.elementfn import element_function
from gradflow.autodiff.emit import add_element_tasklet, map_ranges, subset_elements
from gradflow.autodiff.tangent.context import TangentContext
from gradflow.autodiff.tangent.dual import selected
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import assignments_code, derivative
from gradflow.core.wcr import PRODUCT, SUM, reduction_type

_PRODUCT_KIND = str(dtypes.ReductionType.Product)  # `Port.wcr` of a product output


def product_edges(site: OpSite, ctx: TangentContext) -> list:
    """The edges from the operation's tasklets whose write leaves it with a product write-conflict
    resolution into an array with a tangent."""
    state, mirror = site.state, ctx.mirror(site.state)
    found = []
    for node in site.members():
        if not isinstance(node, nd.Tasklet):
            continue
        for e in state.out_edges(node):
            last = state.memlet_path(e)[-1]
            if (not e.data.is_empty() and last.data.wcr is not None and mirror.has_tangent(last.data.data)
                    and reduction_type(last.data.wcr) == dtypes.ReductionType.Product):
                found.append(e)
    return found


def product_tangents(site: OpSite, ctx: TangentContext) -> None:
    """The states before the operation's that give the tangents of its product outputs (module doc)."""
    state = site.state
    where = f"'{site.op.label}' in state '{state.label}'"
    ef = element_function(state, site.members())
    ranges = map_ranges(ef.map_entry) if ef.map_entry is not None else None
    written = {p.array for p in ef.outputs}
    read = {p.array for p in ef.inputs}
    if written & read or any(p.indirect for p in (*ef.inputs, *ef.outputs)):
        raise NotDifferentiableError(
            f"{where}: a product write-conflict resolution in a map that reads an array it writes, or indexes "
            "one; forward mode differentiates such a product only over values the map does not change",
            "compute the factors into an array first")
    products = [(p, expr) for p, expr in zip(ef.outputs, ef.exprs) if p.wcr == _PRODUCT_KIND
                and ctx.mirror(state).has_tangent(p.array)]
    arrays = [p.array for p, _ in products]
    if len(set(arrays)) != len(arrays) or any(p.array in arrays for p in ef.outputs if p.wcr != _PRODUCT_KIND):
        raise NotDifferentiableError(f"{where}: writes an array it multiplies into with other writes as well",
                                     "compute the product in its own map")
    outer = {e.data.data: e.data.get_dst_subset(e, state) for e in _outer_writes(state, ef.map_entry, site)}
    for k, (port, expr) in enumerate(products):
        _one_product(ctx, state, f"{site.op.label}_{k}", ranges, ef.inputs, port, expr, outer[port.array])


def _outer_writes(state, entry, site: OpSite) -> list:
    """The edges leaving the operation into the access nodes it writes (a map's exit, or its tasklets)."""
    if entry is not None:
        return [e for e in state.out_edges(state.exit_node(entry)) if not e.data.is_empty()]
    inside = set(site.members())
    return [e for n in inside if isinstance(n, nd.Tasklet) for e in state.out_edges(n)
            if not e.data.is_empty() and e.dst not in inside]


def _one_product(ctx: TangentContext, state, label: str, ranges, inputs, port, factor: sympy.Expr, subset) -> None:
    sdfg, cfg = ctx.sdfg, state.parent_graph
    y, ty = port.array, ctx.tangents[port.array]
    desc = sdfg.arrays[y]
    temps = {role: sdfg.add_array(f"gradflow_prod_{role}_{y}", desc.shape, desc.dtype, transient=True,
                                  find_new_name=True)[0] for role in ("p", "z", "r", "t")}
    # 1. Y's old value is the first factor
    clear = cfg.add_state_before(state, f"{state.label}_prod_clear")
    ranges_y, _, element = subset_elements(subset, "__o")
    add_element_tasklet(
        clear, f"prod_clear_{label}", ranges_y,
        {"__y": dace.Memlet(f"{y}[{element}]"), "__ty": dace.Memlet(f"{ty}[{element}]")},
        "__zero = __y == 0.0\n__p = 1.0 if __zero else __y\n__z = 1.0 if __zero else 0.0\n"
        "__r = 0.0 if __zero else __ty / __y\n__t = __ty if __zero else 0.0",
        {f"__{k}": dace.Memlet(f"{v}[{element}]") for k, v in temps.items()})
    # 2. the map's factors, with their tangents
    mirror = ctx.mirror(state)
    values = {p.symbol.name: dace.Memlet(f"{p.array}[{p.subset}]") for p in inputs}
    tangent = sympy.Integer(0)
    for p in inputs:
        if mirror.has_tangent(p.array) and p.symbol in factor.free_symbols:
            name = f"__t{p.symbol.name.lstrip('_')}"
            values[name] = dace.Memlet(f"{ctx.tangents[p.array]}[{p.subset}]")
            tangent += selected(derivative(factor, p.symbol) * sympy.Symbol(name, real=True))
    used = {s.name for s in (factor.free_symbols | tangent.free_symbols)}
    tally = cfg.add_state_after(clear, f"{state.label}_prod_tally")
    code = assignments_code([("__f", factor), ("__df", tangent)], cse=False)
    add_element_tasklet(
        tally, f"prod_tally_{label}", ranges, {c: m for c, m in values.items() if c in used},
        f"{code}\n__zero = __f == 0.0\n__p = 1.0 if __zero else __f\n__z = 1.0 if __zero else 0.0\n"
        "__r = 0.0 if __zero else __df / __f\n__t = __df if __zero else 0.0",
        {"__p": dace.Memlet(f"{temps['p']}[{port.subset}]", wcr=PRODUCT),
         **{f"__{k}": dace.Memlet(f"{temps[k]}[{port.subset}]", wcr=SUM) for k in ("z", "r", "t")}})
    # 3. the tangent of the product; the map's own state then computes Y as before
    combine = cfg.add_state_after(tally, f"{state.label}_prod_combine")
    add_element_tasklet(
        combine, f"prod_combine_{label}", ranges_y,
        {f"__{k}": dace.Memlet(f"{v}[{element}]") for k, v in temps.items()},
        "__o = __p * __r if __z == 0.0 else (__p * __t if __z == 1.0 else 0.0)",
        {"__o": dace.Memlet(f"{ty}[{element}]")})
