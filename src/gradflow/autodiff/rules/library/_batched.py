"""The backward of a batched product `C[..., m, n] = alpha * A[..., m, k] @ B[..., k, n]` (3-D and more,
batch dimensions aligned from the right and broadcast where an operand lacks them or has extent 1).

gA_full = gC @ swap(B) and gB_full = swap(A) @ gC are batched `MatMul` nodes (a loop of `cblas_?gemm` once
compiled) into temporaries of C's batch shape, against copies of the other operand with its last two
dimensions swapped; each is then summed over the batch dimensions its operand was broadcast in and added
into its gradient. DaCe's batched product reads every operand as one contiguous block, so the operands
it is given here are whole temporaries or the contiguous subset of `gC` (`_factors.layout_issue` rejects
forward products whose operands are not).
"""

from __future__ import annotations

import dace

from gradflow.autodiff.context import ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.autodiff.rules.library._common import (
    Operand,
    element,
    ranges_over,
    transient,
)
from gradflow.core.wcr import SUM


def batched_reverse(ctx: ReverseContext, label: str, a: Operand, b: Operand, c: Operand, values: dict,
                    alpha) -> None:
    """Add the gradients of `a` and `b` (those that have one); `values` maps each array to the array
    holding its forward value."""
    gc = ctx.grad_of(c.array)
    for x, y, tag in ((a, b, "ga"), (b, a, "gb")):
        if not ctx.grad_of(x.array):
            continue
        ysw = _swapped(ctx, y, values[y.array], f"{label}_{tag}")
        full_shape = list(c.sizes()[:-2]) + list(x.sizes()[-2:])
        full = transient(ctx, full_shape, x.array, f"{label}_{tag}")
        state = ctx.new_state(f"reverse_{label}_{tag}")
        bmm = dace.libraries.blas.MatMul(f"rev_{label}_{tag}")
        state.add_node(bmm)
        lhs, rhs = ((gc, c.memlet(gc)), ysw) if tag == "ga" else (ysw, (gc, c.memlet(gc)))
        state.add_edge(state.add_read(lhs[0]), None, bmm, "_a", lhs[1])
        state.add_edge(state.add_read(rhs[0]), None, bmm, "_b", rhs[1])
        state.add_edge(bmm, "_c", state.add_write(full), None, dace.Memlet.from_array(full, ctx.sdfg.arrays[full]))
        _reduce_broadcast(ctx, full, x, f"{label}_{tag}", alpha)


def _swapped(ctx: ReverseContext, x: Operand, vx: str, label: str) -> tuple[str, dace.Memlet]:
    """A temporary holding `x` with its last two dimensions swapped."""
    sizes = x.sizes()
    shape = list(sizes[:-2]) + [sizes[-1], sizes[-2]]
    tmp = transient(ctx, shape, x.array, f"{label}_swap")
    ranges, params = ranges_over(x, "__s")
    out_index = ", ".join(params[:-2] + [params[-1], params[-2]])
    add_element_tasklet(ctx.new_state(f"swap_{label}"), f"swap_{label}", ranges,
                        {"__i": dace.Memlet(f"{vx}[{element(x, params)}]")}, "__o = __i",
                        {"__o": dace.Memlet(f"{tmp}[{out_index}]")})
    return tmp, dace.Memlet.from_array(tmp, ctx.sdfg.arrays[tmp])


def _reduce_broadcast(ctx: ReverseContext, full: str, x: Operand, label: str, alpha) -> None:
    """grad(x) += alpha * full, summed over the leading dimensions x lacks or has as literal 1."""
    fshape = ctx.sdfg.arrays[full].shape
    ranges = {f"__b{d}": f"0:{s}" for d, s in enumerate(fshape)}
    fparams = list(ranges)
    offset = len(fshape) - x.dims
    xparams: list[str | None] = []
    for d, size in enumerate(x.sizes()):
        broadcast = d < x.dims - 2 and str(size) == "1" and str(fshape[d + offset]) != "1"
        xparams.append(None if broadcast else fparams[d + offset])
    add_element_tasklet(ctx.new_state(f"sum_{label}"), f"sum_{label}", ranges,
                        {"__f": dace.Memlet(f"{full}[{', '.join(fparams)}]")}, f"__o = ({alpha}) * __f",
                        {"__o": dace.Memlet(f"{ctx.grad_of(x.array)}[{element(x, xparams)}]", wcr=SUM)})
