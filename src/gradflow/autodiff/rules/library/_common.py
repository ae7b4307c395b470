"""What the library-node rules share: reading a node's operands, and the small maps they emit."""

from __future__ import annotations

import copy
from typing import Sequence, overload

import attrs
import dace
import sympy
from dace import subsets

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.core.errors import NotDifferentiableError


@attrs.frozen
class Operand:
    """One edge of a library node: its connector, the outer array and the subset of it the edge moves."""

    conn: str
    array: str
    subset: subsets.Range
    wcr: str | None = None

    @property
    def dims(self) -> int:
        return len(self.subset)

    def sizes(self) -> list:
        return list(self.subset.size())

    def squeezed(self) -> list[int]:
        """The dimensions whose extent is not literally 1 (DaCe's `Range.squeeze` convention)."""
        return [d for d, s in enumerate(self.subset.size()) if not (sympy.sympify(s) == 1)]

    def memlet(self, array: str | None = None) -> dace.Memlet:
        return dace.Memlet(data=array or self.array, subset=copy.deepcopy(self.subset))


def disjoint(a: subsets.Range, b: subsets.Range) -> bool:
    """True only when the two subsets provably share no element. Both are parsed anew from text, so their
    symbols carry DaCe's default assumptions (frontends make loop variables without them, and then
    `x[0:i]` and `x[i]` cannot be told apart)."""
    try:
        return subsets.Range.from_string(str(a)).intersects(subsets.Range.from_string(str(b))) is False
    except TypeError:  # a symbolic comparison DaCe cannot decide
        return False


def node_of(site: OpSite):
    return site.members()[0]


def operands(site: OpSite) -> tuple[dict[str, Operand], dict[str, Operand]]:
    """(inputs, outputs) of the site's library node, by connector."""
    state = site.state
    node = node_of(site)
    ins, outs = {}, {}
    for e in state.in_edges(node):
        if e.data.is_empty():
            continue
        subset = e.data.get_src_subset(e, state) or subsets.Range.from_array(state.sdfg.arrays[e.src.data])
        ins[e.dst_conn] = Operand(e.dst_conn, e.src.data, subset)
    for e in state.out_edges(node):
        if e.data.is_empty():
            continue
        subset = e.data.get_dst_subset(e, state) or subsets.Range.from_array(state.sdfg.arrays[e.dst.data])
        outs[e.src_conn] = Operand(e.src_conn, e.dst.data, subset, e.data.wcr)
    return ins, outs


def node_operands(state, node) -> tuple[dict[str, Operand], dict[str, Operand]]:
    """`operands` for a node given directly (for `applies` predicates, which see no site)."""
    ins, outs = {}, {}
    for e in state.in_edges(node):
        if not e.data.is_empty():
            ins[e.dst_conn] = Operand(e.dst_conn, e.src.data, e.data.get_src_subset(e, state)
                                      or subsets.Range.from_array(state.sdfg.arrays[e.src.data]))
    for e in state.out_edges(node):
        if not e.data.is_empty():
            outs[e.src_conn] = Operand(e.src_conn, e.dst.data, e.data.get_dst_subset(e, state)
                                       or subsets.Range.from_array(state.sdfg.arrays[e.dst.data]), e.data.wcr)
    return ins, outs


def where(site: OpSite) -> str:
    node = node_of(site)
    return f"{type(node).__name__} '{node}' in state '{site.state.label}'"


def accumulates(out: Operand, site: OpSite) -> bool:
    """True when the node adds into its output (write-conflict sum) rather than overwriting it."""
    if out.wcr is None:
        return False
    from gradflow.core.wcr import reduction_type

    if reduction_type(out.wcr) == dace.dtypes.ReductionType.Sum:
        return True
    raise NotDifferentiableError(f"{where(site)}: its output '{out.array}' is written with {out.wcr}; only sums "
                                 "are differentiated")


def element(op: Operand, params: Sequence[str | None]) -> str:
    """The element of `op.subset` at `params` (one per dimension; None: the dimension's first index)."""
    index = []
    for (begin, _end, step), p in zip(op.subset, params):
        index.append(str(begin) if p is None else f"({begin}) + ({step}) * {p}")
    return ", ".join(index)


@overload
def ranges_over(op: Operand, prefix: str, dims: None = None) -> tuple[dict[str, str], list[str]]: ...


@overload
def ranges_over(op: Operand, prefix: str, dims: Sequence[int]) -> tuple[dict[str, str], list[str | None]]: ...


def ranges_over(op: Operand, prefix: str,
                dims: Sequence[int] | None = None) -> tuple[dict[str, str], list[str] | list[str | None]]:
    """Map ranges over `op.subset` (the given dims, default all) and the per-dimension parameter list
    (None for a dimension not in `dims`)."""
    dims = range(op.dims) if dims is None else dims
    params: list[str | None] = [None] * op.dims
    ranges: dict[str, str] = {}
    for d in dims:
        param = f"{prefix}{d}"
        params[d] = param
        ranges[param] = f"0:{op.sizes()[d]}"
    return ranges, params


def clear(ctx: ReverseContext, op: Operand, label: str) -> None:
    """gradient of `op.array` on `op.subset` = 0 (the forward value there was overwritten)."""
    grad = ctx.grad_of(op.array)
    ranges, params = ranges_over(op, "__k")
    add_element_tasklet(ctx.new_state(f"clear_{label}"), f"clear_{op.array}", ranges or None, {}, "__o = 0",
                        {"__o": dace.Memlet(f"{grad}[{element(op, params)}]")})


def bilinear_needs(ctx: ReverseContext, x: Operand, y: Operand, out: Operand) -> frozenset[str]:
    """What the reverse of `out = f(x, y)`, linear in each factor (a product, a convolution), reads: each
    factor whose gradient is wanted needs the other's value; nothing when `out` has no gradient."""
    if ctx.grad_of(out.array) is None:
        return frozenset()
    need = set()
    if ctx.grad_of(x.array):
        need.add(y.array)
    if ctx.grad_of(y.array):
        need.add(x.array)
    return frozenset(need)


def transient(ctx: ReverseContext, shape, like: str, label: str) -> str:
    """A new backward-only transient of `like`'s dtype."""
    desc = ctx.sdfg.arrays[like]
    name, _ = ctx.sdfg.add_array(f"gradflow_t_{label}", list(shape), desc.dtype, transient=True, find_new_name=True)
    return name
