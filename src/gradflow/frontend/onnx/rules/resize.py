"""Resize: separable interpolation, one map per resized axis.

Interpolation is linear in the data along each axis: out_axis = W @ in_axis + b. The matrix W (and the
offset b, non-zero only where tf_crop_and_resize extrapolates) is computed at lowering time, row by row,
following the operator specification: the output coordinate is mapped back to the input
(`coordinate_transformation_mode`), the interpolation kernel gives one weight per neighbour (nearest with
its `nearest_mode`, linear, cubic with `cubic_coeff_a`, both optionally `antialias`ed), neighbours beyond
the edges repeat the edge value (or are dropped and the weights renormalised with `exclude_outside`). W is
stored sparse (per output index: up to T taps with source index and weight); each axis step is a map over
the output and the taps accumulating `w * x[idx]` in float64, followed by one cast to the output dtype.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from gradflow.core.wcr import SUM
from gradflow.frontend.onnx.builder import Lowering, RuleUnsupported, Tensor, norm_axes, params, sub
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, as_int_list, onnx_rule

#: Kernel weights of one output element: (ratio in (0, 1], scale) -> one weight per neighbour.
Coeffs = Callable[[float, float], np.ndarray]


def _cubic_kernel(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with parameter `a` (-0.75 in ONNX, -0.5 in some exporters)."""
    t = np.abs(np.asarray(t, dtype=np.float64))
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _nearest(mode: str) -> Coeffs:
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():  # on a sample: take it
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            right = ratio > 0.5
        elif mode == "round_prefer_ceil":
            right = ratio >= 0.5
        elif mode in ("floor", "ceil"):
            right = mode == "ceil"
        else:
            raise RuleUnsupported(f"nearest_mode {mode!r}")
        return np.array([0.0, 1.0]) if right else np.array([1.0, 0.0])

    return coeffs


def _antialiased(kernel: Callable[[np.ndarray], np.ndarray], support: int) -> Coeffs:
    """Kernel stretched by 1/scale when downsampling (scale < 1), weights normalised to sum 1."""

    def coeffs(ratio: float, scale: float) -> np.ndarray:
        scale = min(scale, 1.0)
        start = int(np.floor(-support / scale) + 1)
        taps = np.arange(start, 2 - start, dtype=np.float64)  # symmetric window around the sample
        w = kernel((taps - ratio) * scale)
        return w / w.sum()

    return coeffs


def _coeff_fn(node: Node) -> Coeffs:
    mode = node.attr("mode", "nearest")
    antialias = node.attr("antialias", 0)
    if mode == "nearest":
        return _nearest(node.attr("nearest_mode", "round_prefer_floor"))
    if mode == "linear":
        tent = lambda t: np.clip(1 - np.abs(t), 0, 1)  # noqa: E731
        if antialias:
            return _antialiased(tent, 1)
        return lambda ratio, scale: np.array([1 - ratio, ratio], dtype=np.float64)
    if mode == "cubic":
        a = float(node.attr("cubic_coeff_a", -0.75))
        if antialias:
            return _antialiased(lambda t: _cubic_kernel(t, a), 2)
        return lambda ratio, scale: _cubic_kernel(np.array([ratio + 1, ratio, 1 - ratio, 2 - ratio]), a)
    raise RuleUnsupported(f"mode {mode!r}")


def _source_coordinate(x: int, mode: str, scale: float, n_in: int, n_out: int, roi) -> float | None:
    """Input coordinate of output index `x` (None: outside the crop box of tf_crop_and_resize)."""
    width = scale * n_in  # the unrounded output length
    if mode == "align_corners":
        return 0.0 if width == 1 else x * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        if roi is None:
            raise RuleUnsupported("tf_crop_and_resize needs roi")
        lo, hi = float(roi[0]), float(roi[1])
        pos = (hi - lo) * (n_in - 1) / 2 if width == 1 else x * (hi - lo) * (n_in - 1) / (width - 1)
        pos += lo * (n_in - 1)
        return None if pos < 0 or pos > n_in - 1 else pos
    if mode == "pytorch_half_pixel":
        return -0.5 if width == 1 else (x + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)  # centres the (rounded) output canvas on the input
        return offset + (x + 0.5) / scale - 0.5
    raise RuleUnsupported(f"coordinate_transformation_mode {mode!r}")


def _neighbours(pos: float, n: int, n_in: int) -> np.ndarray:
    """The n integers nearest to `pos` (ties: the smaller), among the input indices extended by
    ceil(n/2) on each side; ascending."""
    pad = -(-n // 2)
    base = math.floor(pos)
    cands = [i for i in range(base - n, base + n + 2) if -pad <= i < n_in + pad]
    return np.array(sorted(sorted(cands, key=lambda i: (abs(pos - i), i))[:n]), dtype=np.int64)


def _axis_weights(node: Node, coeffs: Coeffs, scale: float, n_in: int, n_out: int, roi) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) with out = W @ in + b along one axis."""
    mode = node.attr("coordinate_transformation_mode", "half_pixel")
    exclude_outside = bool(node.attr("exclude_outside", 0))
    W = np.zeros((n_out, n_in), dtype=np.float64)
    b = np.zeros(n_out, dtype=np.float64)
    for x in range(n_out):
        pos = _source_coordinate(x, mode, scale, n_in, n_out, roi)
        if pos is None:
            b[x] = float(node.attr("extrapolation_value", 0.0))
            continue
        ratio = 1.0 if float(pos).is_integer() else pos - math.floor(pos)  # in (0, 1]: the left sample is below
        w = np.array(coeffs(ratio, scale), dtype=np.float64)
        idx = _neighbours(pos, len(w), n_in)
        if exclude_outside:
            w = np.where((idx >= 0) & (idx < n_in), w, 0.0)
            w = w / w.sum()
        np.add.at(W[x], np.clip(idx, 0, n_in - 1), w)  # outside neighbours repeat the edge sample
    return W, b


def _plan(node: Node, shape: list[int], scales, sizes, axes):
    """Scale factor and output size per axis (from scales or sizes, with axes and keep_aspect_ratio_policy)."""
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


@onnx_rule("Resize", opsets=(11, LATEST_OPSET))  # Resize-10 had no roi input and two modes
def resize(lw: Lowering, node: Node) -> None:
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
    axes = norm_axes(axes, len(shape)) if axes is not None else None
    r = len(shape)
    axes, scale_factors, out_size = _plan(node, shape, scales, sizes, axes)
    if roi is not None and node.attr("axes") is not None:
        full = [0.0] * r + [1.0] * r
        for i, d in enumerate(axes):
            full[d], full[r + d] = roi[i], roi[len(axes) + i]
        roi = np.array(full)
    coeffs = _coeff_fn(node)
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
        W, b = _axis_weights(node, coeffs, scale, n_in, n_out, axis_roi)
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
