"""Reductions: the standard `Reduce` node (what `np.sum`, `np.mean`, `np.max`, `np.min`, `np.amax`,
`np.add.reduce(..., keepdims=True)` ... become), for sum, max and min, any axes, dropped or kept dims.

Index convention (DaCe's): dimensions of the input subset with extent 1 are squeezed, the reduced axes are
the listed ones among the rest, and the remaining input dimensions map in order onto the output subset's
non-unit dimensions. Reverse, per input element x[i] reduced into y[o(i)]:
- sum: gx[i] += gy[o(i)];
- max/min: the result R is read from the output where the backward sweep finds it unchanged
  (`ReverseContext.final_value`: written once, outside loops), else recomputed by a `Reduce` node of the
  same kind into a temporary; ties are counted (cnt[o] = #{i : x[i] == R[o]}) and
  gx[i] += gy[o(i)] * (x[i] == R[o(i)]) / cnt[o(i)] (ties split equally, as `torch.amax`). Where
  dimensions are kept, both happen in one scope per output element (`_count_and_spread_by_output`);
then gy is cleared on the output subset (the reduction overwrote it) unless the node accumulates (no
identity and a sum).

Products (`np.prod`, `np.multiply.reduce`, `a.prod()`, identity 1) have a rule of their own,
`ProductReduceReverse`: gx[i] += gy[o(i)] * (the product of the other factors of y[o(i)]), computed exactly
where factors are zero (`autodiff/rules/product.py`).
"""

from __future__ import annotations

import re

import dace
import sympy
from dace.libraries.standard import Reduce

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import add_element_tasklet, fill
from gradflow.autodiff.protocols import library_rule
from gradflow.autodiff.rules.library._common import (
    Operand,
    clear,
    element,
    node_of,
    operands,
    where,
)
from gradflow.autodiff.rules.product import product_reverse
from gradflow.autodiff.rules.ties import share, tie
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.wcr import SUM, reduction_type

_KINDS = {dace.dtypes.ReductionType.Sum: "sum", dace.dtypes.ReductionType.Max: "max",
          dace.dtypes.ReductionType.Min: "min"}


def _kind(node) -> str | None:
    return _KINDS.get(reduction_type(node.wcr))


def _applies(node) -> bool:
    return _kind(node) is not None


def reduction_io(site: OpSite) -> tuple[Operand, Operand]:
    ins, outs = operands(site)
    if len(ins) != 1 or len(outs) != 1:
        raise NotDifferentiableError(f"{where(site)}: a reduction with {len(ins)} inputs and {len(outs)} outputs")
    return next(iter(ins.values())), next(iter(outs.values()))


def index_maps(site: OpSite, x: Operand, y: Operand):
    """Map ranges over the input and the (input element, output element) subsets for them."""
    node = node_of(site)
    isq = x.squeezed()
    axes = list(range(x.dims)) if node.axes is None else list(node.axes)
    axes = [a for a in axes if a in isq]
    kept = [d for d in isq if d not in axes]
    osq = y.squeezed()
    if len(kept) != len(osq):
        if len(kept) == 0 and len(osq) == 1 and y.dims == 1:
            osq = []  # a reduction to one element stored in a 1-D array of symbolic length
        else:
            raise NotDifferentiableError(
                f"{where(site)}: {len(kept)} input dimensions remain after reducing axes {axes}, but the output "
                f"subset {y.array}[{y.subset}] has {len(osq)} non-unit dimensions")
    params: list[str | None] = [None] * x.dims
    ranges = {}
    for d in isq:
        params[d] = f"__r{d}"
        ranges[params[d]] = f"0:{x.sizes()[d]}"
    oparams: list[str | None] = [None] * y.dims
    for o, d in zip(osq, kept):
        oparams[o] = params[d]
    return ranges, element(x, params), element(y, oparams)


def _reversed_operands(site: OpSite, ctx: ReverseContext):
    """(input, output, output gradient, input gradient) of a reduction whose output carries a gradient;
    None when it carries none (nothing to reverse)."""
    x, y = reduction_io(site)
    gy, gx = ctx.grad_of(y.array), ctx.grad_of(x.array)
    if gy is None:
        return None
    if x.array == y.array:
        raise NotDifferentiableError(f"{where(site)}: reduces '{x.array}' into itself")
    return x, y, gy, gx


@library_rule("Reduce", applies=_applies)
class ReduceReverse:
    """Sum, max and min reductions over any axes (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        x, y = reduction_io(site)
        if _kind(node_of(site)) == "sum" or not ctx.grad_of(y.array) or not ctx.grad_of(x.array):
            return frozenset()
        if y.wcr is None and ctx.final_value(site.state, y.array) is not None:
            ctx.note_result_read(site.state, y.array)  # `_extremum` reads the result where it finds it
        return frozenset({x.array})

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node = node_of(site)
        kind = _kind(node)
        operands = _reversed_operands(site, ctx)
        if operands is None:
            return
        x, y, gy, gx = operands
        accumulate = node.identity is None or y.wcr is not None
        summed = y.wcr is not None and reduction_type(y.wcr) == dace.dtypes.ReductionType.Sum
        if accumulate and (kind != "sum" or (y.wcr is not None and not summed)):
            raise NotDifferentiableError(f"{where(site)}: a {kind} reduction that combines with the old output value",
                                         "give the reduction an identity")
        label = f"{site.state.label}_{y.array}"
        ranges, xi, yo = index_maps(site, x, y)
        if gx:
            if kind == "sum":
                add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_sum_{label}", ranges or None,
                                    {"__g": dace.Memlet(f"{gy}[{yo}]")}, "__o = __g",
                                    {"__o": dace.Memlet(f"{gx}[{xi}]", wcr=SUM)})
            else:
                self._extremum(site, ctx, node, kind, x, y, ranges, xi, yo, label)
        if not accumulate:
            clear(ctx, y, label)

    @staticmethod
    def _extremum(site, ctx, node, kind, x: Operand, y: Operand, ranges, xi, yo, label) -> None:
        sdfg = ctx.sdfg
        vx = ctx.value_of(site.index, x.array)
        desc = sdfg.arrays[y.array]
        result = ctx.final_value(site.state, y.array) if y.wcr is None else None
        if result is None:  # the result is recomputed (the output may hold something else by now)
            result, _ = sdfg.add_array(f"gradflow_t_{kind}_{y.array}", desc.shape, desc.dtype, transient=True,
                                       find_new_name=True)
            state = ctx.new_state(f"recompute_{label}")
            red = Reduce(f"recompute_{label}", wcr=node.wcr, axes=node.axes, identity=node.identity)
            state.add_node(red)
            state.add_edge(state.add_read(vx), None, red, None, x.memlet(vx))
            state.add_edge(red, None, state.add_write(result), None, y.memlet(result))
        gy, gx = ctx.grad_of(y.array), ctx.grad_of(x.array)
        kept = {p: r for p, r in ranges.items() if p in _names(yo)}
        if kept and len(kept) < len(ranges):
            _count_and_spread_by_output(ctx.new_state(f"reverse_{label}"), f"{kind}_{label}", kept,
                                        {p: r for p, r in ranges.items() if p not in kept}, vx, xi, result, yo,
                                        gy, gx)
            return
        count, _ = sdfg.add_array(f"gradflow_t_count_{y.array}", desc.shape, desc.dtype, transient=True,
                                  find_new_name=True)
        fill(ctx.new_state(f"count_{label}_zero"), count, "0")
        add_element_tasklet(ctx.new_state(f"count_{label}"), f"count_{label}", ranges or None,
                            {"__x": dace.Memlet(f"{vx}[{xi}]"), "__r": dace.Memlet(f"{result}[{yo}]")},
                            f"__c = {tie('__x')}", {"__c": dace.Memlet(f"{count}[{yo}]", wcr=SUM)})
        add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_{kind}_{label}", ranges or None,
                            {"__x": dace.Memlet(f"{vx}[{xi}]"), "__r": dace.Memlet(f"{result}[{yo}]"),
                             "__c": dace.Memlet(f"{count}[{yo}]"), "__g": dace.Memlet(f"{gy}[{yo}]")},
                            _SPREAD, {"__o": dace.Memlet(f"{gx}[{xi}]", wcr=SUM)})


#: the gradient of an extremum's element: its share among the elements equal to the result
_SPREAD = f"__o = {share('__x')}"


def _names(subset: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", subset))


def _count_and_spread_by_output(state: dace.SDFGState, label: str, kept: dict[str, str], reduced: dict[str, str],
                                vx: str, xi: str, result: str, yo: str, gy: str, gx: str) -> None:
    """Ties counted and the gradient spread in one scope per output element: a map over the kept dimensions
    around two sequential maps over the reduced ones, with the count and each tie's share (the output's
    gradient over the count) in registers between them. The input elements of one output are read twice
    while they are in cache (two passes over the whole input before)."""
    sdfg = state.sdfg
    dtype = sdfg.arrays[gx].dtype
    # an integer count: its sum is not a chain of floating-point additions, so the compiler vectorizes it
    count, _ = sdfg.add_array(f"gradflow_t_count_{label}", [1], dace.int64, transient=True,
                              storage=dace.StorageType.Register, find_new_name=True)
    share, _ = sdfg.add_array(f"gradflow_t_share_{label}", [1], dtype, transient=True,
                              storage=dace.StorageType.Register, find_new_name=True)
    outer, outer_exit = state.add_map(f"ties_{label}", kept)
    tally, tally_exit = state.add_map(f"count_{label}", reduced, schedule=dace.ScheduleType.Sequential)
    spread, spread_exit = state.add_map(f"spread_{label}", reduced, schedule=dace.ScheduleType.Sequential)
    zero = state.add_tasklet(f"zero_count_{label}", {}, {"__o"}, "__o = 0")
    counted = state.add_tasklet(f"count_{label}", dict.fromkeys(("__x", "__r")), {"__c"}, f"__c = {tie('__x')}")
    divide = state.add_tasklet(f"share_{label}", dict.fromkeys(("__g", "__c")), {"__s"}, "__s = __g / __c")
    spreads = state.add_tasklet(f"rev_{label}", dict.fromkeys(("__x", "__r", "__s")), {"__o"},
                                f"__o = {tie('__x')} * __s")
    state.add_nedge(outer, zero, dace.Memlet())
    start, total, each = state.add_access(count), state.add_access(count), state.add_access(share)
    state.add_edge(zero, "__o", start, None, dace.Memlet(f"{count}[0]"))
    state.add_nedge(start, tally, dace.Memlet())
    x_in, r_in = state.add_read(vx), state.add_read(result)
    for entry, task in ((tally, counted), (spread, spreads)):
        state.add_memlet_path(x_in, outer, entry, task, memlet=dace.Memlet(f"{vx}[{xi}]"), dst_conn="__x")
        state.add_memlet_path(r_in, outer, entry, task, memlet=dace.Memlet(f"{result}[{yo}]"), dst_conn="__r")
    state.add_memlet_path(counted, tally_exit, total, memlet=dace.Memlet(f"{count}[0]", wcr=SUM), src_conn="__c")
    state.add_edge(total, None, divide, "__c", dace.Memlet(f"{count}[0]"))
    state.add_memlet_path(state.add_read(gy), outer, divide, memlet=dace.Memlet(f"{gy}[{yo}]"), dst_conn="__g")
    state.add_edge(divide, "__s", each, None, dace.Memlet(f"{share}[0]"))
    state.add_memlet_path(each, spread, spreads, memlet=dace.Memlet(f"{share}[0]"), dst_conn="__s")
    state.add_memlet_path(spreads, spread_exit, outer_exit, state.add_write(gx),
                          memlet=dace.Memlet(f"{gx}[{xi}]", wcr=SUM), src_conn="__o")



def _is_product(node) -> bool:
    return reduction_type(node.wcr) == dace.dtypes.ReductionType.Product


@library_rule("Reduce", applies=_is_product, name="ProductReduceReverse")
class ProductReduceReverse:
    """Product reductions over any axes, zeros handled exactly (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        x, y = reduction_io(site)
        if not ctx.grad_of(y.array) or not ctx.grad_of(x.array):
            return frozenset()
        return frozenset({x.array})

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node = node_of(site)
        operands = _reversed_operands(site, ctx)
        if operands is None:
            return
        x, y, gy, gx = operands
        if y.wcr is not None or node.identity not in (1, 1.0):
            raise NotDifferentiableError(
                f"{where(site)}: a product reduction with identity {node.identity} writing with {y.wcr}; only "
                "products that start at 1 and overwrite their output are differentiated",
                "give the reduction the identity 1 and multiply the old value in separately")
        label = f"{site.state.label}_{y.array}"
        ranges, xi, yo = index_maps(site, x, y)
        if gx:
            xs = sympy.Symbol("__x", real=True)
            values = {"__x": dace.Memlet(f"{ctx.value_of(site.index, x.array)}[{xi}]")}
            product_reverse(ctx, label, ranges or None, y.array, yo, None, xs, values, {xs: f"{gx}[{xi}]"})
        clear(ctx, y, label)
