"""Neural-network ops: convolutions, pooling, batch normalisation, losses, TopK, CumSum.

A one-group 2-D Conv is a `Convolution` library node (per-image BLAS products once compiled), which reads
zeros where a window leaves its input (no padded copy); a one-group 1-D/3-D Conv is im2col and a Gemm;
other windows (grouped Conv, pools) are maps over output position x kernel offset that accumulate with a
WCR. Those read a zero-padded copy of the input where a window can leave it (`_zero_padded`), so every
read is a plain affine memlet, which the AD engine differentiates.
"""

from __future__ import annotations

import numpy as np
import sympy
from dace.libraries.blas import Gemm

from gradflow.core.wcr import SUM
from gradflow.frontend.onnx.builder import (
    Checked, Dim, InvalidNode, Lowering, RuleUnsupported, Tensor, dstr, exact_div, literal_float, norm_axis, norm_dim,
    params, prod, row_major_index, same_extent, storage_dtype, sub,
)
from gradflow.frontend.onnx.rules.elementwise import typed
from gradflow.frontend.onnx.rules.linalg import library_product, on_blas
from gradflow.frontend.onnx.rules.reduce import kept_shape, reduce_into
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, onnx_rule
from gradflow.library.convolution import Convolution, wire



def _floor_div(a: Dim, b: int) -> Dim:
    if isinstance(a, int):
        return a // b
    return norm_dim(sympy.floor(sympy.sympify(a) / b))


def _ceil_div(a: Dim, b: int) -> Dim:
    if isinstance(a, int):
        return -(-a // b)
    return norm_dim(sympy.ceiling(sympy.sympify(a) / b))


def _window_attrs(node: Node, n: int) -> tuple[list[int], list[int], list[int], str]:
    """strides, dilations, pads (n begins then n ends) and auto_pad of an n-D window op, with ONNX's defaults
    (their values were checked by `spec`; their lengths against the n spatial dims are checked here)."""
    strides = [int(v) for v in _given(node, "strides", [1] * n)]
    dil = [int(v) for v in _given(node, "dilations", [1] * n)]
    pads = [int(v) for v in _given(node, "pads", [0] * 2 * n)]
    for name, values, want in (("strides", strides, n), ("dilations", dil, n), ("pads", pads, 2 * n)):
        if len(values) != want:
            raise InvalidNode(f"attribute '{name}' has {len(values)} values; an input with {n} spatial dims "
                              f"needs {want}")
    return strides, dil, pads, node.attr("auto_pad", "NOTSET")


def _given(node: Node, name: str, default: list[int]) -> list[int]:
    """A list attribute, or its default when absent (an empty list that is given stays empty: invalid)."""
    value = node.attr(name)
    return default if value is None else list(value)


def _spatial_rank(node: Node, x: Tensor, w: Tensor | None = None) -> int:
    """The number of spatial dims of a window op's input (N, C, spatial...), checked against the weights."""
    if x.rank < 3:
        raise InvalidNode(f"input of rank {x.rank}; a window op needs (N, C, spatial...) of rank >= 3")
    if w is not None and w.rank != x.rank:
        raise InvalidNode(f"weights of rank {w.rank} for an input of rank {x.rank} (they must be equal)")
    return x.rank - 2


def _same_pads(total: int, auto_pad: str) -> tuple[int, int]:
    """(begin, end) split of `total` padding: SAME_UPPER puts the odd one at the end, SAME_LOWER at the start."""
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _init_with_bias(lw: Lowering, node: Node, out: Tensor) -> None:
    """out[n, m, ...] = bias[m] (optional input 2), else 0: the start of a convolution's accumulation."""
    if node.input(2):
        bias = lw.get(node.input(2))
        if bias.rank != 1:
            raise InvalidNode(f"bias of shape {tuple(bias.shape)}; it must be ({out.shape[1]},)")
        same_extent(bias.shape[0], out.shape[1], "the bias and the output channels")
        q = params("p", out.rank)
        lw.map(node.label, list(zip(q, out.shape)), {"b": (bias, [q[1]])}, "o = b",
               {"o": (out, q, None)})
    else:
        lw.fill(node.label, out, "0")


def window(node: Node, spatial: tuple[Dim, ...], kernel: list[int], ceil_mode: bool = False):
    """Output dims and (begin, end) pads of a sliding window, per ONNX's auto_pad / pads / ceil_mode."""
    n = len(spatial)
    strides, dil, pads, auto = _window_attrs(node, n)
    begin, end, out = pads[:n], pads[n:], []
    for k in range(n):
        eff = (kernel[k] - 1) * dil[k] + 1
        d = spatial[k]
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = _ceil_div(d, strides[k])
            if not isinstance(o, int):
                raise RuleUnsupported("auto_pad SAME with symbolic spatial dims")
            begin[k], end[k] = _same_pads(max(0, (o - 1) * strides[k] + eff - d), auto)
            out.append(o)
        elif auto == "VALID":
            begin[k] = end[k] = 0
            out.append(_floor_div(norm_dim(d - eff), strides[k]) + 1 if isinstance(d, int) else
                       norm_dim(_floor_div(norm_dim(d - eff), strides[k]) + 1))
        else:
            span = norm_dim(d + begin[k] + end[k] - eff)
            if ceil_mode:
                o = norm_dim(_ceil_div(span, strides[k]) + 1)
                if isinstance(o, int) and (o - 1) * strides[k] >= d + begin[k]:
                    o -= 1
            else:
                o = norm_dim(_floor_div(span, strides[k]) + 1)
            out.append(o)
    return out, begin, end, strides, dil


def _kernel(node: Node, w: Tensor | None, n: int) -> list[int]:
    ks = node.attr("kernel_shape")
    if ks is None and w is None:
        raise InvalidNode("attribute 'kernel_shape' is required")
    if ks is not None and len(ks) != n:
        raise InvalidNode(f"kernel_shape {list(ks)} has {len(ks)} dims; the input has {n} spatial dims")
    if ks is not None and w is not None and all(isinstance(d, int) for d in w.shape[2:]) and \
            [int(k) for k in ks] != list(w.shape[2:]):
        raise InvalidNode(f"kernel_shape {list(ks)} differs from the weights' spatial shape {list(w.shape[2:])}")
    if ks is None:
        ks = w.shape[2:]
    if not all(isinstance(k, int) for k in ks):
        raise RuleUnsupported("kernel shape must be static")
    return [int(k) for k in ks]


def _groups(node: Node, channels: Dim, per_group: Dim, what: str) -> int:
    """`group`, checked: the input's channels must be `per_group` (the weights' channel extent) times it."""
    g = int(node.attr("group", 1))
    if norm_dim(sympy.sympify(per_group) * g - channels) != 0:
        raise InvalidNode(f"the input has {channels} channels, but {what} has {per_group} per group and "
                          f"group is {g}")
    return g


@onnx_rule("Conv")
def conv(lw: Lowering, node: Node) -> None:
    x, w = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    n = _spatial_rank(node, x, w)
    ks = _kernel(node, w, n)
    out_sp, begin, end, st, dil = window(node, x.shape[2:], ks)
    M, Cg = w.shape[0], w.shape[1]
    g = _groups(node, x.shape[1], Cg, "the weights")
    if isinstance(M, int) and M % g:
        raise InvalidNode(f"{M} output channels (weights' first extent) are not a multiple of group {g}")
    out = lw.output(node.outputs[0], [x.shape[0], M, *out_sp], x.dtype)
    if g == 1 and n == 2 and on_blas(x, w, out, matrices=()):
        # the node reads zeros where its windows leave x: no padded copy, nor a gradient of one
        _conv_as_node(lw, node, x, w, out, st, dil, begin)
        return
    if any(begin) or any(end):
        # Zero-pad into a temporary first, so every read of the accumulation is an affine memlet (the AD
        # engine differentiates those; a guarded read through the whole array it does not).
        x = _zero_padded(lw, node, x, begin, end)
    if (g == 1 and on_blas(x, w, out, matrices=(prod([x.shape[0], *out_sp]), prod([x.shape[1], *ks]), w.shape[0]))
            and _im2col_fits(lw, x, ks, out_sp)):
        _conv_as_gemm(lw, node, x, w, out, ks, out_sp, st, dil)
        return
    op = params("o", n)
    kp = params("k", n)
    _init_with_bias(lw, node, out)
    sp = [f"{op[k]} * {st[k]} + {kp[k]} * {dil[k]}" for k in range(n)]
    if g != 1 and norm_dim(M - g) == 0 and Cg == 1:
        # depthwise: output channel m reads input channel m only. Indexed by m alone (no one-iteration c
        # loop adding `+ c`), m owns both sums of the reverse map (into the input's and the weights'
        # gradients), so `nest_reductions` runs it parallel over channels without atomics.
        ranges = [("n", x.shape[0]), ("m", M), *zip(op, out_sp), *zip(kp, ks)]
        ins = {"x": (x, ["n", "m", *sp]), "w": (w, ["m", "0", *kp])}
    else:
        ch = f"(m // ({dstr(exact_div(M, g))})) * ({dstr(Cg)}) + c" if g != 1 else "c"
        ranges = [("n", x.shape[0]), ("m", M), *zip(op, out_sp), ("c", Cg), *zip(kp, ks)]
        ins = {"x": (x, ["n", ch, *sp]), "w": (w, ["m", "c", *kp])}
    lw.map(node.label, ranges, ins, "o = x * w", {"o": (out, ["n", "m", *op], SUM)})


def _im2col_fits(lw: Lowering, x: Tensor, ks: list[int], out_sp: list[Dim]) -> bool:
    """Whether the unfolded input (N * prod(output) rows, C * prod(kernel) columns) stays within the
    lowering's tensor size limit (symbolic extents are checked when the program is called)."""
    count = prod([x.shape[1], *ks, x.shape[0], *out_sp])
    return not isinstance(count, int) or count * np.dtype(x.dtype).itemsize <= lw.max_bytes


def _conv_as_gemm(lw: Lowering, node: Node, x: Tensor, w: Tensor, out: Tensor, ks: list[int],
                  out_sp: list[Dim], st: list[int], dil: list[int]) -> None:
    """A one-group convolution as one matrix product on BLAS (im2col), one row per output pixel:
        col[(n, o...), (c, k...)] = x[n, c, o * stride + k * dilation]     (x already zero-padded)
        res = col @ W[m, (c, k...)]^T                                        (a Gemm, pixels x M)
        out[n, m, o...] = res[(n, o...), m] + bias[m]
    Pixels as rows make the products tall and thin (N*H*W x C*k*k times C*k*k x M): OpenBLAS ran
    them, and the two of the backward, about twice as fast as the wide orientation (M x N*H*W) at a
    few dozen channels. Reverse mode differentiates the Gemm with the product rule (two more Gemms) and
    the copies as maps; the unfolding's adjoint sums overlapping windows back into the input's gradient."""
    n = len(ks)
    N, C, M = x.shape[0], x.shape[1], w.shape[0]
    kp, op = params("k", n), params("o", n)
    rows, cols = prod([N, *out_sp]), prod([C, *ks])
    row, col_ix = row_major_index(["n", *op], [N, *out_sp]), row_major_index(["c", *kp], [C, *ks])
    col = lw.temp([rows, cols], x.dtype, "im2col")
    sp = [f"{op[k]} * {st[k]} + {kp[k]} * {dil[k]}" for k in range(n)]
    lw.map(node.label, [("n", N), *zip(op, out_sp), ("c", C), *zip(kp, ks)], {"a": (x, ["n", "c", *sp])},
           "o = a", {"o": (col, [row, col_ix], None)})
    wm = lw.temp([M, cols], w.dtype, "weights")
    lw.map(node.label, [("m", M), ("c", C), *zip(kp, ks)], {"a": (w, ["m", "c", *kp])}, "o = a",
           {"o": (wm, ["m", col_ix], None)})
    res = lw.temp([rows, M], x.dtype, "conv")
    library_product(lw, node.label, Gemm("gemm", alpha=1, beta=0, cin=False, transB=True), {"_a": col, "_b": wm},
                    res)
    ins = {"r": (res, [row, "m"])}
    code = "o = r"
    if node.input(2):
        bias = lw.get(node.input(2))
        if bias.rank != 1:
            raise InvalidNode(f"bias of shape {tuple(bias.shape)}; it must be ({M},)")
        same_extent(bias.shape[0], M, "the bias and the output channels")
        ins["b"] = (bias, ["m"])
        code = "o = r + b"
    lw.map(node.label, [("n", N), ("m", M), *zip(op, out_sp)], ins, code, {"o": (out, ["n", "m", *op], None)})


def _conv_as_node(lw: Lowering, node: Node, x: Tensor, w: Tensor, out: Tensor, st: list[int], dil: list[int],
                  pads: list[int]) -> None:
    """A one-group 2-D convolution as a `Convolution` library node with `pads` zeros before x (those after
    it follow from the output's extent): compiled, a product per image on BLAS, kept whole by reverse mode
    (its gradients are two more such nodes, see `gradflow/library/convolution.py`). A bias is added by a
    map from the node's result."""
    bias = lw.get(node.input(2)) if node.input(2) else None
    target = out
    if bias is not None:
        if bias.rank != 1:
            raise InvalidNode(f"bias of shape {tuple(bias.shape)}; it must be ({w.shape[0]},)")
        same_extent(bias.shape[0], w.shape[0], "the bias and the output channels")
        target = lw.temp(list(out.shape), x.dtype, "conv")
    conv = Convolution("conv", strides=st, dilations=dil, pads=pads)
    conv.label = lw.namer("conv", node.label)
    wire(lw.state(node.label), conv, {"_x": x.at(None), "_w": w.at(None)}, ("_y", target.at(None)))
    if bias is not None:
        p = params("p", 4)
        lw.map(node.label, list(zip(p, out.shape)), {"r": (target, p), "b": (bias, [p[1]])}, "o = r + b",
               {"o": (out, p, None)})


def _zero_padded(lw: Lowering, node: Node, x: Tensor, begin: list[int], end: list[int], fill: str = "0") -> Tensor:
    """x with `begin` / `end` elements `fill` (zeros) around its spatial dims (a new transient)."""
    n = x.rank - 2
    shape = [*x.shape[:2], *(norm_dim(x.shape[2 + k] + begin[k] + end[k]) for k in range(n))]
    xp = lw.temp(shape, x.dtype, "padded")
    lw.fill(node.label, xp, fill)
    p = params("p", x.rank)
    dst = [p[0], p[1], *(f"{p[2 + k]} + {begin[k]}" for k in range(n))]
    lw.map(node.label, list(zip(p, x.shape)), {"a": (x, p)}, "o = a", {"o": (xp, dst, None)})
    return xp


@onnx_rule("ConvTranspose")
def conv_transpose(lw: Lowering, node: Node) -> None:
    """out[n, m, o] = sum x[n, c, i] * w[c, m, k] over o = i*s + k*d - pad (a gather over valid i)."""
    x, w = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    n = _spatial_rank(node, x, w)
    ks = _kernel(node, w, n)
    if norm_dim(sympy.sympify(w.shape[0]) - x.shape[1]) != 0:
        raise InvalidNode(f"weights with first extent {w.shape[0]} for an input with {x.shape[1]} channels")
    g = int(node.attr("group", 1))
    if isinstance(x.shape[1], int) and x.shape[1] % g:
        raise InvalidNode(f"{x.shape[1]} input channels are not a multiple of group {g}")
    st, dil, pads, auto = _window_attrs(node, n)
    opad = [int(v) for v in _given(node, "output_padding", [0] * n)]
    if len(opad) != n:
        raise InvalidNode(f"output_padding {opad} has {len(opad)} values for {n} spatial dims")
    if node.attr("output_shape") is not None and len(node.attr("output_shape")) not in (n, n + 2):
        raise InvalidNode(f"output_shape {list(node.attr('output_shape'))} has neither {n} nor {n + 2} values")
    spatial = x.shape[2:]
    if not all(isinstance(d, int) for d in spatial):
        raise RuleUnsupported("symbolic spatial dims")
    full = [st[k] * (spatial[k] - 1) + opad[k] + (ks[k] - 1) * dil[k] + 1 for k in range(n)]
    out_shape = node.attr("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        # the output size is given (or is input * stride): the padding is what is left over, split as SAME
        out_shape = list(out_shape)[-n:] if out_shape is not None else [spatial[k] * st[k] for k in range(n)]
        begin = [_same_pads(full[k] - out_shape[k], "SAME_UPPER" if auto == "SAME_UPPER" else "SAME_LOWER")[0]
                 for k in range(n)]
    else:
        out_shape = [full[k] - pads[k] - pads[k + n] for k in range(n)]
        begin = pads[:n]
    C, Mg = x.shape[1], w.shape[1]
    M = norm_dim(Mg * g)
    out = lw.output(node.outputs[0], [x.shape[0], M, *out_shape], x.dtype)
    _init_with_bias(lw, node, out)
    op, kp = params("o", n), params("k", n)
    Cg = exact_div(C, g)
    cf = f"(m // {dstr(Mg)}) * {dstr(Cg)} + c" if g != 1 else "c"
    lines, conds, idx = [], [], []
    for k in range(n):
        lines.append(f"t{k} = {op[k]} + {begin[k]} - {kp[k]} * {dil[k]}")
        conds.append(f"t{k} >= 0 and t{k} % {st[k]} == 0 and t{k} // {st[k]} < {spatial[k]}")
        idx.append(f"t{k} // {st[k]}")
    xr, wr = sub("x", x, ["n", cf, *idx]), sub("w", w, [cf, f"m % {dstr(Mg)}", *kp])
    lines.append(f"o = ({xr} * {wr}) if ({' and '.join(conds)}) else 0")
    ranges = [("n", x.shape[0]), ("m", M), *zip(op, out_shape), ("c", Cg), *zip(kp, ks)]
    lw.map(node.label, ranges, {"x": (x, None), "w": (w, None)}, "\n".join(lines), {"o": (out, ["n", "m", *op], SUM)})


def _window_inside(spatial, out_sp, ks, st, dil, begin) -> bool:
    """Whether every window position of a pool lies inside the input (no padding is ever read)."""
    if any(begin):
        return False
    for d, o, k, s, dl in zip(spatial, out_sp, ks, st, dil):
        slack = norm_dim(d - 1 - ((o - 1) * s + (k - 1) * dl))  # last input index minus last index read
        if not (slack >= 0 if isinstance(slack, int) else bool(sympy.sympify(slack).is_nonnegative)):
            return False
    return True


def _lowest(dtype: np.dtype) -> str:
    dtype = storage_dtype(dtype)
    return "-inf" if dtype.kind == "f" else str(int(np.iinfo(dtype).min))


@onnx_rule("MaxPool", "AveragePool")
@onnx_rule("LpPool", opsets=(2, LATEST_OPSET))  # LpPool-1 had a float `p`
def pool(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    n = _spatial_rank(node, x)
    ks = _kernel(node, None, n)
    out_sp, begin, end, st, dil = window(node, x.shape[2:], ks, bool(node.attr("ceil_mode", 0)))
    span = [(k - 1) * d + 1 for k, d in zip(ks, dil)]
    if any(b >= s or e >= s for b, e, s in zip(begin, end, span)):
        raise InvalidNode(f"pads {begin + end} must be smaller than the (dilated) kernel {span}: a window would hold "
                          "padding only")
    out = lw.output(node.outputs[0], [x.shape[0], x.shape[1], *out_sp], x.dtype)
    op, kp = params("o", n), params("k", n)
    sp = [f"{op[k]} * {st[k]} + {kp[k]} * {dil[k]} - {begin[k]}" for k in range(n)]
    inb = " and ".join(f"({s}) >= 0 and ({s}) < {dstr(d)}" for s, d in zip(sp, x.shape[2:]))
    ranges = [("n", x.shape[0]), ("c", x.shape[1]), *zip(op, out_sp), *zip(kp, ks)]
    read = sub("x", x, ["n", "c", *sp])
    oidx = ["n", "c", *op]
    inside = _window_inside(x.shape[2:], out_sp, ks, st, dil, begin)
    src, src_sp = x, sp
    if not inside and storage_dtype(x.dtype).kind == "f" and _every_window_holds_input(x.shape[2:], out_sp, ks, st, dil,
                                                                                      begin):
        # Windows read padding: pool over a padded copy instead (zeros; for MaxPool the lowest finite value,
        # which a window that holds at least one input element never returns), so every read is affine.
        src = _padded_for_windows(lw, node, x, out_sp, ks, st, dil, begin)
        src_sp = [f"{op[k]} * {st[k]} + {kp[k]} * {dil[k]}" for k in range(n)]
        read, inside = sub("x", src, ["n", "c", *src_sp]), True
    # Every window inside the (padded) input: an affine read, no guard (plain dataflow for the AD engine).
    x_in = {"x": (src, ["n", "c", *src_sp])} if inside else {"x": (x, None)}

    def guarded(expr: str, outside: str) -> str:
        return expr.replace(read, "x") if inside else f"({expr} if ({inb}) else {outside})"

    if node.op_type == "MaxPool":
        if inside:  # start from each window's first element (no -inf literal for the AD engine to parse)
            lw.copy_indexed(node.label, src, out, ["n", "c", *(f"{op[k]} * {st[k]}" for k in range(n))], oidx)
        else:
            lw.fill(node.label, out, _lowest(x.dtype))
        lw.map(node.label, ranges, x_in, f"o = {guarded(read, _lowest(x.dtype))}",
               {"o": (out, oidx, "lambda a, b: max(a, b)")})
        if node.output(1):  # argmax: first in-window position (row-major) holding the maximum
            ind = lw.output(node.output(1), out.shape, np.int64)
            lw.fill(node.label, ind, "-1")
            flat = f"(n) * ({dstr(x.shape[1])}) + c"
            if node.attr("storage_order", 0):  # column-major over the spatial dims
                inner = "0"
                for d, s in reversed(list(zip(x.shape[2:], sp))):
                    inner = f"({s}) + ({dstr(d)}) * ({inner})"
                flat = f"({flat}) * ({dstr(prod(x.shape[2:]))}) + {inner}"
            else:
                for d, s in zip(x.shape[2:], sp):
                    flat = f"({flat}) * ({dstr(d)}) + ({s})"
            read = sub("x", x, ["n", "c", *sp])
            lw.map(node.label, ranges, {"x": (x, None), "m": (out, oidx), "ii": (ind, oidx)},
                   f"io = ({flat}) if (({inb}) and ii < 0 and {read} == m) else ii", {"io": (ind, oidx, None)},
                   sequential=True)
        return
    if node.op_type == "LpPool":
        pw = int(node.attr("p", 2))
        acc = lw.temp(out.shape, x.dtype, "lp")
        lw.fill(node.label, acc, "0")
        lw.map(node.label, ranges, x_in, f"o = {guarded(f'abs({read}) ** {pw}', '0')}", {"o": (acc, oidx, SUM)})
        q = params("p", out.rank)
        lw.map(node.label, list(zip(q, out.shape)), {"a": (acc, q)}, f"o = a ** (1.0 / {pw})", {"o": (out, q, None)})
        return
    acc = lw.temp(out.shape, x.dtype, "sum")
    cnt = lw.temp(out.shape, x.dtype, "count")
    lw.fill(node.label, acc, "0")
    lw.fill(node.label, cnt, "0")
    if node.attr("count_include_pad", 0):
        cnt_cond = " and ".join(f"({s}) >= -{b} and ({s}) < {dstr(d)} + {e}" for s, d, b, e in
                                zip(sp, x.shape[2:], begin, end))
    else:
        cnt_cond = inb
    lw.map(node.label, ranges, x_in,
           f"o = {guarded(read, '0')}\nk = (1 if ({cnt_cond}) else 0)",
           {"o": (acc, oidx, SUM), "k": (cnt, oidx, SUM)})
    q = params("p", out.rank)
    lw.map(node.label, list(zip(q, out.shape)), {"a": (acc, q), "b": (cnt, q)}, "o = a / b", {"o": (out, q, None)})


def _every_window_holds_input(spatial, out_sp, ks, st, dil, begin) -> bool:
    """Static extents, and every window (dilation can skip the input) reads at least one input element."""
    if not all(isinstance(d, int) for d in (*spatial, *out_sp)):
        return False
    return all(any(0 <= o * s + k * dl - b < d for k in range(kk)) for d, out, kk, s, dl, b in
               zip(spatial, out_sp, ks, st, dil, begin) for o in range(out))


def _padded_for_windows(lw: Lowering, node: Node, x: Tensor, out_sp, ks, st, dil, begin) -> Tensor:
    """x padded so that every window position of a pool (`begin` before, what the last window needs after)
    is an element: zeros, or for MaxPool the lowest finite value of the type."""
    end = [max(0, (o - 1) * s + (k - 1) * dl + 1 - b - d)
           for o, s, k, dl, b, d in zip(out_sp, st, ks, dil, begin, x.shape[2:])]
    fill = repr(float(np.finfo(storage_dtype(x.dtype)).min)) if node.op_type == "MaxPool" else "0"
    return _zero_padded(lw, node, x, begin, end, fill)


@onnx_rule("GlobalAveragePool", "GlobalMaxPool")
def global_pool(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    axes = list(range(2, x.rank))
    shape = kept_shape(x, axes)
    if node.op_type == "GlobalMaxPool":
        out = lw.output(node.outputs[0], shape, x.dtype)
        reduce_into(lw, node.label, x, axes, True, "max", out)
        return
    acc = lw.temp(shape, x.dtype, "sum")
    reduce_into(lw, node.label, x, axes, True, "sum", acc)
    out = lw.output(node.outputs[0], shape, x.dtype)
    q = params("p", out.rank)
    lw.map(node.label, list(zip(q, shape)), {"a": (acc, q)}, f"o = a / ({dstr(prod(x.shape[2:]))})", {"o": (out, q, None)})


@onnx_rule("BatchNormalization")
def batch_norm(lw: Lowering, node: Node) -> None:
    """Inference form: y = (x - mean) / sqrt(var + eps) * scale + bias (running statistics)."""
    if node.attr("spatial", 1) != 1:
        raise RuleUnsupported("spatial=0 (statistics per element, BatchNormalization before opset 9)")
    training = bool(node.attr("training_mode", 0)) if node.opset >= 14 else any(node.output(k) for k in (1, 2, 3, 4))
    if training:
        batch_norm_training(lw, node)
        return
    x, s, b, m, v = (lw.get(node.inputs[k]) for k in range(5))
    _check_channel_params(x, (s, b, m, v))
    eps = literal_float(node.attr("epsilon", 1e-5))
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    _normalize(lw, node, x, s, b, (m, lambda c: [c]), (v, lambda c: [c]), eps, out)


def _normalize(lw: Lowering, node: Node, x: Tensor, s: Tensor, b: Tensor, mean, var, eps: str, out: Tensor) -> None:
    """out = (x - mean) * a + b with a = scale / sqrt(var + eps) computed once per channel: the square
    root (and in the backward its derivative, a power) runs per channel, not per element. `mean` and `var`
    are (tensor, index of channel c)."""
    channels = x.shape[1] if x.rank > 1 else 1
    a = lw.temp([channels], x.dtype, "bn_scale")
    (vt, vidx), (mt, midx) = var, mean
    lw.map(node.label, [("c", channels)], {"s": (s, ["c"]), "v": (vt, vidx("c"))},
           typed(f"o = s / sqrt(v + {eps})", x.dtype),
           {"o": (a, ["c"], None)})
    p = params("p", x.rank)
    c = p[1] if x.rank > 1 else "0"
    lw.map(node.label, list(zip(p, x.shape)), {"x": (x, p), "a": (a, [c]), "b": (b, [c]), "m": (mt, midx(c))},
           "o = (x - m) * a + b", {"o": (out, p, None)})


def _same_dims(what: str, want, got) -> None:
    """Extents that must be equal: different integers are `InvalidNode`, ones that cannot be compared
    while lowering (different symbols) are unsupported."""
    if len(want) != len(got):
        raise InvalidNode(f"{what}: ranks differ")
    for a, b in zip(want, got):
        diff = norm_dim(sympy.sympify(a) - b)
        if diff != 0:
            raise (InvalidNode if isinstance(diff, int) else RuleUnsupported)(f"{what}: extents differ")


def _check_channel_params(x: Tensor, per_channel) -> None:
    """BatchNormalization's scale, bias, mean and variance: one value per channel of x."""
    channels = x.shape[1] if x.rank > 1 else 1
    for t in per_channel:
        if t.rank != 1:
            raise InvalidNode(f"a per-channel input has shape {tuple(t.shape)}; it must be ({channels},)")
        same_extent(t.shape[0], channels, "a per-channel input and the channels of the data")


def _loss_inputs(lw: Lowering, node: Node) -> tuple[Tensor, Tensor, Tensor | None]:
    """Scores (N, C, d1, ...), labels (N, d1, ...) and optional class weights (C,) of a loss node, checked."""
    x, lab = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    wt = lw.get(node.input(2)) if node.input(2) else None
    if x.rank < 2 or lab.rank != x.rank - 1:
        raise InvalidNode(f"scores of shape {tuple(x.shape)} need labels of rank {x.rank - 1} (N, d1, ...), got "
                          f"{tuple(lab.shape)}")
    _same_dims(f"labels of shape {tuple(lab.shape)} for scores of shape {tuple(x.shape)}",
               [x.shape[0], *x.shape[2:]], lab.shape)
    if wt is not None:
        _same_dims(f"weights of shape {tuple(wt.shape)} for {x.shape[1]} classes", [x.shape[1]], wt.shape)
    return x, lab, wt


@onnx_rule("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(lw: Lowering, node: Node) -> None:
    """The negative log-likelihood of log_softmax(x) along the classes (axis 1)."""
    x, lab, wt = _loss_inputs(lw, node)
    axes = [1]
    keep = kept_shape(x, axes)
    kidx = lambda idx: ["0" if k == 1 else q for k, q in enumerate(idx)]  # noqa: E731
    mx = lw.temp(keep, x.dtype, "max")
    reduce_into(lw, node.label, x, axes, True, "max", mx)
    s = lw.temp(keep, x.dtype, "sum")
    reduce_into(lw, node.label, x, axes, True, "sum", s, "exp(a - m)", {"m": (mx, kidx)})
    p = params("p", x.rank)
    if node.output(1):
        logp = lw.output(node.output(1), x.shape, x.dtype)
    else:
        logp = lw.temp(x.shape, x.dtype, "logp")
    lw.map(node.label, list(zip(p, x.shape)), {"a": (x, p), "m": (mx, kidx(p)), "s": (s, kidx(p))},
           typed("o = a - m - log(s)", x.dtype), {"o": (logp, p, None)})
    _negative_log_likelihood(lw, node, logp, lab, wt)


@onnx_rule("NegativeLogLikelihoodLoss")
def negative_log_likelihood(lw: Lowering, node: Node) -> None:
    x, lab, wt = _loss_inputs(lw, node)
    _negative_log_likelihood(lw, node, x, lab, wt)


def _negative_log_likelihood(lw: Lowering, node: Node, logp: Tensor, lab: Tensor, wt: Tensor | None) -> None:
    """loss[n, d] = -w[t] * logp[n, t, d] with t = label[n, d] (0 where t == ignore_index), reduced.

    The labels are checked in a map of their own (it writes only the error flag). The pick itself is a sum
    over the classes of `logp[n, c, d]` where c == t: affine reads the AD engine differentiates exactly
    (the gradient lands on the labelled class), at the cost of one pass over the classes, as the softmax
    before it already makes."""
    red = node.attr("reduction", "mean")
    ignore = node.attr("ignore_index")
    C = logp.shape[1]
    lp = params("p", lab.rank)
    # a label is a class index in [0, C) (never wrapped), or ignore_index (then nothing is read)
    used = f"(t != {int(ignore)})" if ignore is not None else "True"
    lines, err = lw.checked(node.where, [Checked(f"(t if {used} else 0)", C,
                                                 f"class label from input '{node.input(1)}'", wraps=False)])
    lw.map(node.label, list(zip(lp, lab.shape)), {"t": (lab, lp)}, "\n".join(lines), err)
    per = lw.output(node.outputs[0], lab.shape, logp.dtype) if red == "none" else lw.temp(lab.shape, logp.dtype,
                                                                                          "loss")
    wsum = lw.temp(lab.shape, logp.dtype, "weight")
    lw.fill(node.label, per, "0")
    lw.fill(node.label, wsum, "0")
    hit = f"(t == c and {used})"
    ins = {"lp": (logp, [lp[0], "c", *lp[1:]]), "t": (lab, lp)}
    wexpr = "1.0"
    if wt is not None:
        ins["w"] = (wt, ["c"])
        wexpr = "w"
    lw.map(node.label, [*zip(lp, lab.shape), ("c", C)], ins,
           f"o = (-{wexpr} * lp) if {hit} else 0\nv = {wexpr} if {hit} else 0",
           {"o": (per, lp, SUM), "v": (wsum, lp, SUM)})
    if red == "none":
        return
    out = lw.output(node.outputs[0], (), logp.dtype)
    total = lw.temp((), logp.dtype, "total")
    reduce_into(lw, node.label, per, list(range(lab.rank)), False, "sum", total)
    if red == "sum":
        lw.map(node.label, [], {"a": (total, ["0"])}, "o = a", {"o": (out, ["0"], None)})
        return
    wtot = lw.temp((), logp.dtype, "wtotal")
    reduce_into(lw, node.label, wsum, list(range(lab.rank)), False, "sum", wtot)
    lw.map(node.label, [], {"a": (total, ["0"]), "b": (wtot, ["0"])}, "o = a / b", {"o": (out, ["0"], None)})


@onnx_rule("TopK")
def topk(lw: Lowering, node: Node) -> None:
    """Per slice along `axis`: each element's rank (the elements better than it, or equal at a lower index:
    ONNX's order; NaN the largest) places its index among the first K, then the values are gathered at those
    indices."""
    x = lw.get(node.inputs[0])
    axis = norm_axis(node.attr("axis", -1), x.rank)
    if node.opset >= 10:
        k_value = np.asarray(lw.value(node.inputs[1])).reshape(-1)
        if k_value.size != 1:
            raise InvalidNode(f"input 'K' must hold one value, it has {k_value.size}")
        K = int(k_value[0])
    else:
        K = int(node.attr("k"))
    largest = node.attr("largest", 1)
    n = x.shape[axis]
    if not isinstance(n, int):
        raise RuleUnsupported("TopK along a symbolic axis")
    if not 0 <= K <= n:
        raise InvalidNode(f"k = {K} is out of range for axis {axis} of extent {n} (valid: [0, {n}])")
    shape = list(x.shape)
    shape[axis] = K
    vals = lw.output(node.outputs[0], shape, x.dtype)
    inds = lw.output(node.outputs[1], shape, np.int64) if node.output(1) else lw.temp(shape, np.int64, "idx")
    p = params("p", x.rank)
    outer = [(q, d) for k, (q, d) in enumerate(zip(p, x.shape)) if k != axis]

    def at(conn: str, t: Tensor, j: str) -> str:
        return sub(conn, t, [j if k == axis else q for k, q in enumerate(p)])

    better = ">" if largest else "<"
    # element j goes to position r, the number of elements ahead of it: better, or equal at a lower index;
    # a NaN counts as the largest value (as in torch), so the order is total and every position is written
    au, aj = at('a', x, 'u'), at('a', x, 'j')
    code = f"""
for j in range({n}):
    r = 0
    nj = {aj} != {aj}
    for u in range({n}):
        nu = {au} != {au}
        ahead = False
        if nu != nj:
            ahead = {'nu' if largest else 'nj'}
        elif nu:
            ahead = u < j
        else:
            ahead = {au} {better} {aj} or ({au} == {aj} and u < j)
        if ahead:
            r = r + 1
    if r < {K}:
        {at('io', inds, 'r')} = j
"""
    lw.map(node.label, outer, {"a": (x, None)}, code.strip(), {"io": (inds, None, None)}, sequential=True)
    # the values as a gather at the chosen indices: the selection's integers pass no derivative, the gather's
    # reverse sends each value's gradient to the element it came from
    src = ["i" if k == axis else q for k, q in enumerate(p)]
    lw.map(node.label, list(zip(p, shape)), {"a": (x, None), "i": (inds, p)}, f"o = {sub('a', x, src)}",
           {"o": (vals, p, None)})


@onnx_rule("CumSum")
def cumsum(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    axis_value = np.asarray(lw.value(node.inputs[1])).reshape(-1)
    if axis_value.size != 1:
        raise InvalidNode(f"input 'axis' must hold one value, it has {axis_value.size}")
    axis = norm_axis(int(axis_value[0]), x.rank)
    excl, rev = node.attr("exclusive", 0), node.attr("reverse", 0)
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    lw.fill(node.label, out, "0")
    p = params("p", x.rank)
    j = p[axis]
    cmp = (">" if excl else ">=") if rev else ("<" if excl else "<=")
    src = list(p)
    src[axis] = "r"
    lw.map(node.label, [*zip(p, x.shape), ("r", x.shape[axis])], {"a": (x, src)},
           f"o = (a if (r {cmp} {j}) else 0)", {"o": (out, p, SUM)})


def batch_norm_training(lw: Lowering, node: Node) -> None:
    """Training mode: normalise with the batch statistics (biased variance); running stats are updated
    as running * momentum + batch * (1 - momentum)."""
    if node.opset < 14:
        raise RuleUnsupported("training-mode BatchNormalization before opset 14")
    x, s, b, rm, rv = (lw.get(node.inputs[k]) for k in range(5))
    _check_channel_params(x, (s, b, rm, rv))
    eps = literal_float(node.attr("epsilon", 1e-5))
    mom = literal_float(node.attr("momentum", 0.9))
    axes = [k for k in range(x.rank) if k != 1]
    keep = kept_shape(x, axes)
    count = dstr(prod(x.shape[k] for k in axes))
    kidx = lambda idx: ["0" if k != 1 else q for k, q in enumerate(idx)]  # noqa: E731
    total = lw.temp(keep, x.dtype, "sum")
    reduce_into(lw, node.label, x, axes, True, "sum", total)
    mean = lw.temp(keep, x.dtype, "mean")
    kp = params("p", x.rank)
    lw.map(node.label, list(zip(kp, keep)), {"a": (total, kp)}, f"o = a / ({count})", {"o": (mean, kp, None)})
    sq = lw.temp(keep, x.dtype, "sq")
    reduce_into(lw, node.label, x, axes, True, "sum", sq, "(a - m) * (a - m)", {"m": (mean, kidx)})
    var = lw.temp(keep, x.dtype, "var")
    lw.map(node.label, list(zip(kp, keep)), {"a": (sq, kp)}, f"o = a / ({count})", {"o": (var, kp, None)})
    out = lw.output(node.outputs[0], x.shape, x.dtype)
    channel = lambda c: ["0" if k != 1 else c for k in range(x.rank)]  # noqa: E731
    _normalize(lw, node, x, s, b, (mean, channel), (var, channel), eps, out)
    c = params("c", 1)
    for k, (running, batch) in enumerate(((rm, mean), (rv, var)), start=1):
        if node.output(k):
            res = lw.output(node.output(k), running.shape, x.dtype)
            batch_at = (batch, ["0" if j != 1 else c[0] for j in range(x.rank)])
            if float(node.attr("momentum", 0.9)) == 0.0:  # the batch statistic itself (gradflow.torch reads it)
                lw.map(node.label, list(zip(c, running.shape)), {"a": batch_at}, "o = a", {"o": (res, c, None)})
            else:
                lw.map(node.label, list(zip(c, running.shape)), {"r": (running, c), "a": batch_at},
                       f"o = r * {mom} + a * (1 - {mom})", {"o": (res, c, None)})
