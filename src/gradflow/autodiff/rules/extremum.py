"""Reverse rule for maps that reduce with a max or min write-conflict resolution (`o >> Y(1, max)[i]`).

Forward: Y[o] = max(Y_old[o], max over the iterations i writing Y[o] of f(x_i)). The derivative is split
equally among the ties (`ties.py`), as `torch.amax` does: every candidate equal to the result (the old value of Y[o]
included) gets g[o] / count[o]. Backward, in states:
1. R = Y_old; R[o] (max-WCR) = f(x_i) over the map   -- the result, recomputed from the stored inputs;
2. count = (Y_old == R); count[o] += (f(x_i) == R[o]) over the map;
3. g_x += g_Y[o] * (f(x_i) == R[o]) / count[o] * df/dx over the map (write-conflict sum);
4. g_Y = g_Y * (Y_old == R) / count     -- what flows on to the old value of Y.
Elements of Y the map does not write keep R = Y_old, count = 1, so their gradient passes unchanged.
"""

from __future__ import annotations

import dace
import sympy
from dace.sdfg import nodes as nd

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.elementfn import element_function
from gradflow.autodiff.emit import add_element_tasklet, copy_array, full_index, map_ranges
from gradflow.autodiff.protocols import reverse_rule
from gradflow.autodiff.rules.ties import share, tie
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import assignments_code, derivative
from gradflow.core.wcr import SUM, reduction_type

_EXTREMA = {dace.dtypes.ReductionType.Max: "max", dace.dtypes.ReductionType.Min: "min"}


def _extremum_wcr(site: OpSite) -> bool:
    """The map writes an outer array with a max or min write-conflict resolution."""
    state = site.state
    members = set(site.members())
    for node in members:
        if isinstance(node, nd.MapExit):
            for e in state.out_edges(node):
                if e.dst not in members and e.data.wcr is not None and reduction_type(e.data.wcr) in _EXTREMA:
                    return True
    return False


def _extremum_kind(site: OpSite) -> str:
    for node in site.members():
        if isinstance(node, nd.MapExit):
            for e in site.state.out_edges(node):
                if e.data.wcr is not None:
                    kind = _EXTREMA.get(reduction_type(e.data.wcr))
                    if kind:
                        return kind
    raise AssertionError("applies() guarantees a max/min write-conflict resolution")


def _parts(site: OpSite, ctx: ReverseContext):
    ef = element_function(site.state, site.members())
    where = f"'{site.op.label}' in state '{site.state.label}'"
    if len(ef.outputs) != 1 or ef.map_entry is None:
        raise NotDifferentiableError(f"{where}: a max/min reduction map must have exactly one output",
                                     "split the map so that the extremum is computed on its own")
    out = ef.outputs[0]
    if any(p.array == out.array for p in ef.inputs):
        raise NotDifferentiableError(f"{where}: the map reads '{out.array}', which it reduces into")
    if out.indirect or any(p.indirect for p in ef.inputs):
        raise NotDifferentiableError(f"{where}: a max/min reduction map that indexes an array",
                                     "gather the values into an array first")
    return ef, out, where


@reverse_rule("map", priority=10, applies=_extremum_wcr)
class ExtremumReverse:
    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        ef, out, _ = _parts(site, ctx)
        if ctx.grad_of(out.array) is None:
            return frozenset()
        return frozenset({p.array for p in ef.inputs} | {out.array})

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        ef, out, where = _parts(site, ctx)
        kind = _extremum_kind(site)
        gy = ctx.grad_of(out.array)
        if gy is None:
            return
        sdfg = ctx.sdfg
        desc = sdfg.arrays[out.array]
        label = f"{site.state.label}_{out.array}"
        old = ctx.value_of(site.index, out.array)
        result, _ = sdfg.add_array(f"gradflow_t_{kind}_{out.array}", desc.shape, desc.dtype, transient=True,
                                   find_new_name=True)
        count, _ = sdfg.add_array(f"gradflow_t_count_{out.array}", desc.shape, desc.dtype, transient=True,
                                  find_new_name=True)
        ranges = map_ranges(ef.map_entry)
        expr = ef.exprs[0]
        def values():
            return {p.symbol.name: dace.Memlet(f"{ctx.value_of(site.index, p.array)}[{p.subset}]")
                    for p in ef.inputs if p.symbol in expr.free_symbols}

        wcr = f"lambda a, b: {kind}(a, b)"

        # 1. the result, recomputed
        copy_array(ctx.new_state(f"recompute_{label}"), old, result)
        add_element_tasklet(ctx.new_state(f"recompute_{label}_{kind}"), f"recompute_{label}", ranges, values(),
                            assignments_code([("__r", expr)], cse=False),
                            {"__r": dace.Memlet(f"{result}[{out.subset}]", wcr=wcr)})
        # 2. the number of candidates equal to the result
        full, index = full_index(sdfg, out.array)
        add_element_tasklet(ctx.new_state(f"count_{label}_old"), f"count_old_{label}", full,
                            {"__y": dace.Memlet(f"{old}[{index}]"), "__r": dace.Memlet(f"{result}[{index}]")},
                            f"__c = {tie('__y')}", {"__c": dace.Memlet(f"{count}[{index}]")})
        code = assignments_code([("__v", expr)], cse=False) + f"\n__c = {tie('__v')}"
        add_element_tasklet(ctx.new_state(f"count_{label}"), f"count_{label}", ranges,
                            {**values(), "__r": dace.Memlet(f"{result}[{out.subset}]")}, code,
                            {"__c": dace.Memlet(f"{count}[{out.subset}]", wcr=SUM)})
        # 3. the inputs' share
        hit = sympy.Symbol("__hit", real=True)
        lines = []
        outputs = {}
        used = set(expr.free_symbols)
        for j, port in enumerate(ef.inputs):
            g_in = ctx.grad_of(port.array)
            if not g_in:
                continue
            d = derivative(expr, port.symbol)
            if d == 0:
                continue
            lines.append((f"__gin{j}", hit * d))
            used |= d.free_symbols
            outputs[f"__gin{j}"] = dace.Memlet(f"{g_in}[{port.subset}]", wcr=SUM)
        if outputs:
            inputs = {p.symbol.name: dace.Memlet(f"{ctx.value_of(site.index, p.array)}[{p.subset}]")
                      for p in ef.inputs if p.symbol in used}
            inputs["__r"] = dace.Memlet(f"{result}[{out.subset}]")
            inputs["__c"] = dace.Memlet(f"{count}[{out.subset}]")
            inputs["__g"] = dace.Memlet(f"{gy}[{out.subset}]")
            code = (assignments_code([("__v", expr)], cse=False) + f"\n__hit = {share('__v')}\n"
                    + assignments_code(lines, cse=False))
            add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_{label}", ranges, inputs, code, outputs)
        # 4. what flows on to the old value of Y
        add_element_tasklet(ctx.new_state(f"reverse_{label}_old"), f"rev_old_{label}", full,
                            {"__y": dace.Memlet(f"{old}[{index}]"), "__r": dace.Memlet(f"{result}[{index}]"),
                             "__c": dace.Memlet(f"{count}[{index}]"), "__g": dace.Memlet(f"{gy}[{index}]")},
                            f"__o = {share('__y')}", {"__o": dace.Memlet(f"{gy}[{index}]")})
