"""`raise_convolutions`: a loop nest that computes a 2-D convolution becomes a `Convolution` node.

NPBench writes a convolution (channels last) as a loop over output pixels around a broadcast product and a
sum over three axes:

    for i in range(OH):
        for j in range(OW):
            out[:, i, j, :] = np.sum(x[:, i:i + K, j:j + K, :, np.newaxis] * w[np.newaxis], axis=(1, 2, 3))

which DaCe parses into two `LoopRegion`s around one state: a map writing the product into a 5-D transient
`t[n, kh, kw, c, m] = x[n, s*i + d*kh, s*j + d*kw, c] * w[kh, kw, c, m]`, a sum `Reduce` over axes (1, 2,
3) into a 2-D transient, and a copy of that into `out[0:N, i, j, 0:M]`. Differentiated as written, every
one of the OH * OW iterations tapes nothing but runs a map and a reduction in both sweeps; as a
`Convolution` node (layout NHWC), reverse mode uses its op-level rule and the compiled program runs
per-image BLAS products (`gradflow/library/convolution.py`).

The pass replaces the two loops with one state holding the node when all of this holds, and leaves the
program alone otherwise: both loops count from 0 by 1 up to the output's spatial extents; the state holds
exactly that map (a tasklet multiplying its two inputs), reduction and copy; the indices are as above
with positive integer strides and dilations; the two transients are used nowhere else; the loop variables
are read nowhere else; `out`, `x` and `w` are three different arrays. The loops wrote every element of
`out` (its spatial extents are the loops' trip counts), which the node writes too.
"""

from __future__ import annotations

import ast
import re
from typing import ClassVar

import attrs
import dace
import sympy
from dace import symbolic
from dace.libraries.standard import Reduce
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.analysis.indices import same_value as _same
from gradflow.analysis.loops import counted_loop
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.core.wcr import reduction_type
from gradflow.library.convolution import Convolution, wire


@attrs.frozen
class ConvolutionLoops:
    """A matched loop nest: replace `loop` (in `region`) by x -> Convolution -> out."""

    region: ControlFlowRegion
    loop: LoopRegion
    x: str
    w: str
    out: str
    strides: tuple[int, int]
    dilations: tuple[int, int]
    transients: tuple[str, ...]


def _from_zero(loop: LoopRegion):
    """The stop of `for v in range(0, stop)`, or None."""
    counted = counted_loop(loop, frozenset())
    if counted is None or counted.step != 1 or counted.cmp != "<" or not _same(counted.start, 0):
        return None
    return counted.stop


def _is_product(tasklet: nd.Tasklet) -> bool:
    """The tasklet's code is `out = a * b` over its two input connectors."""
    if tasklet.language != dace.Language.Python or len(tasklet.in_connectors) != 2 or len(tasklet.out_connectors) != 1:
        return False
    try:
        body = ast.parse(tasklet.code.as_string).body
    except SyntaxError:
        return False
    if len(body) != 1 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1:
        return False
    target, value = body[0].targets[0], body[0].value
    return (isinstance(target, ast.Name) and target.id in tasklet.out_connectors and isinstance(value, ast.BinOp)
            and isinstance(value.op, ast.Mult) and isinstance(value.left, ast.Name)
            and isinstance(value.right, ast.Name) and {value.left.id, value.right.id} == set(tasklet.in_connectors))


def _elements(memlet: dace.Memlet) -> list | None:
    """The index of a one-element memlet, per dimension (sympy), or None."""
    if memlet.subset is None or memlet.subset.num_elements() != 1 or memlet.wcr is not None:
        return None
    return [sympy.sympify(b) for b, _, _ in memlet.subset]


def _affine(expr, outer: sympy.Symbol, inner: sympy.Symbol) -> tuple[int, int] | None:
    """(a, b) when expr == a * outer + b * inner with positive integers a, b."""
    expr = sympy.expand(expr)
    a, b = expr.coeff(outer), expr.coeff(inner)
    if not (a.is_Integer and b.is_Integer and a > 0 and b > 0) or sympy.expand(expr - a * outer - b * inner) != 0:
        return None
    return int(a), int(b)


def _full(memlet_subset, shape) -> bool:
    return all(_same(b, 0) and _same(e + 1, d) and s == 1 for (b, e, s), d in zip(memlet_subset, shape))


def _words(code) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", code.as_string)) if code is not None else set()


def read_elsewhere(region: ControlFlowRegion, loop: LoopRegion, name: str) -> bool:
    """Whether `name` is read in `region` outside `loop` where it is not rebound (a loop over a variable of
    the same name, e.g. the next convolution's, assigns it before reading it)."""
    for edge in region.edges():
        if name in {str(s) for s in edge.data.free_symbols}:
            return True
    for block in region.nodes():
        if block is loop or (isinstance(block, LoopRegion) and block.loop_variable == name):
            continue
        if isinstance(block, dace.SDFGState):
            if name in {str(s) for s in block.free_symbols}:
                return True
        elif isinstance(block, LoopRegion):
            codes = (block.loop_condition, block.init_statement, block.update_statement)
            if any(name in _words(c) for c in codes) or read_elsewhere(block, loop, name):
                return True
        elif isinstance(block, ConditionalBlock):
            if any(name in _words(c) for c, _ in block.branches if c is not None):
                return True
            if any(read_elsewhere(branch, loop, name) for _, branch in block.branches):
                return True
        elif isinstance(block, ControlFlowRegion) and read_elsewhere(block, loop, name):
            return True
    return False


def _uses(sdfg: dace.SDFG, name: str) -> int:
    return sum(1 for s in sdfg.states() for n in s.data_nodes() if n.data == name)


def _pixel_loops(loop: LoopRegion) -> tuple | None:
    """(OH, the inner loop, OW, the state inside) when `loop` is `for i in range(OH): for j in range(OW):`
    around a single state, else None."""
    oh = _from_zero(loop)
    if oh is None or len(loop.nodes()) != 1 or not isinstance(loop.nodes()[0], LoopRegion):
        return None
    inner = loop.nodes()[0]
    ow = _from_zero(inner)
    if ow is None or len(inner.nodes()) != 1 or not isinstance(inner.nodes()[0], dace.SDFGState):
        return None
    return oh, inner, ow, inner.nodes()[0]


def _writes_pixel(dst, i, j, n_ext, m_ext) -> bool:
    """The copy out writes out[0:N, i, j, 0:M]: one output pixel of every image and channel."""
    (b0, e0, _), (b1, e1, _), (b2, e2, _), (b3, e3, _) = dst
    return bool(_same(b0, 0) and _same(e0 + 1, n_ext) and _same(b1, i) and _same(e1, i) and _same(b2, j)
                and _same(e2, j) and _same(b3, 0) and _same(e3 + 1, m_ext))


def _shapes_agree(x_desc, w_desc, out_desc, o_desc, out_shape: tuple, kernel: tuple) -> bool:
    """x is [N, ., ., C], w is [KH, KW, C, M], out is [N, OH, OW, M] and the per-pixel sum o is [N, M]."""
    n_ext, oh, ow, m_ext = out_shape
    kh, kw, c = kernel
    return bool(
        _same(out_desc.shape[0], n_ext) and _same(out_desc.shape[1], oh) and _same(out_desc.shape[2], ow)
        and _same(out_desc.shape[3], m_ext) and _same(x_desc.shape[0], n_ext) and _same(x_desc.shape[3], c)
        and _same(w_desc.shape[0], kh) and _same(w_desc.shape[1], kw)
        and _same(w_desc.shape[2], c) and _same(w_desc.shape[3], m_ext)
        and _same(o_desc.shape[0], n_ext) and _same(o_desc.shape[1], m_ext))


def match(sdfg: dace.SDFG, region: ControlFlowRegion, loop: LoopRegion) -> ConvolutionLoops | None:
    """The convolution `loop` computes (module docstring), or None."""
    nest = _pixel_loops(loop)
    if nest is None:
        return None
    oh, inner, ow, state = nest
    i, j = symbolic.symbol(loop.loop_variable), symbolic.symbol(inner.loop_variable)
    entries = [n for n in state.nodes() if isinstance(n, nd.MapEntry)]
    reduces = [n for n in state.nodes() if isinstance(n, Reduce)]
    if len(entries) != 1 or len(reduces) != 1:
        return None
    entry, red = entries[0], reduces[0]
    exit_ = state.exit_node(entry)
    body = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    access = [n for n in state.nodes() if isinstance(n, nd.AccessNode)]
    if (len(body) != 1 or not isinstance(body[0], nd.Tasklet) or not _is_product(body[0])
            or len(state.nodes()) != 3 + 1 + len(access) or len(access) != 5):
        return None
    tasklet = body[0]
    params = [symbolic.symbol(p) for p in entry.map.params]
    if len(params) != 5 or any(not _same(b, 0) or s != 1 for b, _, s in entry.map.range):
        return None
    extents = {p: e + 1 for p, (_, e, _) in zip(params, entry.map.range)}
    reads = {e.dst_conn: e for e in state.in_edges(tasklet)}
    writes = state.out_edges(tasklet)
    if len(reads) != 2 or len(writes) != 1:
        return None
    # the read whose index involves the loop variables is x
    read_elements = {c: _elements(e.data) for c, e in reads.items()}
    idx = {c: v for c, v in read_elements.items() if v is not None}
    if len(idx) != len(read_elements):
        return None
    xs = [c for c, v in idx.items() if any({i, j} & sympy.sympify(d).free_symbols for d in v)]
    if len(xs) != 1:
        return None
    xc = xs[0]
    (wc,) = set(reads) - {xc}
    x_name, w_name = reads[xc].data.data, reads[wc].data.data
    xi, wi = idx[xc], idx[wc]
    if len(xi) != 4 or len(wi) != 4 or any(d not in params for d in (xi[0], xi[3], *wi)):
        return None
    pn, pc = xi[0], xi[3]
    pkh, pkw, pc_w, pm = wi
    if pc_w != pc or len({pn, pkh, pkw, pc, pm}) != 5:
        return None
    hs, ws = _affine(xi[1], i, pkh), _affine(xi[2], j, pkw)
    if hs is None or ws is None:
        return None
    # the product goes to t[...] in some order of the params, then the sum over (kh, kw, c) to o[n, m]
    ti = _elements(writes[0].data)
    t_edges = state.out_edges(exit_)
    if ti is None or sorted(map(str, ti)) != sorted(map(str, params)) or len(t_edges) != 1:
        return None
    t_node = t_edges[0].dst
    t_name = writes[0].data.data
    if not isinstance(t_node, nd.AccessNode) or t_node.data != t_name or state.out_degree(t_node) != 1:
        return None
    red_in = state.out_edges(t_node)[0]
    t_desc = sdfg.arrays[t_name]
    summed = sorted(ti.index(p) for p in (pkh, pkw, pc))
    kept = [ti.index(p) for p in (pn, pm)]
    if (red_in.dst is not red or not t_desc.transient or red.axes is None or sorted(red.axes) != summed
            or kept != sorted(kept) or red.identity not in (None, 0)
            or reduction_type(red.wcr) != dace.dtypes.ReductionType.Sum
            or not _full(red_in.data.subset, t_desc.shape)):
        return None
    red_out = state.out_edges(red)
    if len(red_out) != 1 or not isinstance(red_out[0].dst, nd.AccessNode):
        return None
    o_node = red_out[0].dst
    o_desc = sdfg.arrays[o_node.data]
    if (not o_desc.transient or len(o_desc.shape) != 2 or state.out_degree(o_node) != 1
            or red_out[0].data.wcr is not None or not _full(red_out[0].data.subset, o_desc.shape)):
        return None
    copy = state.out_edges(o_node)[0]
    if copy.data.wcr is not None:
        return None
    out_node = copy.dst
    if not isinstance(out_node, nd.AccessNode) or state.out_degree(out_node) or out_node.data in (x_name, w_name):
        return None
    out_desc = sdfg.arrays[out_node.data]
    dst = copy.data.get_dst_subset(copy, state)
    src = copy.data.get_src_subset(copy, state)
    if dst is None or src is None or len(out_desc.shape) != 4 or not _full(src, o_desc.shape):
        return None
    n_ext, m_ext = extents[pn], extents[pm]
    if not _writes_pixel(dst, i, j, n_ext, m_ext):
        return None
    kernel = (extents[pkh], extents[pkw], extents[pc])
    if (not _shapes_agree(sdfg.arrays[x_name], sdfg.arrays[w_name], out_desc, o_desc, (n_ext, oh, ow, m_ext), kernel)
            or len({x_name, w_name, out_node.data}) != 3):
        return None
    if _uses(sdfg, t_name) != 1 or _uses(sdfg, o_node.data) != 1:
        return None
    if any(read_elsewhere(sdfg, loop, str(v)) for v in (i, j)):
        return None
    return ConvolutionLoops(region, loop, x_name, w_name, out_node.data, (hs[0], ws[0]), (hs[1], ws[1]),
                            (t_name, o_node.data))


def find_matches(sdfg: dace.SDFG) -> list[ConvolutionLoops]:
    found = []
    for sub in sdfg.all_sdfgs_recursive():
        for region in sub.all_control_flow_regions():
            for block in region.nodes():
                if isinstance(block, LoopRegion):
                    m = match(sub, region, block)
                    if m is not None:
                        found.append(m)
    return found


def _replace(m: ConvolutionLoops) -> None:
    region, sdfg = m.region, m.loop.sdfg
    state = region.add_state(f"{m.loop.label}_conv")
    conv = Convolution(f"conv_{m.out}", strides=m.strides, dilations=m.dilations, layout="NHWC")
    whole = {name: dace.Memlet.from_array(name, sdfg.arrays[name]) for name in (m.x, m.w, m.out)}
    wire(state, conv, {"_x": whole[m.x], "_w": whole[m.w]}, ("_y", whole[m.out]))
    for e in region.in_edges(m.loop):
        region.add_edge(e.src, state, e.data)
    for e in region.out_edges(m.loop):
        region.add_edge(state, e.dst, e.data)
    was_start = region.start_block is m.loop
    region.remove_node(m.loop)
    if was_start:
        region.start_block = region.node_id(state)
    for name in m.transients:
        if _uses(sdfg, name) == 0:
            sdfg.remove_data(name, validate=False)


@register_pass
@attrs.frozen
class RaiseConvolutions(RewritePass):
    """Loop nests computing a 2-D convolution become `Convolution` nodes (module docstring)."""

    name: ClassVar[str] = "raise_convolutions"
    nested: ClassVar[bool] = False  # `find_matches` walks the nested SDFGs itself
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> list[ConvolutionLoops]:
        return find_matches(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match: ConvolutionLoops) -> None:
        _replace(match)
