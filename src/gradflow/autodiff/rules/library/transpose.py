"""Transposes: `Transpose` (`A.T`, `np.transpose` of a matrix) and `TensorTranspose` (`np.transpose(A, axes)`).

B = alpha * permute(A): gA[i] += alpha * gB[permuted i], one map (a transpose is memory-bound: there is no
BLAS call to gain), then gB is cleared on the written subset.
"""

from __future__ import annotations

import dace

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.autodiff.protocols import library_rule
from gradflow.autodiff.rules.library._common import (
    accumulates,
    clear,
    element,
    node_of,
    operands,
    ranges_over,
    where,
)
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.wcr import SUM


def _applies(node) -> bool:
    return getattr(node, "beta", 0) == 0


@library_rule("TensorTranspose", applies=_applies, name="TensorTransposeReverse")
@library_rule("Transpose")
class TransposeReverse:
    """B = alpha * permute(A): the permuted gradient added into A's (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        return frozenset()

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node = node_of(site)
        ins, outs = operands(site)
        (x,), (y,) = ins.values(), outs.values()
        gx, gy = ctx.grad_of(x.array), ctx.grad_of(y.array)
        if gy is None:
            return
        if x.array == y.array:
            raise NotDifferentiableError(f"{where(site)}: transposes '{x.array}' in place")
        axes = list(getattr(node, "axes", None) or reversed(range(x.dims)))
        if x.dims != y.dims or sorted(axes) != list(range(x.dims)):
            raise NotDifferentiableError(f"{where(site)}: cannot read the permutation {axes} of {x.dims} dimensions")
        alpha = getattr(node, "alpha", 1)
        label = f"{site.state.label}_{y.array}"
        if gx:
            ranges, params = ranges_over(x, "__t")
            yparams = [params[a] for a in axes]  # out dimension e runs over input dimension axes[e]
            add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_transpose_{label}", ranges or None,
                                {"__g": dace.Memlet(f"{gy}[{element(y, yparams)}]")},
                                "__o = __g" if alpha == 1 else f"__o = ({alpha}) * __g",
                                {"__o": dace.Memlet(f"{gx}[{element(x, params)}]", wcr=SUM)})
        if not accumulates(y, site):
            clear(ctx, y, label)

