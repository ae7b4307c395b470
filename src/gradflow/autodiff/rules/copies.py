"""Reverse rule for copies between access nodes: `B[sb] = A[sa]` becomes `gA[sa] += gB[sb]; gB[sb] = 0`,
element by element, with the element correspondence DaCe's copy expansions use
(`dace.libraries.standard.nodes.copy`):

- both subsets lose their extent-1 dimensions; when the rest have the same rank, they correspond
  dimension by dimension (the extents must be equal: `cov[i:M, i] = cov[i, i:M]` copies a row into a
  column);
- otherwise the copy reshapes (SDFGs built with the API or by other frontends; the Python frontend's
  reshapes are views, which `remove_views` turns into maps): a walker visits element l of the source in
  row-major order (column-major when both arrays have packed Fortran strides) and writes element l of
  the destination in the same order. The reverse walks the
  same way. DaCe walks as many elements as the source has; the element counts must be equal, or at least
  not provably different (`reshape(x4, (N, CB))` with a symbol `CB`): each destination element is then
  written once, by the one source element the reverse sends its gradient to.

The destination's gradient is cleared on what the copy wrote, unless the copy accumulates (write-conflict
sum).
"""

from __future__ import annotations

import functools
import operator

import dace
import sympy
from dace import subsets, symbolic

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.autodiff.protocols import reverse_rule
from gradflow.autodiff.rules.library._common import disjoint
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.wcr import SUM


def _canonical(expr):
    """`expr` with fresh DaCe symbols: frontends create the same symbol with different assumptions
    (`i` nonnegative in one subset, unconstrained in another), which sympy then cannot cancel."""
    return symbolic.pystr_to_symbolic(str(expr))


def _difference(a, b):
    return sympy.simplify(_canonical(a) - _canonical(b))


def _same_elements(a: subsets.Range, b: subsets.Range) -> bool:
    """Whether two ranges provably name the same elements in the same order."""
    return len(a) == len(b) and all(_difference(x, y) == 0 for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def _varying_dims(rng: subsets.Range) -> list[int]:
    return [d for d, size in enumerate(rng.size()) if _difference(size, 1) != 0]


def _element(rng: subsets.Range, at: dict[int, object]) -> subsets.Range:
    """The element of `rng` at index `at[d]` (relative, in steps) in its dimensions d, first elsewhere."""
    out = []
    for d, (begin, _end, step) in enumerate(rng):
        e = begin + step * at[d] if d in at else begin
        out.append((e, e, 1))
    return subsets.Range(out)


def _delinearized(index, sizes: list, order: str) -> list:
    """The multi-index of flat position `index` in an array of `sizes` (DaCe's walker: every component
    taken modulo its extent)."""
    cum, strides = 1, []
    for size in (reversed(sizes) if order == "C" else sizes):
        strides.append(cum)
        cum = cum * size
    if order == "C":
        strides.reverse()
    return [symbolic.int_floor(index, s) % size for s, size in zip(strides, sizes)]


def _walk_order(sdfg: dace.SDFG, src: str, dst: str) -> str | None:
    """"C" or "F": the order DaCe's walker uses for a reshaping copy between these arrays, or None when it
    has none (it then refuses the copy)."""
    a, b = sdfg.arrays[src], sdfg.arrays[dst]
    if a.is_packed_c_strides() and b.is_packed_c_strides():
        return "C"
    if a.is_packed_fortran_strides() and b.is_packed_fortran_strides():
        return "F"
    return None


@reverse_rule("copy")
class CopyReverse:
    """A copy backwards, along DaCe's pairing of elements (module doc)."""

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
        src_subset = memlet.get_src_subset(edge, state) or subsets.Range.from_array(state.sdfg.arrays[src.data])
        dst_subset = memlet.get_dst_subset(edge, state) or subsets.Range.from_array(state.sdfg.arrays[dst.data])
        what = f"copy {src.data}[{src_subset}] -> {dst.data}[{dst_subset}] in state '{state.label}'"
        if src.data == dst.data and memlet.wcr is None and _same_elements(src_subset, dst_subset):
            return  # `x[s] = x[s]` (a view assigned to itself) changes nothing: the gradient passes as it is
        if src.data == dst.data and not disjoint(src_subset, dst_subset):
            raise NotDifferentiableError(f"{what}: a copy within one array between overlapping subsets is not "
                                         "differentiated", "copy through a temporary array")
        sdims, ddims = _varying_dims(src_subset), _varying_dims(dst_subset)
        ssizes = [src_subset.size()[d] for d in sdims]
        dsizes = [dst_subset.size()[d] for d in ddims]
        # the loop extents: a strided extent as an integer ceiling
        scount, dcount = src_subset.size(for_codegen=True), dst_subset.size(for_codegen=True)
        if len(sdims) == len(ddims):
            if any(_difference(a, b) != 0 for a, b in zip(ssizes, dsizes)):
                raise NotDifferentiableError(
                    f"{what}: the subsets have the same rank but different extents {ssizes} and {dsizes} (DaCe copies "
                    "those dimension by dimension)", "reshape through a one-dimensional array")
            params = {d: symbolic.symbol(f"__c{k}") for k, d in enumerate(sdims)}
            ranges = {str(p): f"0:{scount[d]}" for d, p in params.items()}
            s_at = params
            d_at = dict(zip(ddims, params.values()))
        else:
            s_at, d_at, ranges = self._reshape(ctx, what, src.data, dst.data, sdims, [scount[d] for d in sdims],
                                               ddims, [dcount[d] for d in ddims])
        inputs = {"__g": dace.Memlet(data=g_dst, subset=_element(dst_subset, d_at))}
        outputs = {}
        code = []
        if g_src is not None:
            outputs["__gin"] = dace.Memlet(data=g_src, subset=_element(src_subset, s_at), wcr=SUM)
            code.append("__gin = __g")
        if memlet.wcr is None:
            outputs["__clr"] = dace.Memlet(data=g_dst, subset=_element(dst_subset, d_at))
            code.append("__clr = 0")
        if outputs:
            add_element_tasklet(ctx.new_state(f"reverse_{state.label}"), f"rev_copy_{dst.data}", ranges or None,
                                inputs, "\n".join(code), outputs)

    @staticmethod
    def _reshape(ctx, what, src, dst, sdims, ssizes, ddims, dsizes):
        """Index maps of a reshaping copy (module doc): a map over the source's elements, whose flat
        position in the walk gives the destination's element. (The map runs over the source's dimensions
        rather than over one flat index: DaCe's type inference of map ranges fails on some products of
        extents such as lenet's.)"""
        order = _walk_order(ctx.sdfg, src, dst)
        if order is None:
            raise NotDifferentiableError(f"{what}: reshapes between arrays without a common packed layout, which "
                                         "DaCe does not copy either")
        surplus = _difference(functools.reduce(operator.mul, ssizes, 1), functools.reduce(operator.mul, dsizes, 1))
        if surplus.is_number and surplus != 0:
            raise NotDifferentiableError(f"{what}: reshapes {ssizes} into {dsizes}, a different number of elements")
        params = [symbolic.symbol(f"__c{k}") for k in range(len(sdims))]
        flat, cum = 0, 1
        for p, size in (zip(reversed(params), reversed(ssizes)) if order == "C" else zip(params, ssizes)):
            flat, cum = flat + p * cum, cum * size
        ranges = {str(p): f"0:{n}" for p, n in zip(params, ssizes)}
        return dict(zip(sdims, params)), dict(zip(ddims, _delinearized(flat, dsizes, order))), ranges
