"""Two-dimensional convolution as library nodes: the forward product and its two gradients.

    Convolution             y[n, m, o] = sum_{c, k} w[m, c, k] x[n, c, o * stride + k * dilation - pad]
    ConvolutionGradInput    dx[n, c, o * stride + k * dilation - pad] += sum_m w[m, c, k] dy[n, m, o]
    ConvolutionGradWeights  dw[m, c, k] += sum_{n, o} dy[n, m, o] x[n, c, o * stride + k * dilation - pad]

`pads` are the zeros before the input's first row and column; an index outside `x` (before it, or after
it as far as the output's extent reaches) reads a zero, and its gradient goes nowhere. So a padded
convolution needs no padded copy of its input, nor of its input's gradient (ONNX's `pads` end where the
output's extent says). `o` and `k` run over two spatial dimensions. `layout` "NCHW" (ONNX's, above) or
"NHWC" (channels last: x (N, H, W, C), w (KH, KW, C, M), y (N, OH, OW, M), as NPBench writes its
networks). The gradient nodes add into their output (a gradient buffer), as a Gemm with beta = 1 does.
Reverse mode keeps a `Convolution` whole (`autodiff/rules/library/convolution.py` emits the two gradient
nodes), so a model's backward pass is made of these nodes too.

Expansions: `pure` (the default, and what the two-route check differentiates): map nests with a sum
into the output (with pads, over a zero-padded copy in a nested program). `runtime.blas` adds
`gradflow_blas` (and makes it the default while a program compiles): one C++ call into
`runtime/conv_kernels.h` (per-image unfolding and OpenBLAS products), for operands that are whole
float32/float64 arrays with packed C strides (`blas_ready`, `symbols_declared`); other operands get the
map nests. That expansion lives with the BLAS it links, so this package stays below the runtime. Build
nodes with `wire` (it records the extents whose symbols the call names). docs/library_nodes.md.
"""

from __future__ import annotations

import dace
import sympy
from dace import properties, symbolic
from dace.sdfg import nodes as nd
from dace.transformation.transformation import ExpandTransformation

from gradflow.core.wcr import SUM

#: (inputs, output) connectors of each node class
CONNECTORS = {
    "Convolution": (("_x", "_w"), "_y"),
    "ConvolutionGradInput": (("_dy", "_w"), "_dx"),
    "ConvolutionGradWeights": (("_x", "_dy"), "_dw"),
}


def _edges(node: nd.LibraryNode, state: dace.SDFGState) -> dict[str, dace.Memlet]:
    memlets = {e.dst_conn: e.data for e in state.in_edges(node) if not e.data.is_empty()}
    memlets.update({e.src_conn: e.data for e in state.out_edges(node) if not e.data.is_empty()})
    return memlets


def _sizes(node, state) -> dict[str, list]:
    return {conn: list(m.subset.size()) for conn, m in _edges(node, state).items()}


#: where each extent sits in x, w and y, per layout
LAYOUTS = {
    "NCHW": {"x": "NCHW", "w": "MCKL", "y": "NMOP"},  # w (M, C, KH, KW); y (N, M, OH, OW)
    "NHWC": {"x": "NHWC", "w": "KLCM", "y": "NOPM"},  # w (KH, KW, C, M); y (N, OH, OW, M)
}


def shape_of(node, state) -> dict[str, object]:
    """N, C, H, W (the input, unpadded), M, KH, KW, OH, OW of the node, read from its memlets."""
    sizes = _sizes(node, state)
    ins, out = CONNECTORS[type(node).__name__]
    conns = set(ins) | {out}
    found = {}
    for role in "xwy":
        extents = sizes[f"_{role}" if f"_{role}" in conns else f"_d{role}"]
        found.update(zip(LAYOUTS[node.layout][role], extents))
    names = {"K": "KH", "L": "KW", "O": "OH", "P": "OW"}
    return {names.get(k, k): v for k, v in found.items()}


def _indices(layout: str) -> dict[str, str]:
    """Element of x, w and y at map parameters n, m, oh, ow, c, kh, kw (x's spatial index left as {h}, {w})."""
    if layout == "NHWC":
        return {"x": "n, {h}, {w}, c", "w": "kh, kw, c, m", "y": "n, oh, ow, m"}
    return {"x": "n, c, {h}, {w}", "w": "m, c, kh, kw", "y": "n, m, oh, ow"}


def _c_strides(desc: dace.data.Array) -> bool:
    """Packed row-major strides, compared as simplified expressions (DaCe's own check compares them as
    written, and a frontend may write `6*W - 24` for `6*(W - 4)`)."""
    expected = 1
    for extent, stride in reversed(list(zip(desc.shape, desc.strides))):
        if sympy.simplify(symbolic.pystr_to_symbolic(str(stride)) - expected) != 0:
            return False
        expected = expected * symbolic.pystr_to_symbolic(str(extent))
    return desc.start_offset == 0 if hasattr(desc, "start_offset") else True


def _packed_whole(sdfg: dace.SDFG, memlet: dace.Memlet) -> bool:
    desc = sdfg.arrays[memlet.data]
    whole = dace.subsets.Range.from_array(desc)
    return (type(desc) is dace.data.Array and len(desc.shape) == 4 and _c_strides(desc)
            and memlet.subset.covers(whole) and memlet.wcr is None)


def blas_ready(node, state, sdfg) -> bool:
    """Whether the C++ kernels can take the node's operands as they are (module docstring)."""
    memlets = _edges(node, state)
    dtypes = {sdfg.arrays[m.data].dtype for m in memlets.values()}
    return (len(memlets) == 3 and all(_packed_whole(sdfg, m) for m in memlets.values())
            and len(dtypes) == 1 and dtypes <= {dace.float32, dace.float64})


def symbols_declared(node, state) -> bool:
    """Every symbol of the operands' extents is among the node's free symbols (see `wire`): the C++ call
    of the BLAS expansion (`runtime.blas`) names them, so a node without them gets the map nests."""
    used = set()
    for memlet in _edges(node, state).values():
        for extent in memlet.subset.size():
            used |= {str(s) for s in symbolic.pystr_to_symbolic(str(extent)).free_symbols}
    return used <= node.free_symbols


# --- pure expansion: map nests ----------------------------------------------------------------------------

def _padded_extent(extent, pad: int, reach) -> object:
    """The extent of a zero-padded copy of an input dimension: `pad` zeros, the input, and as many zeros
    after it as the windows reach (`reach` elements from the copy's start; symbolic extents get an upper
    bound, this copy being the fallback's)."""
    try:
        return max(int(extent) + pad, int(reach))
    except TypeError:  # symbolic
        return extent + pad + reach


def _pure(node, state, sdfg) -> dace.SDFG:
    s = shape_of(node, state)
    sh, sw = node.strides
    dh, dw = node.dilations
    ph, pw = node.pads
    memlets = _edges(node, state)
    inner = dace.SDFG(f"{node.label}_pure")
    for conn, memlet in memlets.items():  # a subset of a larger array keeps that array's strides
        desc = sdfg.arrays[memlet.data]
        inner.add_array(conn, list(memlet.subset.size()), desc.dtype, strides=desc.strides)
    kind = type(node).__name__
    ranges = {"n": f"0:{s['N']}", "m": f"0:{s['M']}", "oh": f"0:{s['OH']}", "ow": f"0:{s['OW']}",
              "c": f"0:{s['C']}", "kh": f"0:{s['KH']}", "kw": f"0:{s['KW']}"}
    idx = _indices(node.layout)
    xi = idx["x"].format(h=f"oh * {sh} + kh * {dh}", w=f"ow * {sw} + kw * {dw}")
    wi, yi = idx["w"], idx["y"]
    xconn = "_dx" if kind == "ConvolutionGradInput" else "_x"
    padded = ph or pw
    if padded:  # the body reads (or sums into) a zero-padded copy of x: `_pad`
        extents = {"N": s["N"], "C": s["C"],
                   "H": _padded_extent(s["H"], ph, (s["OH"] - 1) * sh + (s["KH"] - 1) * dh + 1),
                   "W": _padded_extent(s["W"], pw, (s["OW"] - 1) * sw + (s["KW"] - 1) * dw + 1)}
        inner.add_transient("_pad", [extents[d] for d in LAYOUTS[node.layout]["x"]], inner.arrays[xconn].dtype)
    body_x = "_pad" if padded else xconn
    first = inner.add_state(f"{node.label}_zero", is_start_block=True)
    st = inner.add_state_after(first, f"{node.label}_body")
    if kind == "Convolution":  # overwrites y: zeros first
        first.add_mapped_tasklet("zero", {k: ranges[k] for k in ("n", "m", "oh", "ow")}, {}, "o = 0",
                                 {"o": dace.Memlet(f"_y[{yi}]")}, external_edges=True)
    if padded:  # the padded copy starts as zeros
        zeros = {f"z{k}": f"0:{e}" for k, e in enumerate(inner.arrays["_pad"].shape)}
        first.add_mapped_tasklet("zero_pad", zeros, {}, "o = 0", {"o": dace.Memlet(f"_pad[{', '.join(zeros)}]")},
                                 external_edges=True)
    inside = {"n": f"0:{s['N']}", "c": f"0:{s['C']}", "h": f"0:{s['H']}", "w": f"0:{s['W']}"}
    shifted = idx["x"].format(h=f"h + {ph}", w=f"w + {pw}")
    plain = idx["x"].format(h="h", w="w")
    if padded and kind != "ConvolutionGradInput":  # x into the copy, after the zeros
        copy = inner.add_state_after(first, f"{node.label}_copy")  # (between the zeros and the body)
        copy.add_mapped_tasklet("copy_in", inside, {"a": dace.Memlet(f"_x[{plain}]")}, "o = a",
                                {"o": dace.Memlet(f"_pad[{shifted}]")}, external_edges=True)
    if kind == "Convolution":
        ins, out = {"a": dace.Memlet(f"{body_x}[{xi}]"), "b": dace.Memlet(f"_w[{wi}]")}, ("o", f"_y[{yi}]")
    elif kind == "ConvolutionGradInput":
        ins, out = {"a": dace.Memlet(f"_dy[{yi}]"), "b": dace.Memlet(f"_w[{wi}]")}, ("o", f"{body_x}[{xi}]")
    else:
        ins, out = {"a": dace.Memlet(f"_dy[{yi}]"), "b": dace.Memlet(f"{body_x}[{xi}]")}, ("o", f"_dw[{wi}]")
    st.add_mapped_tasklet("conv", ranges, ins, "o = a * b", {out[0]: dace.Memlet(out[1], wcr=SUM)},
                          external_edges=True)
    if padded and kind == "ConvolutionGradInput":  # the copy's gradient inside x added into _dx
        last = inner.add_state_after(st, f"{node.label}_add")
        last.add_mapped_tasklet("add_out", inside, {"a": dace.Memlet(f"_pad[{shifted}]")}, "o = a",
                                {"o": dace.Memlet(f"_dx[{plain}]", wcr=SUM)}, external_edges=True)
    if first.number_of_nodes() == 0:  # an unpadded gradient: the body alone
        inner.remove_node(first)
        inner.start_block = inner.node_id(st)
    return inner


@dace.library.expansion
class ExpandPure(ExpandTransformation):
    environments = []

    @staticmethod
    def expansion(node, state, sdfg, **kwargs):
        return _pure(node, state, sdfg)


@properties.make_properties
class _ConvolutionBase(nd.LibraryNode):
    # `dace.library.node` gives each decorated subclass its own copy of these
    implementations = {"pure": ExpandPure}
    default_implementation = "pure"

    strides = properties.ListProperty(element_type=int, default=[1, 1], desc="strides (height, width)")
    dilations = properties.ListProperty(element_type=int, default=[1, 1], desc="dilations (height, width)")
    pads = properties.ListProperty(element_type=int, default=[0, 0],
                                   desc="zeros before the input's first row and column (height, width)")
    layout = properties.Property(dtype=str, default="NCHW", choices=tuple(LAYOUTS),
                                 desc="NCHW: x (N, C, H, W), w (M, C, KH, KW); NHWC: x (N, H, W, C), w (KH, KW, C, M)")

    extents = properties.ListProperty(element_type=str, default=[],
                                      desc="extents of the operands (set by `wire`): the symbols the call names")

    def __init__(self, name, strides=(1, 1), dilations=(1, 1), layout="NCHW", pads=(0, 0), *args, **kwargs):
        ins, out = CONNECTORS[type(self).__name__]
        super().__init__(name, *args, inputs={c: None for c in ins}, outputs={out: None}, **kwargs)
        self.strides = [int(v) for v in strides]
        self.dilations = [int(v) for v in dilations]
        self.pads = [int(v) for v in pads]
        if len(self.pads) != 2 or min(self.pads) < 0:
            raise ValueError(f"pads {tuple(pads)}: two non-negative counts (height, width)")
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
        self.layout = layout

    @property
    def free_symbols(self) -> set[str]:
        # DaCe leaves the extents of whole non-transient arrays out of a state's used symbols, but the
        # kernel call names them: without this, a program's Python side would not pass a symbol its
        # compiled signature has
        found = set(super().free_symbols)
        for extent in self.extents:
            found |= {str(s) for s in symbolic.pystr_to_symbolic(extent).free_symbols}
        return found


@dace.library.node
class Convolution(_ConvolutionBase):
    """y = conv(x, w) over two spatial dims, x padded by `pads` zeros (module docstring)."""


@dace.library.node
class ConvolutionGradInput(_ConvolutionBase):
    """dx += the input gradient of a `Convolution` (module docstring)."""


@dace.library.node
class ConvolutionGradWeights(_ConvolutionBase):
    """dw += the weight gradient of a `Convolution` (module docstring)."""


NODES = (Convolution, ConvolutionGradInput, ConvolutionGradWeights)


def wire(state: dace.SDFGState, node: _ConvolutionBase, reads: dict[str, dace.Memlet],
         write: tuple[str, dace.Memlet]) -> None:
    """Add `node` to `state` reading `reads` (connector -> memlet) and writing `write`, and record the
    operands' extents on it. Build the nodes with this: it is what makes their symbols visible."""
    state.add_node(node)
    nodes = {}
    for conn, memlet in reads.items():
        read = nodes.setdefault(memlet.data, state.add_read(memlet.data))
        state.add_edge(read, None, node, conn, memlet)
    conn, memlet = write
    state.add_edge(node, conn, state.add_write(memlet.data), None, memlet)
    node.extents = [str(e) for m in (*reads.values(), memlet) for e in m.subset.size()]

