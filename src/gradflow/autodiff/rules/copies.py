"""Reverse rule for copies between access nodes: `B[sb] = A[sa]` becomes `gA[sa] += gB[sb]; gB[sb] = 0`."""

from __future__ import annotations

import dace
import sympy
from dace import subsets

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import SUM, add_element_tasklet
from gradflow.autodiff.rules import reverse_rule
from gradflow.core.errors import NotDifferentiableError


def _varying_dims(rng: subsets.Range) -> list[int]:
    return [d for d, size in enumerate(rng.size()) if sympy.simplify(size - 1) != 0]


def _indexed(rng: subsets.Range, params: list[str], dims: list[int]) -> str:
    index = []
    it = iter(params)
    for d, (begin, _end, step) in enumerate(rng):
        index.append(f"({begin}) + ({step}) * {next(it)}" if d in dims else str(begin))
    return ", ".join(index)


@reverse_rule("copy")
class CopyReverse:
    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        return frozenset()

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        state = site.state
        src = state.node(site.op.reads[0])
        dst = state.node(site.op.writes[0])
        edge = next(e for e in state.edges_between(src, dst))
        g_src, g_dst = ctx.grad_of(src.data), ctx.grad_of(dst.data)
        if g_dst is None:
            return
        memlet = edge.data
        src_subset = memlet.get_src_subset(edge, state)
        dst_subset = memlet.get_dst_subset(edge, state)
        if src_subset is None or dst_subset is None:
            src_subset = src_subset or subsets.Range.from_array(state.sdfg.arrays[src.data])
            dst_subset = dst_subset or subsets.Range.from_array(state.sdfg.arrays[dst.data])
        sdims, ddims = _varying_dims(src_subset), _varying_dims(dst_subset)
        ssizes = [src_subset.size()[d] for d in sdims]
        dsizes = [dst_subset.size()[d] for d in ddims]
        if len(sdims) != len(ddims) or any(sympy.simplify(a - b) != 0 for a, b in zip(ssizes, dsizes)):
            raise NotDifferentiableError(
                f"copy {src.data}[{src_subset}] -> {dst.data}[{dst_subset}] in state '{state.label}' reshapes data; "
                "only copies between equally shaped subsets are differentiated"
            )
        if src.data == dst.data and src_subset.intersects(dst_subset) is not False:
            raise NotDifferentiableError(
                f"copy within '{src.data}' in state '{state.label}' between overlapping subsets is not differentiated"
            )
        params = [f"__c{k}" for k in range(len(ddims))]
        ranges = {p: f"0:{s}" for p, s in zip(params, dsizes)}
        s_index, d_index = _indexed(src_subset, params, sdims), _indexed(dst_subset, params, ddims)
        inputs = {"__g": dace.Memlet(f"{g_dst}[{d_index}]")}
        outputs = {}
        code = []
        if g_src is not None:
            outputs["__gin"] = dace.Memlet(f"{g_src}[{s_index}]", wcr=SUM)
            code.append("__gin = __g")
        if memlet.wcr is None:
            outputs["__clr"] = dace.Memlet(f"{g_dst}[{d_index}]")
            code.append("__clr = 0")
        if outputs:
            add_element_tasklet(ctx.new_state(f"reverse_{state.label}"), f"rev_copy_{dst.data}", ranges or None,
                                inputs, "\n".join(code), outputs)
