"""`Convolution` (gradflow's own node, `gradflow/library/convolution.py`): its gradients are the node's two
companions, each one library node that adds into a gradient buffer:

    gx += ConvolutionGradInput(gy, w)        gw += ConvolutionGradWeights(x, gy)

then the output's gradient is cleared (the node overwrites its output). Compiled, all three are per-image
products on OpenBLAS; the two-route check compares this rule with differentiating the node's map-nest
expansion.
"""

from __future__ import annotations

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.protocols import library_rule
from gradflow.autodiff.rules.library._common import (
    Operand,
    bilinear_needs,
    clear,
    node_of,
    operands,
    where,
)
from gradflow.core.errors import NotDifferentiableError
from gradflow.library.convolution import (
    ConvolutionGradInput,
    ConvolutionGradWeights,
    wire,
)


def _operands(site: OpSite) -> tuple[Operand, Operand, Operand]:
    ins, outs = operands(site)
    return ins["_x"], ins["_w"], outs["_y"]


@library_rule("Convolution")
class ConvolutionReverse:
    """Reverse of a 2-D convolution (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        return bilinear_needs(ctx, *_operands(site))

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node = node_of(site)
        x, w, y = _operands(site)
        if y.wcr is not None:
            raise NotDifferentiableError(f"{where(site)}: its output '{y.array}' is written with {y.wcr}")
        if y.array in (x.array, w.array):
            raise NotDifferentiableError(f"{where(site)}: it overwrites its own operand '{y.array}'",
                                         "write the result to a new array")
        gy = ctx.grad_of(y.array)
        if gy is None:
            return
        label = f"{site.state.label}_{node.label}"
        opts = {"strides": node.strides, "dilations": node.dilations, "layout": node.layout, "pads": node.pads}
        gx, gw = ctx.grad_of(x.array), ctx.grad_of(w.array)
        if gx:
            wire(ctx.new_state(f"reverse_{label}_gx"), ConvolutionGradInput(f"rev_{label}_gx", **opts),
                 {"_dy": y.memlet(gy), "_w": w.memlet(ctx.value_of(site.index, w.array))}, ("_dx", x.memlet(gx)))
        if gw:
            wire(ctx.new_state(f"reverse_{label}_gw"), ConvolutionGradWeights(f"rev_{label}_gw", **opts),
                 {"_x": x.memlet(ctx.value_of(site.index, x.array)), "_dy": y.memlet(gy)}, ("_dw", w.memlet(gw)))
        clear(ctx, y, label)
