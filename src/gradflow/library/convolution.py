"""Two-dimensional convolution as library nodes: the forward product and its two gradients.

    Convolution             y[n, m, o] = sum_{c, k} w[m, c, k] x[n, c, o * stride + k * dilation]
    ConvolutionGradInput    dx[n, c, o * stride + k * dilation] += sum_m w[m, c, k] dy[n, m, o]
    ConvolutionGradWeights  dw[m, c, k] += sum_{n, o} dy[n, m, o] x[n, c, o * stride + k * dilation]

`x` is the input already zero-padded (the ONNX lowering pads into a transient), so every index is inside
it; `o` and `k` run over two spatial dimensions. `layout` "NCHW" (ONNX's, above) or "NHWC" (channels
last: x (N, H, W, C), w (KH, KW, C, M), y (N, OH, OW, M), as NPBench writes its networks). The gradient
nodes add into their output (a gradient buffer), as a Gemm with beta = 1 does. Reverse mode keeps a `Convolution` whole
(`autodiff/rules/library/convolution.py` emits the two gradient nodes), so a model's backward pass is
made of these nodes too.

Expansions: `pure` (the default, and what the two-route check differentiates): map nests with a sum
into the output. `runtime.blas` adds `gradflow_blas` (and makes it the default while a program
compiles): one C++ call into `runtime/conv_kernels.h` (per-image unfolding and OpenBLAS products), for
operands that are whole float32/float64 arrays with packed C strides (`blas_ready`, `symbols_declared`);
other operands get the map nests. That expansion lives with the BLAS it links, so this package stays
below the runtime. Build nodes with `wire` (it records the extents whose symbols the call names).
docs/library_nodes.md.
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
    """N, C, H, W (padded input), M, KH, KW, OH, OW of the node, read from its memlets."""
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

def _pure(node, state, sdfg) -> dace.SDFG:
    s = shape_of(node, state)
    sh, sw = node.strides
    dh, dw = node.dilations
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
    st = inner.add_state(f"{node.label}_body", is_start_block=kind != "Convolution")
    if kind == "Convolution":  # overwrites y: zeros first
        init = inner.add_state(f"{node.label}_init", is_start_block=True)
        init.add_mapped_tasklet("zero", {k: ranges[k] for k in ("n", "m", "oh", "ow")}, {}, "o = 0",
                                {"o": dace.Memlet(f"_y[{yi}]")}, external_edges=True)
        inner.add_edge(init, st, dace.InterstateEdge())
        ins, out = {"a": dace.Memlet(f"_x[{xi}]"), "b": dace.Memlet(f"_w[{wi}]")}, ("o", f"_y[{yi}]")
    elif kind == "ConvolutionGradInput":
        ins, out = {"a": dace.Memlet(f"_dy[{yi}]"), "b": dace.Memlet(f"_w[{wi}]")}, ("o", f"_dx[{xi}]")
    else:
        ins, out = {"a": dace.Memlet(f"_dy[{yi}]"), "b": dace.Memlet(f"_x[{xi}]")}, ("o", f"_dw[{wi}]")
    st.add_mapped_tasklet("conv", ranges, ins, "o = a * b", {out[0]: dace.Memlet(out[1], wcr=SUM)},
                          external_edges=True)
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
    layout = properties.Property(dtype=str, default="NCHW", choices=tuple(LAYOUTS),
                                 desc="NCHW: x (N, C, H, W), w (M, C, KH, KW); NHWC: x (N, H, W, C), w (KH, KW, C, M)")

    extents = properties.ListProperty(element_type=str, default=[],
                                      desc="extents of the operands (set by `wire`): the symbols the call names")

    def __init__(self, name, strides=(1, 1), dilations=(1, 1), layout="NCHW", *args, **kwargs):
        ins, out = CONNECTORS[type(self).__name__]
        super().__init__(name, *args, inputs={c: None for c in ins}, outputs={out: None}, **kwargs)
        self.strides = [int(v) for v in strides]
        self.dilations = [int(v) for v in dilations]
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
    """y = conv(x, w) over two spatial dims, x already padded (module docstring)."""


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

