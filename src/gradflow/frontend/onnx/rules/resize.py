"""Resize: separable interpolation, one map per resized axis.

Interpolation is linear in the data along each axis: out_axis = W @ in_axis + b. The matrix W (and the
offset b, non-zero only where tf_crop_and_resize extrapolates) is computed at lowering time by applying
ONNX's reference 1-D interpolation to the identity, so every coordinate mode, nearest mode, cubic
coefficient, exclude_outside and antialias setting has exactly the spec's semantics. W is stored sparse
(per output index: up to T taps with source index and weight); each axis step is a map over the output
and the taps accumulating `w * x[idx]` in float64, followed by one cast to the output dtype.
"""

from __future__ import annotations

import math

import numpy as np

from gradflow.frontend.onnx.builder import Lowering, RuleUnsupported, Tensor, params, sub
from gradflow.frontend.onnx.table import Node, as_int_list, onnx_rule

SUM = "lambda a, b: a + b"


def _coeff_fn(node: Node):
    from onnx.reference.ops import op_resize as ref

    mode = node.attr("mode", "nearest")
    antialias = node.attr("antialias", 0)
    if mode == "nearest":
        nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
        return lambda x, scale: ref._nearest_coeffs(x, mode=nearest_mode)
    if mode == "linear":
        return ref._linear_coeffs_antialias if antialias else ref._linear_coeffs
    if mode == "cubic":
        a = float(node.attr("cubic_coeff_a", -0.75))
        fn = ref._cubic_coeffs_antialias if antialias else ref._cubic_coeffs
        return lambda x, scale: fn(x, scale, A=a)
    raise RuleUnsupported(f"mode {mode!r}")


def _plan(node: Node, shape: list[int], scales, sizes, axes):
    """Scale factor and output size per axis (the reference's _interpolate_nd rules)."""
    r = len(shape)
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if axes is None:
        axes = list(range(r))
    if scales is not None:
        full = [1.0] * r
        for i, d in enumerate(axes):
            full[d] = float(scales[i])
        scales = full
    if sizes is not None:
        full_sizes = list(shape)
        for i, d in enumerate(axes):
            full_sizes[d] = int(sizes[i])
        scales = [full_sizes[i] / shape[i] for i in range(r)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scales[a] for a in axes)
            scales = [s if i in axes else 1.0 for i in range(r)]
            full_sizes = [int(s * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
        out = full_sizes
    else:
        out = [int(v) for v in (np.array(scales) * np.array(shape)).astype(int)]
    return axes, scales, out


@onnx_rule("Resize", applies=lambda n: n.opset >= 11)
def resize(lw: Lowering, node: Node) -> None:
    from onnx.reference.ops import op_resize as ref

    x = lw.get(node.inputs[0])
    if not all(isinstance(d, int) for d in x.shape):
        raise RuleUnsupported("symbolic input shape")
    shape = list(x.shape)
    roi = np.asarray(lw.value(node.input(1)), dtype=np.float64).reshape(-1) if node.input(1) else None
    scales = np.asarray(lw.value(node.input(2))).reshape(-1) if node.input(2) else None
    sizes = as_int_list(lw.value(node.input(3))) if node.input(3) else None
    if scales is not None and scales.size == 0:
        scales = None
    if roi is not None and roi.size == 0:
        roi = None
    axes = node.attr("axes")
    axes = [int(a) % len(shape) for a in axes] if axes is not None else None
    r = len(shape)
    axes, scale_factors, out_size = _plan(node, shape, scales, sizes, axes)
    if roi is not None and node.attr("axes") is not None:
        full = [0.0] * r + [1.0] * r
        for i, d in enumerate(axes):
            full[d], full[r + d] = roi[i], roi[len(axes) + i]
        roi = np.array(full)
    coeffs = _coeff_fn(node)
    kwargs = dict(
        coordinate_transformation_mode=node.attr("coordinate_transformation_mode", "half_pixel"),
        extrapolation_value=float(node.attr("extrapolation_value", 0.0)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
    )
    cur: Tensor = x
    cur_shape = list(shape)
    for axis in axes:
        scale, n_out, n_in = float(scale_factors[axis]), int(out_size[axis]), cur_shape[axis]
        axis_roi = None if roi is None else [roi[axis], roi[axis + r]]
        if math.isclose(scale, 1.0) and n_out == n_in and (
            axis_roi is None or (math.isclose(float(axis_roi[0]), 0.0) and math.isclose(float(axis_roi[1]), 1.0))
        ):
            continue
        if n_out == 0 or n_in == 0:
            raise RuleUnsupported("empty resize")
        W = ref._interpolate_1d_along_axis(np.eye(n_in), 0, scale, n_out, coeffs, roi=axis_roi, **kwargs)
        b = ref._interpolate_1d_along_axis(np.zeros((n_in, 1)), 0, scale, n_out, coeffs, roi=axis_roi, **kwargs)[:, 0]
        W = W - b[:, None]
        taps = max(1, int((W != 0).sum(axis=1).max()))
        idx = np.zeros((n_out, taps), dtype=np.int64)
        wts = np.zeros((n_out, taps), dtype=np.float64)
        for i in range(n_out):
            nz = np.nonzero(W[i])[0]
            idx[i, : len(nz)] = nz
            wts[i, : len(nz)] = W[i, nz]
        tables = {}
        for key, value in (("idx", idx), ("w", wts), ("b", b)):
            name = f"{node.outputs[0]}\x00{key}{axis}"
            lw.set_value(name, value)
            tables[key] = lw.get(name)
        new_shape = list(cur_shape)
        new_shape[axis] = n_out
        nxt = lw.temp(new_shape, np.float64, "resized")
        p = params("p", len(new_shape))
        lw.map(node.label, list(zip(p, new_shape)), {"b": (tables["b"], [p[axis]])}, "o = b", {"o": (nxt, p, None)})
        src = list(p)
        src[axis] = "i"
        lw.map(node.label, [*zip(p, new_shape), ("t", taps)],
               {"a": (cur, None), "i": (tables["idx"], [p[axis], "t"]), "w": (tables["w"], [p[axis], "t"])},
               f"o = w * {sub('a', cur, src)}", {"o": (nxt, p, SUM)})
        cur, cur_shape = nxt, new_shape
    out = lw.output(node.outputs[0], cur_shape, x.dtype)
    p = params("p", len(cur_shape))
    code = "o = v"
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        code = f"o = min(max(round(v), {int(info.min)}), {int(info.max)})"
    lw.map(node.label, list(zip(p, cur_shape)), {"v": (cur, p)}, code, {"o": (out, p, None)})
