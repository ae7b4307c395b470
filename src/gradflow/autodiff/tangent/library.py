"""The built-in `tangent_library` rules: library nodes kept whole by forward mode.

- Linear nodes (a sum `Reduce`, `Transpose`, `TensorTranspose`): the same node applied to the tangent.
- A max or min `Reduce`: the mean of the tangents of the elements that attain the result (ties split
  equally, as torch's `amax`); a product `Reduce`: exact where factors are zero.
- Multilinear nodes (`MatMul`, `Gemm`, `Gemv`, `Dot`, `TensorDot`, `Einsum`, gradflow's `Convolution`): the
  product rule, one copy of the node per operand that carries a tangent, that operand replaced by its
  tangent; the first copy writes the output's tangent and keeps the node's accumulation (`beta * C`,
  through an input connector read from C's tangent, or into the output's memory, as reverse mode's
  `beta = 1` nodes without one do), the others write temporaries with `beta = 0` that a map adds in. So
  the tangent of a product is again BLAS calls, of a convolution two convolutions (`conv(dx, w) + conv(x,
  dw)`).
"""

from __future__ import annotations

import copy

import dace
from dace import dtypes, subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.autodiff.context import OpSite
from gradflow.autodiff.emit import subset_elements
from gradflow.autodiff.rules.library.reduce import index_maps, reduction_io
from gradflow.autodiff.tangent.context import TangentContext, tangent_library_rule
from gradflow.autodiff.tangent.zeros import zero_subset
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.wcr import PRODUCT, SUM, reduction_type


def _edges(state: SDFGState, node: nd.LibraryNode):
    ins = {e.dst_conn: e for e in state.in_edges(node) if not e.data.is_empty()}
    outs = [e for e in state.out_edges(node) if not e.data.is_empty()]
    return ins, outs


def _clone(state: SDFGState, node: nd.LibraryNode, tag: str) -> nd.LibraryNode:
    twin = copy.deepcopy(node)
    twin.name = twin.label = f"{node.label}_{tag}"
    state.add_node(twin)
    return twin


def _linear(site: OpSite, node: nd.LibraryNode, ctx: TangentContext) -> None:
    state = site.state
    mirror = ctx.mirror(state)
    ins, outs = _edges(state, node)
    out = outs[0]
    if not mirror.has_tangent(out.data.data):
        return
    (conn, edge), = ins.items()
    if not mirror.has_tangent(edge.data.data):
        zero_subset(state, mirror.node(out.dst), out.data.get_dst_subset(out, state))
        return
    twin = _clone(state, node, "tan")
    state.add_edge(mirror.node(edge.src), None, twin, conn, mirror.memlet(edge.data))
    state.add_edge(twin, out.src_conn, mirror.node(out.dst), None, mirror.memlet(out.data))


def _is_sum(node) -> bool:
    return reduction_type(node.wcr) == dtypes.ReductionType.Sum


@tangent_library_rule("Reduce", applies=_is_sum, name="SumTangent")
@tangent_library_rule("Transpose", "TensorTranspose", name="LinearTangent")
class Linear:
    """The node applied to its operand's tangent."""

    def tangent(self, site: OpSite, node: nd.LibraryNode, ctx: TangentContext) -> None:
        _linear(site, node, ctx)


def _add_into(state: SDFGState, target: nd.AccessNode, subset: subsets.Range, temp: nd.AccessNode) -> nd.AccessNode:
    """target[subset] + temp (an array shaped like the subset's extents), written into a new access node of
    target's array, which it returns."""
    ranges, params, element = subset_elements(subset, "__t")
    after = state.add_access(target.data)
    state.add_mapped_tasklet(
        f"add_{target.data}", ranges,
        {"__a": dace.Memlet(f"{target.data}[{element}]"), "__b": dace.Memlet(f"{temp.data}[{', '.join(params)}]")},
        "__o = __a + __b", {"__o": dace.Memlet(f"{target.data}[{element}]")},
        input_nodes={target.data: target, temp.data: temp}, output_nodes={target.data: after},
        external_edges=True)
    return after


def _accumulator(ins: dict, out) -> str | None:
    """The input connector through which a node reads the old value of its output (`beta * C`): the one
    named like the output connector (Gemm's `_c`, Gemv's `_y`). An operand that reads another part of the
    output's array (`x[i] = dot(L[i, :i], x[:i])`) is no accumulator."""
    return out.src_conn if out.src_conn in ins else None


def _accumulate_nothing(node: nd.LibraryNode, conn: str | None) -> None:
    """A term that adds nothing to its output's old value (`beta = 0`, no accumulator connector; Gemm's
    `cin` cleared too, else its expansion still reads `_c`)."""
    if hasattr(node, "beta"):
        node.beta = 0
    if hasattr(node, "cin"):
        node.cin = False
    if conn is not None and conn in node.in_connectors:
        node.remove_in_connector(conn)


@tangent_library_rule("MatMul", "Gemm", "Gemv", "Dot", "TensorDot", "Einsum", "Convolution")
class ProductRule:
    """d(A B) = dA B + A dB (any number of operands), `beta * C` carried by the first term."""

    def tangent(self, site: OpSite, node: nd.LibraryNode, ctx: TangentContext) -> None:
        state = site.state
        mirror = ctx.mirror(state)
        ins, outs = _edges(state, node)
        out = outs[0]
        if not mirror.has_tangent(out.data.data):
            return
        acc = _accumulator(ins, out)
        operands = [c for c in sorted(ins) if c != acc]
        active = [c for c in operands if mirror.has_tangent(ins[c].data.data)]
        acc_active = acc is not None and mirror.has_tangent(ins[acc].data.data)
        target = mirror.node(out.dst)
        subset = out.data.get_dst_subset(out, state)
        if not active and not acc_active:
            zero_subset(state, target, subset)
            return
        if not active:  # only the accumulated old value varies: one term with every operand as it is
            active = [None]
        for k, which in enumerate(active):
            twin = _clone(state, node, f"tan{k}")
            for conn in operands:
                e = ins[conn]
                if conn == which:
                    state.add_edge(mirror.node(e.src), e.src_conn, twin, conn, mirror.memlet(e.data))
                else:
                    state.add_edge(e.src, e.src_conn, twin, conn, copy.deepcopy(e.data))
            if k == 0:
                if acc is not None:
                    if acc_active:
                        e = ins[acc]
                        state.add_edge(mirror.node(e.src), e.src_conn, twin, acc, mirror.memlet(e.data))
                    else:  # the old value has no tangent: beta * 0
                        _accumulate_nothing(twin, acc)
                state.add_edge(twin, out.src_conn, target, None, mirror.memlet(out.data))
                continue
            # a later term goes to a fresh temporary: it accumulates nothing (a node with `beta` and no
            # accumulator connector, as reverse mode emits them, adds into its output's memory)
            _accumulate_nothing(twin, acc)
            desc = state.sdfg.arrays[out.data.data]
            name, _ = state.sdfg.add_array(f"gradflow_tterm_{out.data.data}", subset.size(), desc.dtype,
                                           transient=True, find_new_name=True)
            temp = state.add_access(name)
            full = subsets.Range.from_array(state.sdfg.arrays[name])
            state.add_edge(twin, out.src_conn, temp, None, dace.Memlet(data=name, subset=full))
            target = _add_into(state, target, subset, temp)


def _reduction_operands(site: OpSite, node: nd.LibraryNode, ctx: TangentContext):
    """(input, output, map ranges over the input, input element, output element) of a reduction whose
    output carries a tangent; None when there is nothing more to do (no tangent, or zeros written because
    the input has none)."""
    state = site.state
    mirror = ctx.mirror(state)
    x, y = reduction_io(site)
    if not mirror.has_tangent(y.array):
        return None
    (out,) = [e for e in state.out_edges(node) if not e.data.is_empty()]
    if not mirror.has_tangent(x.array):
        zero_subset(state, mirror.node(out.dst), out.data.get_dst_subset(out, state))
        return None
    if node.identity is None:
        raise NotDifferentiableError(
            f"reduction '{node}' combines its result with the old value of '{y.array}' (no identity)",
            "reduce into a new array")
    return (x, y, *index_maps(site, x, y))


def _like(sdfg: dace.SDFG, array: str, stem: str) -> str:
    """A new transient shaped and typed like `array` (per-output temporaries of a reduction's tangent)."""
    desc = sdfg.arrays[array]
    return sdfg.add_array(stem, desc.shape, desc.dtype, transient=True, find_new_name=True)[0]


def _is_extremum(node) -> bool:
    return reduction_type(node.wcr) in (dtypes.ReductionType.Max, dtypes.ReductionType.Min)


@tangent_library_rule("Reduce", applies=_is_extremum, name="ExtremumTangent")
class Extremum:
    """The tangent of a maximum (minimum) is the mean of the tangents of the elements that attain it, as
    `torch.amax`'s: after the node, count the ties and sum their tangents (`cnt[o] = #{i : x[i] == y[o]}`),
    then divide, in three states after the node's."""

    def tangent(self, site: OpSite, node: nd.LibraryNode, ctx: TangentContext) -> None:
        operands = _reduction_operands(site, node, ctx)
        if operands is None:
            return
        x, y, ranges, xi, yo = operands
        state = site.state
        sdfg, cfg = state.sdfg, state.parent_graph
        count, total = (_like(sdfg, y.array, f"gradflow_{role}_{y.array}") for role in ("ties", "tiesum"))
        clear = cfg.add_state_after(state, f"{state.label}_ties_clear")
        for temp in (count, total):
            zero_subset(clear, clear.add_access(temp), y.subset)
        tally = cfg.add_state_after(clear, f"{state.label}_ties")
        tx, ty = ctx.tangents[x.array], ctx.tangents[y.array]
        tally.add_mapped_tasklet(
            f"ties_{y.array}", ranges,
            {"__x": dace.Memlet(f"{x.array}[{xi}]"), "__tx": dace.Memlet(f"{tx}[{xi}]"),
             "__y": dace.Memlet(f"{y.array}[{yo}]")},
            "__c = 1.0 if __x == __y else 0.0\n__t = __tx if __x == __y else 0.0",
            {"__c": dace.Memlet(f"{count}[{yo}]", wcr=SUM), "__t": dace.Memlet(f"{total}[{yo}]", wcr=SUM)},
            external_edges=True)
        mean = cfg.add_state_after(tally, f"{state.label}_ties_mean")
        ranges, _, element = subset_elements(y.subset, "__o")
        mean.add_mapped_tasklet(
            f"ties_mean_{y.array}", ranges,
            {"__c": dace.Memlet(f"{count}[{element}]"), "__t": dace.Memlet(f"{total}[{element}]")},
            "__o = __t / __c", {"__o": dace.Memlet(f"{ty}[{element}]")}, external_edges=True)


def _is_product(node) -> bool:
    return reduction_type(node.wcr) == dtypes.ReductionType.Product


@tangent_library_rule("Reduce", applies=_is_product, name="ProductTangent")
class Product:
    """d prod(x) = sum_i t_i prod_{j != i} x_j, exact where factors are zero: per output, the product of the
    nonzero factors `p`, their number of zeros `z`, `sum t_i / x_i` over the nonzero factors and `sum t_i`
    over the zero ones; the tangent is `p * sum(t/x)` with no zero, `p * t_zero` with one, 0 with more. In
    three states after the node's (clear, tally, combine)."""

    def tangent(self, site: OpSite, node: nd.LibraryNode, ctx: TangentContext) -> None:
        operands = _reduction_operands(site, node, ctx)
        if operands is None:
            return
        x, y, ranges, xi, yo = operands
        state = site.state
        sdfg, cfg = state.sdfg, state.parent_graph
        temps = {role: _like(sdfg, y.array, f"gradflow_prod_{role}_{y.array}") for role in ("p", "z", "r", "t")}
        clear = cfg.add_state_after(state, f"{state.label}_prod_clear")
        ranges_y, _, element = subset_elements(y.subset, "__o")
        clear.add_mapped_tasklet(
            f"prod_clear_{y.array}", ranges_y, {}, "__p = 1.0\n__z = 0.0\n__r = 0.0\n__t = 0.0",
            {f"__{k}": dace.Memlet(f"{v}[{element}]") for k, v in temps.items()}, external_edges=True)
        tally = cfg.add_state_after(clear, f"{state.label}_prod_tally")
        tx, ty = ctx.tangents[x.array], ctx.tangents[y.array]
        code = ("__zero = __x == 0.0\n__p = 1.0 if __zero else __x\n__z = 1.0 if __zero else 0.0\n"
                "__r = 0.0 if __zero else __tx / __x\n__t = __tx if __zero else 0.0")
        reads = {"__x": dace.Memlet(f"{x.array}[{xi}]"), "__tx": dace.Memlet(f"{tx}[{xi}]")}
        tally.add_mapped_tasklet(
            f"prod_tally_{y.array}", ranges, reads, code, {"__p": dace.Memlet(f"{temps['p']}[{yo}]", wcr=PRODUCT),
                   **{f"__{k}": dace.Memlet(f"{temps[k]}[{yo}]", wcr=SUM) for k in ("z", "r", "t")}},
            external_edges=True)
        combine = cfg.add_state_after(tally, f"{state.label}_prod_combine")
        combine.add_mapped_tasklet(
            f"prod_combine_{y.array}", ranges_y, {f"__{k}": dace.Memlet(f"{v}[{element}]") for k, v in temps.items()},
            "__o = __p * __r if __z == 0.0 else (__p * __t if __z == 1.0 else 0.0)",
            {"__o": dace.Memlet(f"{ty}[{element}]")}, external_edges=True)
