"""Reductions and the normalisations built from them (Softmax, LogSoftmax, LayerNormalization).

A reduction is an init map (identity, or the first element along the reduced axes for max/min, which is
exact for every dtype) followed by a map over the input that accumulates into the output with a WCR.
Composite ops are sequences of these helpers, mirroring their ONNX function definitions.
"""

from __future__ import annotations

import numpy as np
import sympy

from gradflow.core.stop_gradient import SPELLING as STOP_SPELLING
from gradflow.core.stop_gradient import with_definition
from gradflow.core.wcr import MAX, MIN, PRODUCT, SUM
from gradflow.frontend.onnx.builder import (
    Dim, InvalidNode, Lowering, Tensor, dstr, norm_axes, norm_axis, norm_dim, params, prod,
)
from gradflow.frontend.onnx.rules.elementwise import typed
from gradflow.frontend.onnx.rules.tensor import axes_of
from gradflow.frontend.onnx.table import Node, onnx_rule

WCR = {"sum": SUM, "prod": PRODUCT, "max": MAX, "min": MIN}


def kept_shape(x: Tensor, axes: list[int]) -> tuple[Dim, ...]:
    return tuple(1 if k in axes else d for k, d in enumerate(x.shape))


def out_shape(x: Tensor, axes: list[int], keepdims: bool) -> tuple[Dim, ...]:
    return kept_shape(x, axes) if keepdims else tuple(d for k, d in enumerate(x.shape) if k not in axes)


def reduce_into(lw: Lowering, label: str, x: Tensor, axes: list[int], keepdims: bool, op: str, out: Tensor,
                pre: str = "a", extra: dict | None = None) -> None:
    """out = reduce_op over `axes` of pre(x) (`pre` is code over connector `a` and the `extra` connectors)."""
    p = params("p", x.rank)
    out_idx = ["0" if k in axes else q for k, q in enumerate(p)] if keepdims else [q for k, q in enumerate(p) if k not in axes]
    if op in ("max", "min"):
        qo = params("p", out.rank)
        src, it = [], iter(qo)
        for k in range(x.rank):
            src.append("0" if k in axes else (qo[k] if keepdims else next(it)))
        ins0 = {"a": (x, src)}
        code0 = f"o = {pre}"
        for c, (t, idx_fn) in (extra or {}).items():
            ins0[c] = (t, idx_fn(src))
        lw.map(label, list(zip(qo, out.shape)), ins0, code0, {"o": (out, qo, None)})
    else:
        lw.fill(label, out, "0" if op == "sum" else "1")
    ins = {"a": (x, p)}
    for c, (t, idx_fn) in (extra or {}).items():
        ins[c] = (t, idx_fn(p))
    lw.map(label, list(zip(p, x.shape)), ins, typed(f"o = {pre}", x.dtype), {"o": (out, out_idx, WCR[op])})


def _reduce_axes(lw: Lowering, node: Node, x: Tensor, attr_until: int) -> list[int] | None:
    """Axes of a Reduce* node; None = identity (noop_with_empty_axes)."""
    if node.opset < attr_until:
        axes = node.attr("axes")
        axes = [int(a) for a in axes] if axes is not None else None
    else:
        axes = axes_of(lw, node, 1)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return None
        axes = list(range(x.rank))
    return sorted(norm_axes(axes, x.rank))


#: op -> (accumulation, code applied to each element, code applied to the result `r`)
REDUCTIONS = {
    "ReduceSum": ("sum", "a", None, 13),
    "ReduceMean": ("sum", "a", "mean", 18),
    "ReduceMax": ("max", "a", None, 18),
    "ReduceMin": ("min", "a", None, 18),
    "ReduceProd": ("prod", "a", None, 18),
    "ReduceL1": ("sum", "abs(a)", None, 18),
    "ReduceL2": ("sum", "a * a", "sqrt(r)", 18),
    "ReduceSumSquare": ("sum", "a * a", None, 18),
    "ReduceLogSum": ("sum", "a", "log(r)", 18),
    "ReduceLogSumExp": ("sum", "exp(a - m)", "log(r) + m", 18),
}


def _empty_value(op: str, dtype: np.dtype) -> str:
    """The value of a reduction over an empty set (its identity element)."""
    if op in ("ReduceMax", "ReduceMin"):
        if dtype == np.bool_:
            return "False" if op == "ReduceMax" else "True"
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return str(int(info.min if op == "ReduceMax" else info.max))
        return "-inf" if op == "ReduceMax" else "inf"
    if op in ("ReduceLogSum", "ReduceLogSumExp"):
        return "-inf"
    if op == "ReduceProd":
        return "1"
    if op == "ReduceMean":
        return "nan"
    return "0"


@onnx_rule(*REDUCTIONS)
def reduction(lw: Lowering, node: Node) -> None:
    """Reduce* ops: an accumulation over the axes of a per-element code, then a code applied to the result."""
    op = node.op_type
    acc, pre, post, attr_until = REDUCTIONS[op]
    x = lw.get(node.inputs[0])
    axes = _reduce_axes(lw, node, x, attr_until)
    keep = bool(node.attr("keepdims", 1))
    if axes is None:
        p = params("p", x.rank)
        out = lw.output(node.outputs[0], x.shape, x.dtype)
        code = {"ReduceL1": "o = abs(a)", "ReduceL2": "o = abs(a)", "ReduceSumSquare": "o = a * a",
                "ReduceLogSum": "o = log(a)", "ReduceLogSumExp": "o = a"}.get(op, "o = a")
        lw.map(node.label, list(zip(p, x.shape)), {"a": (x, p)}, typed(code, x.dtype), {"o": (out, p, None)})
        return
    shape = out_shape(x, axes, keep)
    if any(isinstance(x.shape[a], int) and x.shape[a] == 0 for a in axes):
        out = lw.output(node.outputs[0], shape, x.dtype)
        lw.fill(node.label, out, _empty_value(op, x.dtype))
        return
    extra = None
    if op == "ReduceLogSumExp":
        m = lw.temp(kept_shape(x, axes), x.dtype, "max")
        reduce_into(lw, node.label, x, axes, True, "max", m)
        extra = {"m": (m, lambda idx, axes=axes: [("0" if k in axes else q) for k, q in enumerate(idx)])}
    if post is None:
        out = lw.output(node.outputs[0], shape, x.dtype)
        reduce_into(lw, node.label, x, axes, keep, acc, out, pre, extra)
        return
    r = lw.temp(kept_shape(x, axes), x.dtype, "acc")
    reduce_into(lw, node.label, x, axes, True, acc, r, pre, extra)
    out = lw.output(node.outputs[0], shape, x.dtype)
    q = params("p", x.rank)
    oidx = q if keep else [v for k, v in enumerate(q) if k not in axes]
    ridx = ["0" if k in axes else v for k, v in enumerate(q)]
    ranges = [(v, 1 if k in axes else d) for k, (v, d) in enumerate(zip(q, x.shape))]
    ins = {"r": (r, ridx)}
    code = post
    if post == "mean":
        code = f"r / ({dstr(prod(x.shape[k] for k in axes))})"
    if extra:
        ins["m"] = (extra["m"][0], ridx)
    lw.map(node.label, ranges, ins, typed(f"o = {code}", x.dtype), {"o": (out, oidx, None)})


@onnx_rule("ArgMax", "ArgMin")
def arg_extremum(lw: Lowering, node: Node) -> None:
    """The position of the largest (smallest) element along `axis`: the extremum `m`, then the least (with
    `select_last_index`, the greatest) position holding it, a write-conflict min (max) of positions. int64,
    so it carries no gradient (torch's `max(dim)` exports its indices to it)."""
    x = lw.get(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), x.rank)
    keep = bool(node.attr("keepdims", 1))
    n = x.shape[axis]
    if isinstance(n, int) and n == 0:
        raise InvalidNode(f"axis {axis} has no elements: there is no position of an extremum")
    m = lw.temp(kept_shape(x, [axis]), x.dtype, "extremum")
    reduce_into(lw, node.label, x, [axis], True, "max" if node.op_type == "ArgMax" else "min", m)
    out = lw.output(node.outputs[0], out_shape(x, [axis], keep), np.int64)
    last = bool(node.attr("select_last_index", 0))
    none = "-1" if last else dstr(n)  # no position: loses every comparison
    lw.fill(node.label, out, none)
    p = params("p", x.rank)
    kidx = ["0" if k == axis else q for k, q in enumerate(p)]
    oidx = kidx if keep else [q for k, q in enumerate(p) if k != axis]
    lw.map(node.label, list(zip(p, x.shape)), {"a": (x, p), "m": (m, kidx)}, f"o = ({p[axis]} if a == m else {none})",
           {"o": (out, oidx, WCR["max" if last else "min"])})


def softmax_like(lw: Lowering, node: Node, log: bool) -> None:
    """Softmax as max, e = exp(x - m) kept, s = sum(e), e / s (LogSoftmax: x - m - log(s)).

    The max `m` only keeps exp from overflowing: the result does not depend on it, so its derivative through
    `m` is exactly zero and `m` is read through a stop (`core.stop_gradient`); the backward then neither
    sums gradients into `m` nor reverses the max. `e` is an array of its own so that exp runs once per
    element, and the reverse of `e / s` and of `exp` read `e` instead of calling exp again."""
    x = lw.get(node.inputs[0])
    if node.opset < 13:
        axis = norm_axis(node.attr("axis", 1), x.rank)
        axes = list(range(axis, x.rank))
    else:
        axes = [norm_axis(node.attr("axis", -1), x.rank)]
    keep = kept_shape(x, axes)
    m = lw.temp(keep, x.dtype, "max")
    reduce_into(lw, node.label, x, axes, True, "max", m)
    lw.sdfg.global_code = {**lw.sdfg.global_code, "frame": with_definition(lw.sdfg.global_code.get("frame"))}
    kidx = lambda idx: ["0" if k in axes else q for k, q in enumerate(idx)]  # noqa: E731
    p = params("p", x.rank)
    ranges = list(zip(p, x.shape))
    shifted = f"a - {STOP_SPELLING}(m)"
    s = lw.temp(keep, x.dtype, "sum")
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    if log:
        reduce_into(lw, node.label, x, axes, True, "sum", s, f"exp({shifted})", {"m": (m, kidx)})
        lw.map(node.label, ranges, {"a": (x, p), "m": (m, kidx(p)), "s": (s, kidx(p))},
               typed(f"o = {shifted} - log(s)", x.dtype), {"o": (out, p, None)})
        return
    e = lw.temp(x.shape, x.dtype, "exp")
    lw.map(node.label, ranges, {"a": (x, p), "m": (m, kidx(p))}, typed(f"o = exp({shifted})", x.dtype),
           {"o": (e, p, None)})
    reduce_into(lw, node.label, e, axes, True, "sum", s)
    lw.map(node.label, ranges, {"e": (e, p), "s": (s, kidx(p))}, typed("o = e / s", x.dtype), {"o": (out, p, None)})


@onnx_rule("Softmax")
def softmax(lw: Lowering, node: Node) -> None:
    softmax_like(lw, node, log=False)


@onnx_rule("LogSoftmax")
def log_softmax(lw: Lowering, node: Node) -> None:
    softmax_like(lw, node, log=True)


def _moments(lw: Lowering, node: Node, x: Tensor, axes: list[int], eps: float, mean_name: str = "",
             invstd_name: str = "") -> tuple[Tensor, Tensor]:
    """(mean, 1 / sqrt(variance + eps)) of `x` over `axes`, the axes kept with extent 1; into the named
    outputs where the node has them."""
    keep = kept_shape(x, axes)
    n = dstr(prod(x.shape[k] for k in axes))
    kidx = lambda idx: ["0" if k in axes else q for k, q in enumerate(idx)]  # noqa: E731
    kp = params("p", x.rank)
    kranges = list(zip(kp, keep))
    s = lw.temp(keep, x.dtype, "sum")
    reduce_into(lw, node.label, x, axes, True, "sum", s)
    mean = lw.output(mean_name, keep, x.dtype) if mean_name else lw.temp(keep, x.dtype, "mean")
    lw.map(node.label, kranges, {"s": (s, kp)}, f"o = s / ({n})", {"o": (mean, kp, None)})
    v = lw.temp(keep, x.dtype, "var")
    reduce_into(lw, node.label, x, axes, True, "sum", v, "(a - m) * (a - m)", {"m": (mean, kidx)})
    inv = lw.output(invstd_name, keep, x.dtype) if invstd_name else lw.temp(keep, x.dtype, "invstd")
    lw.map(node.label, kranges, {"v": (v, kp)}, typed(f"o = 1.0 / sqrt(v / ({n}) + {eps!r})", x.dtype),
           {"o": (inv, kp, None)})
    return mean, inv


@onnx_rule("LayerNormalization")
def layer_norm(lw: Lowering, node: Node) -> None:
    """Y = (X - mean) * invstd * scale + bias over the axes from `axis` on; Mean / InvStdDev outputs kept."""
    from gradflow.frontend.onnx.builder import bcast_index

    x = lw.get(node.inputs[0])
    axis = norm_axis(node.attr("axis", -1), x.rank)
    axes = list(range(axis, x.rank))
    mean, inv = _moments(lw, node, x, axes, float(node.attr("epsilon", 1e-5)), node.output(1), node.output(2))
    kidx = lambda idx: ["0" if k in axes else q for k, q in enumerate(idx)]  # noqa: E731
    p = params("p", x.rank)
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    ins = {"a": (x, p), "m": (mean, kidx(p)), "r": (inv, kidx(p))}
    code = "o = (a - m) * r"
    scale = lw.get(node.inputs[1])
    ins["g"] = (scale, bcast_index(scale.shape, x.shape, p))
    code += " * g"
    if node.input(2):
        bias = lw.get(node.input(2))
        ins["b"] = (bias, bcast_index(bias.shape, x.shape, p))
        code += " + b"
    lw.map(node.label, list(zip(p, x.shape)), ins, code, {"o": (out, p, None)})


@onnx_rule("InstanceNormalization")
def instance_norm(lw: Lowering, node: Node) -> None:
    """Y = (X - mean) * invstd * scale[c] + B[c], the moments over each sample's and channel's spatial axes
    (X: N x C x D1 ...): what torch's GroupNorm and InstanceNorm export to."""
    x = lw.get(node.inputs[0])
    if x.rank < 3:
        raise InvalidNode(f"input of rank {x.rank}; InstanceNormalization needs N x C x D1 ...")
    scale, bias = lw.get(node.inputs[1]), lw.get(node.inputs[2])
    for what, t in (("scale", scale), ("B", bias)):
        diff = norm_dim(sympy.sympify(t.shape[0]) - x.shape[1]) if t.rank == 1 else None
        if t.rank != 1 or (isinstance(diff, int) and diff != 0):
            raise InvalidNode(f"{what} of shape {tuple(t.shape)} for {dstr(x.shape[1])} channels")
    axes = list(range(2, x.rank))
    mean, inv = _moments(lw, node, x, axes, float(node.attr("epsilon", 1e-5)))
    p = params("p", x.rank)
    kidx = ["0" if k in axes else q for k, q in enumerate(p)]
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    ins = {"a": (x, p), "m": (mean, kidx), "r": (inv, kidx), "g": (scale, [p[1]]), "b": (bias, [p[1]])}
    lw.map(node.label, list(zip(p, x.shape)), ins, "o = (a - m) * r * g + b", {"o": (out, p, None)})
