"""Data movement ops: constants, shapes, reshapes, indexing, padding, gathers and scatters.

Index maps known without data (reshape, transpose, slice, tile, concat) are memlet subsets, so the
dataflow stays analysable. Data-dependent reads (Gather*, Pad's reflection, scatters) read the whole
array through a dynamic memlet and index it in the tasklet.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import sympy

from gradflow.frontend.onnx.builder import (
    Checked, Dim, InvalidNode, Lowering, RuleUnsupported, Tensor, broadcast_shapes, dstr, exact_div, norm_axes,
    norm_axis, norm_dim, params, prod, strides, sub,
)
from gradflow.frontend.onnx.dtypes import check_dtype
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, as_int_list, onnx_rule

BIG = 2**62


# -- constants and shapes ---------------------------------------------------------------------------
@onnx_rule("Constant")
def constant(lw: Lowering, node: Node) -> None:
    a = node.attrs
    if "value" in a:
        v = np.asarray(a["value"])
    elif "value_float" in a:
        v = np.array(a["value_float"], dtype=np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], dtype=np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], dtype=np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], dtype=np.int64)
    else:
        raise RuleUnsupported("only numeric constant values are supported")
    check_dtype(v.dtype, f"the constant '{node.outputs[0]}'")
    lw.set_value(node.outputs[0], v)


@onnx_rule("Shape")
def shape(lw: Lowering, node: Node) -> None:
    dims = list(lw.info(node.inputs[0]).shape)
    start, end = node.attr("start", 0), node.attr("end", None)
    dims = dims[start:end] if end is not None else dims[start:]
    if all(isinstance(d, int) for d in dims):
        lw.set_value(node.outputs[0], np.array(dims, dtype=np.int64))
    else:
        v = np.empty(len(dims), dtype=object)
        v[:] = dims
        lw.set_value(node.outputs[0], v, np.int64)


@onnx_rule("Size")
def size(lw: Lowering, node: Node) -> None:
    n = prod(lw.info(node.inputs[0]).shape)
    v = np.array(n, dtype=np.int64) if isinstance(n, int) else np.array(n, dtype=object)
    lw.set_value(node.outputs[0], v, np.int64)


@onnx_rule("ConstantOfShape")
def constant_of_shape(lw: Lowering, node: Node) -> None:
    shp = [norm_dim(d) for d in np.asarray(lw.value(node.inputs[0])).reshape(-1)]
    val = np.asarray(node.attr("value", np.zeros(1, np.float32))).reshape(-1)
    out = lw.output(node.outputs[0], shp, val.dtype)
    lw.fill(node.label, out, literal(val[0]))


def literal(v) -> str:
    v = np.asarray(v).item()
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(int(v))
    f = float(v)
    if np.isnan(f):
        return "nan"
    if np.isinf(f):
        return "inf" if f > 0 else "-inf"
    return repr(f)


@onnx_rule("OneHot")
def one_hot(lw: Lowering, node: Node) -> None:
    """out[..., k, ...] = on where the index (negative ones counted from the end) is k, else off; the depth
    decides the shape, so it must be known while lowering (torch's `one_hot` exports it as a constant)."""
    ind, vals = lw.get(node.inputs[0]), lw.get(node.inputs[2])
    depth_value = np.asarray(lw.value(node.inputs[1])).reshape(-1)
    if depth_value.size != 1:
        raise InvalidNode(f"depth must hold one value, it has {depth_value.size}")
    depth = int(depth_value[0])
    if depth < 1:
        raise InvalidNode(f"depth {depth} must be at least 1")
    if vals.rank != 1 or vals.shape[0] != 2:
        raise InvalidNode(f"values of shape {tuple(vals.shape)}; OneHot needs [off, on]")
    rank = ind.rank + 1
    axis = node.attr("axis", -1)
    if not -rank <= axis < rank:
        raise InvalidNode(f"axis {axis} is out of range for an output of rank {rank}")
    axis %= rank
    shape = list(ind.shape[:axis]) + [depth] + list(ind.shape[axis:])
    out = lw.output(node.outputs[0], shape, vals.dtype)
    p = params("p", rank)
    k = p[axis]
    lw.map(node.label, list(zip(p, shape)), {"i": (ind, p[:axis] + p[axis + 1:]), "off": (vals, ["0"]),
                                             "on": (vals, ["1"])},
           f"j = dace.int64(i)\no = on if (j == {k} or j + {depth} == {k}) else off", {"o": (out, p, None)})


@onnx_rule("Identity")
def identity(lw: Lowering, node: Node) -> None:
    lw.set(node.outputs[0], lw.info(node.inputs[0]))


@onnx_rule("Dropout")
def dropout(lw: Lowering, node: Node) -> None:
    """Inference (or ratio 0) is the identity with an all-true mask. Training mode keeps element i when
    u[i] >= ratio, u = numpy `RandomState(seed).uniform(0, 1, shape)`, the draws of ONNX's reference
    implementation; they are made at lowering time, so the mask is a constant of the lowered program (the
    same on every call, as with the reference evaluator). It needs the `seed` attribute and a static shape."""
    training = node.input(2) and bool(np.asarray(lw.value(node.input(2))).reshape(-1)[0])
    if node.opset < 7 and not node.attr("is_test", 0):
        training = True
    ratio = float(np.asarray(lw.value(node.input(1))).reshape(-1)[0]) if node.input(1) else node.attr("ratio", 0.5)
    x = lw.info(node.inputs[0])
    if not training or ratio == 0.0:
        lw.set(node.outputs[0], x)
        if node.output(1):
            mask = lw.output(node.output(1), x.shape, np.bool_)
            lw.fill(node.label, mask, "True")
        return
    keep = _dropout_keep(node, x, ratio)
    mask_name = node.output(1) or lw.namer("mask", node.label)
    lw.set_value(mask_name, keep)
    code = f"res = (x * {literal(1.0 / (1.0 - ratio))}) if m else (x * 0)"
    lw.elementwise(node.label, code, {"x": lw.get(node.inputs[0]), "m": lw.get(mask_name)}, node.outputs[0], x.dtype)


def _dropout_keep(node: Node, x: Tensor, ratio: float) -> np.ndarray:
    seed = node.attr("seed")
    if seed is None:
        raise RuleUnsupported(
            "training-mode dropout without a 'seed' attribute (gradflow draws the mask while lowering, so it "
            "needs a seed; set one, or export in inference mode)"
        )
    if not 0.0 <= ratio < 1.0:
        raise RuleUnsupported(f"dropout ratio {ratio} outside [0, 1)")
    if not all(isinstance(d, int) for d in x.shape):
        raise RuleUnsupported("training-mode dropout needs a static input shape (its mask is drawn while lowering)")
    if not 0 <= int(seed) < 2**32:
        raise RuleUnsupported(f"dropout seed {seed} outside [0, 2**32)")
    return np.random.RandomState(int(seed)).uniform(0.0, 1.0, tuple(x.shape)) >= ratio


# -- reshapes ----------------------------------------------------------------------------------------
def reshape_to(lw: Lowering, node: Node, shape: tuple[Dim, ...]) -> None:
    """Copy with C-order reinterpretation: out[p] = x[unflatten(flatten(p))]."""
    x = lw.get(node.inputs[0])
    if norm_dim(prod(shape) - prod(x.shape)) != 0:
        raise RuleUnsupported(f"cannot reshape {x.shape} to {shape}")
    out = lw.output(node.outputs[0], shape, x.dtype)
    refined = refined_copy(out.shape, x.shape) or common_refinement(out.shape, x.shape)
    if refined is not None:
        ranges, out_index, in_index = refined
        lw.map(node.label, ranges, {"a": (x, in_index)}, "o = a", {"o": (out, out_index, None)})
        return
    p = params("p", out.rank)
    lw.copy_indexed(node.label, x, out, reindex(out.shape, x.shape, p), p)


def refined_copy(out_shape, in_shape) -> tuple[list, list[str], list[str]] | None:
    """A reshape as a map whose two indices are affine in its parameters, or None: where the non-unit
    dimensions of both shapes fall into consecutive groups of equal size that are one dimension on one
    side (dimensions merged or split), the map runs over the finer side's dimensions of each group and the
    coarser side's index is their row-major position. Without integer divisions in the indices, the
    adjoint of the copy adds into one element of the input's gradient per iteration, which DaCe tells
    apart (through `reindex`, every add of a transformer's attention reshapes was atomic)."""
    if any(isinstance(d, int) and d == 0 for d in (*out_shape, *in_shape)):
        return None  # no elements: `reindex`'s map of no iterations
    outs = [(k, d) for k, d in enumerate(out_shape) if not (isinstance(d, int) and d == 1)]
    ins = [(k, d) for k, d in enumerate(in_shape) if not (isinstance(d, int) and d == 1)]
    ranges: list = []
    out_index, in_index = ["0"] * len(out_shape), ["0"] * len(in_shape)
    i = j = 0
    while i < len(outs) or j < len(ins):
        if i >= len(outs) or j >= len(ins):
            return None
        group_o, group_i = [outs[i]], [ins[j]]
        i, j = i + 1, j + 1
        while norm_dim(prod(d for _, d in group_o) - prod(d for _, d in group_i)) != 0:
            if len(group_o) > 1 and len(group_i) > 1:
                return None
            size_o, size_i = prod(d for _, d in group_o), prod(d for _, d in group_i)
            smaller_out = _known_less(size_o, size_i)
            if smaller_out is None:
                return None
            if smaller_out and i < len(outs):
                group_o.append(outs[i])
                i += 1
            elif not smaller_out and j < len(ins):
                group_i.append(ins[j])
                j += 1
            else:
                return None
        if len(group_o) > 1 and len(group_i) > 1:
            return None
        fine, coarse, fine_index, coarse_index, name = (group_o, group_i[0], out_index, in_index, "p") \
            if len(group_i) == 1 else (group_i, group_o[0], in_index, out_index, "q")
        position, stride = [], 1
        for k, d in reversed(fine):
            fine_index[k] = f"{name}{k}"
            ranges.insert(len(ranges) - len(position), (f"{name}{k}", d))
            position.append(f"{name}{k}*({dstr(stride)})")
            stride = stride * d
        coarse_index[coarse[0]] = " + ".join(reversed(position))
    return (ranges or [("p0", 1)]), out_index, in_index


def common_refinement(out_shape, in_shape) -> tuple[list, list[str], list[str]] | None:
    """A reshape of known sizes that regroups dimensions on both sides (an attention layer's
    `(T, B, H*D) -> (T, B*H, D)`, which `refined_copy` leaves) as a map over the common refinement of the two
    shapes, or None: walking both shapes from their last dimension, each step takes the smaller of the two
    sizes left, which must divide the larger; it becomes a map parameter whose place value in each side's
    current dimension is the product of the steps before it there. Both indices stay affine, as in
    `refined_copy`, where `reindex` divides."""
    if not all(isinstance(d, (int, np.integer)) and d > 0 for d in (*out_shape, *in_shape)):
        return None
    sides = [[k for k, d in enumerate(shape) if d != 1] for shape in (out_shape, in_shape)]
    shapes = (out_shape, in_shape)
    indices: list[list[str]] = [["0"] * len(out_shape), ["0"] * len(in_shape)]
    terms: list[dict[int, list[str]]] = [{}, {}]
    left = [shapes[s][sides[s][-1]] if sides[s] else 1 for s in (0, 1)]
    place = [1, 1]
    ranges: list = []
    while sides[0] and sides[1]:
        step = min(left)
        if left[0] % step or left[1] % step:
            return None
        name = f"r{len(ranges)}"
        ranges.insert(0, (name, step))
        for s in (0, 1):
            terms[s].setdefault(sides[s][-1], []).append(f"{name}*{place[s]}" if place[s] != 1 else name)
            left[s] //= step
            place[s] *= step
            if left[s] == 1:
                sides[s].pop()
                left[s], place[s] = (shapes[s][sides[s][-1]], 1) if sides[s] else (1, 1)
    if sides[0] or sides[1]:
        return None
    for s in (0, 1):
        for k, parts in terms[s].items():
            indices[s][k] = " + ".join(reversed(parts))
    return (ranges or [("r0", 1)]), indices[0], indices[1]


def _known_less(a, b) -> bool | None:
    """Whether size a < size b, where both are known numbers or a ratio of them is; None if unknown."""
    ratio = sympy.simplify(sympy.sympify(b) / sympy.sympify(a))
    if ratio.is_number and ratio.is_finite:
        return bool(ratio > 1)
    return None


def reindex(out_shape, in_shape, p) -> list[str]:
    """Index of `in_shape` holding the element at `p` of `out_shape` (same C-order element count)."""
    squeezed_o = [(k, d) for k, d in enumerate(out_shape) if d != 1]
    squeezed_i = [(k, d) for k, d in enumerate(in_shape) if d != 1]
    if [d for _, d in squeezed_o] == [d for _, d in squeezed_i]:  # only unit dims differ: direct map
        idx = ["0"] * len(in_shape)
        for (ko, _), (ki, _) in zip(squeezed_o, squeezed_i):
            idx[ki] = p[ko]
        return idx
    so, si = strides(out_shape), strides(in_shape)
    flat = " + ".join(f"{p[k]}*({dstr(s)})" for k, s in enumerate(so)) or "0"
    idx = []
    for k, (d, s) in enumerate(zip(in_shape, si)):
        e = f"(({flat}) // ({dstr(s)}))"
        idx.append(e if k == 0 else f"({e} % ({dstr(d)}))")
    return idx


@onnx_rule("Reshape", opsets=(5, LATEST_OPSET))  # Reshape-1 took the shape as an attribute
def reshape(lw: Lowering, node: Node) -> None:
    x = lw.info(node.inputs[0])
    target = list(np.asarray(lw.value(node.inputs[1])).reshape(-1))
    allowzero = node.attr("allowzero", 0)
    dims: list = []
    for k, s in enumerate(target):
        if isinstance(s, (int, np.integer)) and int(s) == 0 and not allowzero:
            dims.append(x.shape[k])
        else:
            dims.append(norm_dim(s))
    if any(isinstance(d, int) and d == -1 for d in dims):
        known = prod(d for d in dims if not (isinstance(d, int) and d == -1))
        dims = [exact_div(prod(x.shape), known) if (isinstance(d, int) and d == -1) else d for d in dims]
    reshape_to(lw, node, tuple(dims))


@onnx_rule("Flatten")
def flatten(lw: Lowering, node: Node) -> None:
    x = lw.info(node.inputs[0])
    axis = norm_axis(node.attr("axis", 1), x.rank, end=True)
    reshape_to(lw, node, (prod(x.shape[:axis]), prod(x.shape[axis:])))


def axes_of(lw: Lowering, node: Node, k: int) -> list[int] | None:
    """Axes from the `axes` attribute (old opsets) or input `k` (newer opsets); None when absent."""
    if node.attr("axes") is not None:
        return [int(a) for a in node.attr("axes")]
    if node.input(k):
        return as_int_list(lw.value(node.input(k)))
    return None


@onnx_rule("Squeeze")
def squeeze(lw: Lowering, node: Node) -> None:
    x = lw.info(node.inputs[0])
    axes = axes_of(lw, node, 1)
    if axes is None:
        axes = [k for k, d in enumerate(x.shape) if d == 1]
    axes = set(norm_axes(axes, x.rank))
    for a in sorted(axes):
        if isinstance(x.shape[a], int) and x.shape[a] != 1:
            raise InvalidNode(f"axis {a} has extent {x.shape[a]}; only extent-1 axes can be squeezed")
    reshape_to(lw, node, tuple(d for k, d in enumerate(x.shape) if k not in axes))


@onnx_rule("Unsqueeze")
def unsqueeze(lw: Lowering, node: Node) -> None:
    x = lw.info(node.inputs[0])
    axes = axes_of(lw, node, 1) or []
    r = x.rank + len(axes)
    axes = sorted(norm_axes(axes, r))
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    reshape_to(lw, node, tuple(dims))


@onnx_rule("Transpose")
def transpose(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    given = node.attr("perm")
    perm = [int(k) for k in (given if given is not None else list(range(x.rank))[::-1])]
    if sorted(perm) != list(range(x.rank)):
        raise InvalidNode(f"perm {perm} is not a permutation of the {x.rank} axes")
    out = lw.output(node.outputs[0], [x.shape[k] for k in perm], x.dtype)
    if perm == [1, 0]:
        lw.transposes[node.outputs[0]] = node.inputs[0]
    p = params("p", out.rank)
    idx = [""] * x.rank
    for k, src in enumerate(perm):
        idx[src] = p[k]
    lw.copy_indexed(node.label, x, out, idx, p)


def _divided(d: Dim, k: int, what: str) -> Dim:
    if isinstance(d, int) and d % k:
        raise InvalidNode(f"{what} {d} is not divisible by {k}")
    return exact_div(d, k)


def _block_size(node: Node, x: Tensor) -> int:
    if x.rank != 4:
        raise InvalidNode(f"the input has rank {x.rank}; {node.op_type} takes [N, C, H, W]")
    b = node.attr("blocksize")
    if b is None or int(b) < 1:
        raise InvalidNode(f"blocksize {b!r} is not a positive integer")
    return int(b)


@onnx_rule("DepthToSpace")
def depth_to_space(lw: Lowering, node: Node) -> None:
    """out[n, c, y, x] = x[n, channel, y // b, x // b]: channel (y % b, x % b, c) in DCR mode (torch's
    `pixel_shuffle` exports CRD: (c, y % b, x % b))."""
    x = lw.get(node.inputs[0])
    b = _block_size(node, x)
    n, c, h, w = x.shape
    depth = _divided(c, b * b, "the channel count")
    out = lw.output(node.outputs[0], [n, depth, norm_dim(h * b), norm_dim(w * b)], x.dtype)
    pn, pc, py, px = params("p", 4)
    mode = node.attr("mode", "DCR")
    if mode == "DCR":
        channel = f"(({py} % {b}) * {b} + {px} % {b}) * ({dstr(depth)}) + {pc}"
    elif mode == "CRD":
        channel = f"{pc} * {b * b} + ({py} % {b}) * {b} + {px} % {b}"
    else:
        raise InvalidNode(f"mode {mode!r} is neither 'DCR' nor 'CRD'")
    lw.copy_indexed(node.label, x, out, [pn, channel, f"{py} // {b}", f"{px} // {b}"], [pn, pc, py, px])


@onnx_rule("SpaceToDepth")
def space_to_depth(lw: Lowering, node: Node) -> None:
    """DepthToSpace's inverse: out[n, (i b + j) C + c, y, x] = x[n, c, y b + i, x b + j] in DCR mode,
    out[n, c b^2 + i b + j, y, x] in CRD mode (the attribute since opset 25)."""
    x = lw.get(node.inputs[0])
    b = _block_size(node, x)
    n, c, h, w = x.shape
    out = lw.output(node.outputs[0], [n, norm_dim(c * b * b),
                                      _divided(h, b, "the height"), _divided(w, b, "the width")], x.dtype)
    pn, pc, py, px = params("p", 4)
    mode = node.attr("mode", "DCR")
    if mode == "DCR":
        block, channel = f"{pc} // ({dstr(c)})", f"{pc} % ({dstr(c)})"
    elif mode == "CRD":
        block, channel = f"{pc} % {b * b}", f"{pc} // {b * b}"
    else:
        raise InvalidNode(f"mode {mode!r} is neither 'DCR' nor 'CRD'")
    lw.copy_indexed(node.label, x, out, [pn, channel, f"{py} * {b} + ({block}) // {b}", f"{px} * {b} + ({block}) % {b}"],
                    [pn, pc, py, px])


# -- slicing -----------------------------------------------------------------------------------------
def _clamp(v: int, lo: Dim, hi: Dim, d: Dim) -> Dim:
    """ONNX Slice clamping of a start/end `v` against dim `d` into [lo, hi]."""
    if isinstance(d, int):
        if v < 0:
            v += d
        lo_i, hi_i = int(lo), int(hi)
        return min(max(v, lo_i), hi_i)
    if v >= BIG // 4:
        return hi
    if v <= -BIG // 4:
        return lo
    # a symbolic extent: clamp for every value the symbols can take (the slice never leaves the input)
    v = sympy.sympify(d) + v if v < 0 else sympy.Integer(v)
    return norm_dim(sympy.Min(sympy.Max(v, lo), hi))


def slice_spec(x: Tensor, starts, ends, axes, steps) -> list[tuple[Dim, Dim, int]]:
    """Per dim (start, length, step)."""
    spec: list[tuple[Dim, Dim, int]] = [(0, d, 1) for d in x.shape]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise InvalidNode(f"starts, ends, axes and steps have different lengths ({len(starts)}, {len(ends)}, "
                          f"{len(axes)}, {len(steps)})")
    for s, e, a, st in zip(starts, ends, norm_axes(axes, x.rank), steps):
        d = x.shape[a]
        if st == 0:
            raise InvalidNode("a slice step is 0")
        if st > 0:
            s0, e0 = _clamp(s, 0, d, d), _clamp(e, 0, d, d)
            length = norm_dim(sympy.ceiling(sympy.Max(0, sympy.sympify(e0) - s0) / st))
        else:
            s0, e0 = _clamp(s, 0, norm_dim(d - 1), d), _clamp(e, -1, norm_dim(d - 1), d)
            if isinstance(d, int) and e < 0 and e + d < 0:
                e0 = -1
            length = norm_dim(sympy.ceiling(sympy.Max(0, sympy.sympify(s0) - e0) / (-st)))
        spec[a] = (s0, length, st)
    return spec


def _whole_or_int(ends, dims) -> list[int]:
    """Slice ends as integers; a symbolic end equal to its dimension's symbolic extent (the exporter's
    `Slice(x, 0, Shape(index))` in a batch program) is the end of the dimension."""
    out = []
    for e, d in zip(np.asarray(ends).reshape(-1), dims):
        if isinstance(e, sympy.Basic) and not e.is_Integer:
            if not isinstance(d, int) and norm_dim(sympy.sympify(e) - d) == 0:
                out.append(BIG)
                continue
            raise RuleUnsupported(f"a slice end {e} that is symbolic and not its dimension's extent {d}")
        out.append(int(e))
    return out


@onnx_rule("Slice")
def slice_(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes = node.attr("axes") if node.attr("axes") is not None else list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        # every value is asked for before any is checked: `OnnxProgram` finds the inputs that decide shapes
        # one NeedsValue at a time, with placeholder values that need not be valid
        starts, raw_ends = as_int_list(lw.value(node.inputs[1])), lw.value(node.inputs[2])
        axes = as_int_list(lw.value(node.input(3))) if node.input(3) else list(range(len(starts)))
        steps = as_int_list(lw.value(node.input(4))) if node.input(4) else [1] * len(starts)
        ends = _whole_or_int(raw_ends, [x.shape[a] for a in norm_axes(axes, x.rank)])
    spec = slice_spec(x, starts, ends, axes, steps)
    out = lw.output(node.outputs[0], [length for _, length, _ in spec], x.dtype)
    p = params("p", out.rank)
    idx = [f"{dstr(s)} + ({st})*{q}" if (s, st) != (0, 1) else q for (s, _, st), q in zip(spec, p)]
    lw.copy_indexed(node.label, x, out, idx, p)


@onnx_rule("Concat", opsets=(4, LATEST_OPSET))  # Concat-1 had an optional axis (default 1)
def concat(lw: Lowering, node: Node) -> None:
    ins = [lw.get(n) for n in node.inputs if n]
    axis = norm_axis(node.attr("axis"), ins[0].rank)
    for t in ins:
        if t.rank != ins[0].rank:
            raise InvalidNode(f"inputs of ranks {[u.rank for u in ins]} (they must be equal)")
        for k, (d, d0) in enumerate(zip(t.shape, ins[0].shape)):
            if k != axis and norm_dim(sympy.sympify(d) - d0) != 0:
                raise (InvalidNode if isinstance(norm_dim(sympy.sympify(d) - d0), int) else RuleUnsupported)(
                    f"inputs of shapes {[tuple(u.shape) for u in ins]} differ outside axis {axis}")
    ins = [t for t in ins if not (t.rank and any(isinstance(d, int) and d == 0 for d in t.shape))] or ins[:1]
    total = prod([]) * 0
    for t in ins:
        total = norm_dim(total + t.shape[axis])
    shape = list(ins[0].shape)
    shape[axis] = total
    out = lw.output(node.outputs[0], shape, ins[0].dtype)
    offset: Dim = 0
    for t in ins:
        p = params("p", t.rank)
        oidx = list(p)
        oidx[axis] = f"{p[axis]} + {dstr(offset)}" if offset != 0 else p[axis]
        lw.map(node.label, list(zip(p, t.shape)), {"a": (t, p)}, "o = a", {"o": (out, oidx, None)})
        offset = norm_dim(offset + t.shape[axis])


@onnx_rule("Split")
def split(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), x.rank)
    d = x.shape[axis]
    n_out = len(node.outputs)
    if node.input(1):
        sizes = as_int_list(lw.value(node.input(1)))
    elif node.attr("split") is not None:
        sizes = [int(s) for s in node.attr("split")]
    else:
        if not isinstance(d, int):
            raise RuleUnsupported("even split of a symbolic dimension")
        n = node.attr("num_outputs", n_out)
        chunk = -(-d // n)
        sizes = [min(chunk, d - k * chunk) for k in range(n)]
    if len(sizes) != n_out or any(s < 0 for s in sizes) or (norm_dim(d - sum(sizes)) != 0):
        raise InvalidNode(f"split sizes {sizes} for {n_out} outputs do not add up to the extent {d} of axis {axis}")
    offset = 0
    for name, size in zip(node.outputs, sizes):
        shape = list(x.shape)
        shape[axis] = size
        out = lw.output(name, shape, x.dtype)
        p = params("p", out.rank)
        idx = list(p)
        idx[axis] = f"{p[axis]} + {offset}"
        lw.copy_indexed(node.label, x, out, idx, p)
        offset += size


@onnx_rule("Expand")
def expand(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    target = [norm_dim(s) for s in np.asarray(lw.value(node.inputs[1])).reshape(-1)]
    shape = broadcast_shapes(x.shape, target)
    lw.elementwise(node.label, "res = x", {"x": x}, node.outputs[0], x.dtype, out_shape=shape)


@onnx_rule("Tile", opsets=(6, LATEST_OPSET))  # Tile-1 took `tiles` and `axis` inputs
def tile(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    reps = as_int_list(lw.value(node.inputs[1]))
    out = lw.output(node.outputs[0], [norm_dim(d * r) for d, r in zip(x.shape, reps)], x.dtype)
    p = params("p", out.rank)
    idx = [f"{q} % ({dstr(d)})" if r != 1 else q for q, d, r in zip(p, x.shape, reps)]
    lw.copy_indexed(node.label, x, out, idx, p)


@onnx_rule("Trilu")
def trilu(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    k = int(np.asarray(lw.value(node.input(1))).reshape(-1)[0]) if node.input(1) else 0
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    p = params("p", out.rank)
    i, j = p[-2], p[-1]
    cond = f"({j} - {i} >= {k})" if node.attr("upper", 1) else f"({j} - {i} <= {k})"
    lw.map(node.label, list(zip(p, out.shape)), {"a": (x, p)}, f"o = (a if {cond} else 0)", {"o": (out, p, None)})


# -- padding -----------------------------------------------------------------------------------------
@onnx_rule("Pad", opsets=(2, LATEST_OPSET))  # Pad-1 named its pads `paddings`
def pad(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        pads = [int(v) for v in node.attr("pads")]
        cval = literal(node.attr("value", 0.0))
        cin = None
    else:
        pads = as_int_list(lw.value(node.inputs[1]))
        cin = lw.get(node.input(2)) if node.input(2) else None
        cval = "cv" if cin is not None else "0"
    axes = as_int_list(lw.value(node.input(3))) if node.input(3) else list(range(x.rank))
    axes = norm_axes(axes, x.rank)
    if len(pads) != 2 * len(axes):
        raise InvalidNode(f"{len(pads)} pads for {len(axes)} axes (there must be two per axis)")
    begin, end = [0] * x.rank, [0] * x.rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    out = lw.output(node.outputs[0], [norm_dim(d + b + e) for d, b, e in zip(x.shape, begin, end)], x.dtype)
    p = params("p", out.rank)
    lines, idx, inb = [], [], []
    for k, (q, d, b) in enumerate(zip(p, x.shape, begin)):
        D = dstr(d)
        lines.append(f"q{k} = {q} - ({b})")
        if mode != "constant" and d == 0 and (begin[k] > 0 or end[k] > 0):
            raise InvalidNode(f"{mode} padding of axis {k}, which is empty")
        if mode == "constant":
            inb.append(f"q{k} >= 0 and q{k} < {D}")
        elif mode == "edge":
            lines.append(f"q{k} = min(max(q{k}, 0), {D} - 1)")
        elif mode == "reflect":  # reflections repeat with period 2 (D - 1), as numpy.pad does
            lines.append(f"m{k} = max(2 * ({D}) - 2, 1)")
            lines.append(f"q{k} = ((q{k} % m{k}) + m{k}) % m{k}")
            lines.append(f"q{k} = ({D} - 1) - abs({D} - 1 - q{k})")
        elif mode == "wrap":
            lines.append(f"q{k} = ((q{k} % {D}) + {D}) % {D}")
        else:
            raise RuleUnsupported(f"pad mode {mode!r}")
        idx.append(f"q{k}")
    read = sub("a", x, idx)
    if inb:
        lines.append(f"o = ({read} if ({' and '.join(inb)}) else {cval})")
    else:
        lines.append(f"o = {read}")
    ins = {"a": (x, None)}
    if cin is not None:
        ins["cv"] = (cin, ["0"] * cin.rank)
    lw.map(node.label, list(zip(p, out.shape)), ins, "\n".join(lines), {"o": (out, p, None)})


# -- gathers and scatters ------------------------------------------------------------------------------
# Indices read from data are checked in the tasklet (`Lowering.checked`): an index outside
# [-extent, extent - 1] is neither read nor written through; the call then raises IndexOutOfRangeError.
def _index_what(node: Node, k: int, axis: int | None = None, into: int = 0) -> str:
    where = f"axis {axis} of " if axis is not None else ""
    return f"index from input '{node.input(k)}' into {where}input '{node.input(into)}'"


@onnx_rule("Gather")
def gather(lw: Lowering, node: Node) -> None:
    """Indices known while lowering (a constant scalar: selecting one slice, as exporters do for q/k/v)
    give an affine memlet; otherwise the tasklet reads the whole input at the index it is given."""
    x = lw.get(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), x.rank)
    known = lw.info(node.inputs[1]).value
    if known is not None and np.asarray(known).dtype != object:
        d = x.shape[axis]
        flat = np.asarray(known).reshape(-1)
        if isinstance(d, int) and flat.size and not (flat.min() >= -d and flat.max() < d):
            bad = int(flat[(flat < -d) | (flat >= d)][0])
            raise InvalidNode(f"index {bad} of input '{node.inputs[1]}' is out of range for axis {axis} of size {d} "
                              f"(valid: [{-d}, {d - 1}])")
    if _constant_index_in_range(known, x.shape[axis]):
        k = int(np.asarray(known).reshape(-1)[0])
        d = x.shape[axis]
        k = k + d if k < 0 else k
        shape = list(x.shape[:axis]) + list(np.shape(known)) + list(x.shape[axis + 1:])
        out = lw.output(node.outputs[0], shape, x.dtype)
        p = params("p", out.rank)
        keep = len(np.shape(known))  # 0 (scalar index: the axis disappears) or 1 ([k]: it stays, size 1)
        lw.copy_indexed(node.label, x, out, p[:axis] + [dstr(norm_dim(k))] + p[axis + keep:], p)
        return
    ind = lw.get(node.inputs[1])
    shape = list(x.shape[:axis]) + list(ind.shape) + list(x.shape[axis + 1:])
    out = lw.output(node.outputs[0], shape, x.dtype)
    p = params("p", out.rank)
    ip = p[axis: axis + ind.rank]
    lines, err = lw.checked(node.where, [Checked("i", x.shape[axis], _index_what(node, 1, axis))])
    src = p[:axis] + ["g0"] + p[axis + ind.rank:]
    lw.map(node.label, list(zip(p, out.shape)), {"a": (x, None), "i": (ind, ip)},
           "\n".join(lines + [f"o = ({sub('a', x, src)} if ok else 0)"]), {"o": (out, p, None), **err})


def _constant_index_in_range(known, d: Dim) -> bool:
    """A single index known while lowering that certainly lies in [-d, d - 1] (for a symbolic extent, for
    every value of its symbols): it can be an affine memlet; any other index is checked at run time."""
    if known is None or np.asarray(known).size != 1 or np.asarray(known).dtype == object:
        return False
    k = int(np.asarray(known).reshape(-1)[0])
    if isinstance(d, int):
        return -d <= k < d
    slack = sympy.sympify(d) + k if k < 0 else sympy.sympify(d) - k - 1
    return bool(slack.is_nonnegative)


@onnx_rule("GatherElements")
def gather_elements(lw: Lowering, node: Node) -> None:
    x, ind = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    axis = norm_axis(node.attr("axis", 0), x.rank)
    _same_rank(x, ind, node)
    out = lw.output(node.outputs[0], ind.shape, x.dtype)
    p = params("p", out.rank)
    src = list(p)
    others = [k for k in range(x.rank) if k != axis]
    dims = _within(node, f"the indices '{node.input(1)}'", [p[k] for k in others], [ind.shape[k] for k in others],
                   [x.shape[k] for k in others])
    lines, err = lw.checked(node.where, dims + [Checked("i", x.shape[axis], _index_what(node, 1, axis))])
    src[axis] = f"g{len(dims)}"
    lw.map(node.label, list(zip(p, out.shape)), {"a": (x, None), "i": (ind, p)},
           "\n".join(lines + [f"o = ({sub('a', x, src)} if ok else 0)"]), {"o": (out, p, None), **err})


def _same_rank(x: Tensor, ind: Tensor, node: Node) -> None:
    if ind.rank != x.rank:
        raise InvalidNode(f"indices of rank {ind.rank} for data of rank {x.rank} (they must be equal)")


def _within(node: Node, what: str, params_: Sequence[str], extents: Sequence[Dim], bounds: Sequence[Dim],
            exact: bool = False) -> list[Checked]:
    """Map parameters running over `extents` that index dims of size `bounds` directly (the other axes of
    GatherElements / ScatterElements, the batch axes of GatherND): an extent that certainly exceeds its
    bound (or differs, with `exact`) is `InvalidNode`; one that cannot be compared while lowering
    (different symbols) becomes a run-time check."""
    checks = []
    for k, (q, e, b) in enumerate(zip(params_, extents, bounds)):
        diff = norm_dim(sympy.sympify(b) - e)
        if isinstance(diff, int):
            if diff < 0 or (exact and diff != 0):
                rel = "equal" if exact else "at most"
                raise InvalidNode(f"{what}: extent {e} of dim {k} must be {rel} the data's extent {b}")
            continue
        checks.append(Checked(q, b, f"dim {k} of {what} (extent {dstr(e)}) against the data's extent", wraps=False))
    return checks


def _nd_depth(x: Tensor, ind: Tensor, batch: int) -> int:
    """The index depth k of GatherND / ScatterND (the last extent of the indices), checked against the data."""
    if ind.rank < 1:
        raise InvalidNode("indices must have rank >= 1")
    k = ind.shape[-1]
    if not isinstance(k, int):
        raise RuleUnsupported("symbolic index depth")
    if batch < 0 or batch >= min(x.rank, ind.rank):
        raise InvalidNode(f"batch_dims {batch} must be in [0, {min(x.rank, ind.rank) - 1}] for data of rank {x.rank} "
                          f"and indices of rank {ind.rank}")
    if k < 1 or batch + k > x.rank:
        raise InvalidNode(f"index depth {k} (last extent of the indices) plus batch_dims {batch} exceeds the data "
                          f"rank {x.rank}")
    return k


@onnx_rule("GatherND")
def gather_nd(lw: Lowering, node: Node) -> None:
    x, ind = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    b = node.attr("batch_dims", 0)
    k = _nd_depth(x, ind, b)
    shape = list(ind.shape[:-1]) + list(x.shape[b + k:])
    out = lw.output(node.outputs[0], shape, x.dtype)
    p = params("p", out.rank)
    nb = ind.rank - 1
    ipre = p[:nb]
    batch = _within(node, f"the batch dims of '{node.input(1)}'", p[:b], ind.shape[:b], x.shape[:b], exact=True)
    checks = [Checked(sub("i", ind, ipre + [str(j)]), x.shape[b + j], _index_what(node, 1, b + j)) for j in range(k)]
    lines, err = lw.checked(node.where, batch + checks)
    src = p[:b] + [f"g{len(batch) + j}" for j in range(k)] + p[nb:]
    lw.map(node.label, list(zip(p, out.shape)), {"a": (x, None), "i": (ind, None)},
           "\n".join(lines + [f"o = ({sub('a', x, src)} if ok else 0)"]), {"o": (out, p, None), **err})


def _scatter_update(reduction: str, old: str, new: str) -> str:
    return {
        "none": new, "add": f"{old} + {new}", "mul": f"{old} * {new}", "max": f"max({old}, {new})",
        "min": f"min({old}, {new})",
    }[reduction]


def _scatter_write(reduction: str, out: Tensor, dst: list[str]) -> tuple[list[str], dict, str | None]:
    """The scatter's write of `u` at `dst` after the index checks: (code lines, the extra input, the
    write-conflict resolution). An overwrite or a sum reads nothing of the output (a sum as a
    write-conflict sum) and writes unconditionally, at element 0 when a check failed (the call then raises,
    `err`; a map parameter checked at run time against a symbolic extent is replaced too), which keeps the
    tasklet one the AD differentiates: an element chosen by an index. The other reductions read the old
    element, under the check."""
    if reduction in ("none", "add"):
        safe = [f"({d} if ok else 0)" for d in dst]
        wcr = "lambda a, b: a + b" if reduction == "add" else None
        return [f"{sub('oo', out, safe)} = u"], {}, wcr
    write = f"    {sub('oo', out, dst)} = {_scatter_update(reduction, sub('oi', out, dst), 'u')}"
    return ["if ok:", write], {"oi": (out, None)}, None


def _copy(lw: Lowering, label: str, x: Tensor, out: Tensor) -> None:
    p = params("p", out.rank)
    lw.copy_indexed(label, x, out, p, p)


@onnx_rule("ScatterElements", "Scatter")
def scatter_elements(lw: Lowering, node: Node) -> None:
    x, ind, upd = (lw.get(n) for n in node.inputs[:3])
    axis = norm_axis(node.attr("axis", 0), x.rank)
    _same_rank(x, ind, node)
    if tuple(ind.shape) != tuple(upd.shape):
        raise InvalidNode(f"indices of shape {ind.shape} and updates of shape {upd.shape} differ")
    red = node.attr("reduction", "none")
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    _copy(lw, node.label, x, out)
    p = params("p", upd.rank)
    others = [k for k in range(x.rank) if k != axis]
    dims = _within(node, f"the indices '{node.input(1)}'", [p[k] for k in others], [ind.shape[k] for k in others],
                   [x.shape[k] for k in others])
    dst = list(p)
    dst[axis] = f"g{len(dims)}"
    lines, err = lw.checked(node.where, dims + [Checked("i", x.shape[axis], _index_what(node, 1, axis))])
    write, old, wcr = _scatter_write(red, out, dst)
    st = lw.state(node.label)
    lw.map(node.label, list(zip(p, upd.shape)), {"i": (ind, p), "u": (upd, p), **old},
           "\n".join(lines + write), {"oo": (out, None, wcr), **err}, state=st, sequential=True)


@onnx_rule("ScatterND")
def scatter_nd(lw: Lowering, node: Node) -> None:
    x, ind, upd = (lw.get(n) for n in node.inputs[:3])
    red = node.attr("reduction", "none")
    k = _nd_depth(x, ind, 0)
    want = tuple(ind.shape[:-1]) + tuple(x.shape[k:])
    if tuple(upd.shape) != want:
        raise InvalidNode(f"updates of shape {tuple(upd.shape)}; indices of shape {tuple(ind.shape)} into data of "
                          f"shape {tuple(x.shape)} need {want}")
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    _copy(lw, node.label, x, out)
    p = params("p", upd.rank)
    nb = ind.rank - 1
    # each component of the index through a memlet of its own: an index read through an index would make the
    # destination one the AD cannot follow
    checks = [Checked(f"i{j}", x.shape[j], _index_what(node, 1, j)) for j in range(k)]
    lines, err = lw.checked(node.where, checks)
    dst = [f"g{j}" for j in range(k)] + p[nb:]
    write, old, wcr = _scatter_write(red, out, dst)
    index = {f"i{j}": (ind, p[:nb] + [str(j)]) for j in range(k)}
    lw.map(node.label, list(zip(p, upd.shape)), {**index, "u": (upd, p), **old},
           "\n".join(lines + write), {"oo": (out, None, wcr), **err}, sequential=True)
