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
    Operand,
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


def _logical(op: Operand, n: int) -> list[int] | None:
    """The dimensions of `op`'s subset that are the node's `n` logical ones: all of them, or, when the memlet
    has more (`np.transpose(Ls[k])` reads `Ls[k, 0:D, 0:D]`), the last `n` after leading unit extents, or
    else the `n` not of extent 1. None: no such reading."""
    if op.dims == n:
        return list(range(n))
    extra = op.dims - n
    if extra > 0 and all(d not in op.squeezed() for d in range(extra)):
        return list(range(extra, op.dims))
    kept = op.squeezed()
    return kept if len(kept) == n else None


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
        matrix = type(node).__name__ == "Transpose"  # DaCe's `Transpose` is of a matrix, whatever its memlets
        axes = list(getattr(node, "axes", None) or ([1, 0] if matrix else reversed(range(x.dims))))
        xkeep, ykeep = _logical(x, len(axes)), _logical(y, len(axes))
        if xkeep is None or ykeep is None or sorted(axes) != list(range(len(axes))):
            raise NotDifferentiableError(f"{where(site)}: cannot read the permutation {axes} of {x.dims} dimensions")
        alpha = getattr(node, "alpha", 1)
        label = f"{site.state.label}_{y.array}"
        if gx:
            ranges, params = ranges_over(x, "__t", xkeep)
            yparams: list[str | None] = [None] * y.dims
            for e, d in enumerate(ykeep):  # out dimension e runs over input dimension axes[e]
                yparams[d] = params[xkeep[axes[e]]]
            add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_transpose_{label}", ranges or None,
                                {"__g": dace.Memlet(f"{gy}[{element(y, yparams)}]")},
                                "__o = __g" if alpha == 1 else f"__o = ({alpha}) * __g",
                                {"__o": dace.Memlet(f"{gx}[{element(x, params)}]", wcr=SUM)})
        if not accumulates(y, site):
            clear(ctx, y, label)

