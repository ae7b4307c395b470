"""Contractions: `TensorDot` (what `np.tensordot` becomes) and DaCe's `Einsum` node (made by the `LiftEinsum`
transformation or with the SDFG API; the frontend itself specializes `np.einsum` into `Reduce`, `MatMul` or a
map, which have their own rules).

Both are an einsum: Out[o] = alpha * sum over the other letters of prod_k X_k[letters_k] (+ beta * Out_old[o]
for an `Einsum` with beta). The gradient of a contraction is a contraction: for each operand k,
    gX_k[letters_k] += alpha * gOut[o] * prod_{j != k} X_j[letters_j],
summed over the letters X_k lacks. Each is emitted as one map over all the letters adding into the gradient
(write-conflict sum): the loop nest of the node's pure expansion, so each operand's gradient costs one
forward contraction. Then gOut is cleared (the node overwrote Out), scaled by beta when the node updated it,
or kept when the node accumulates into Out.

Letters: `TensorDot` contracts dimension `left_axes[i]` of the left tensor with `right_axes[i]` of the
right one; the result's dimensions are the left tensor's free ones then the right tensor's, permuted by
`permutation` (output dimension k is result dimension `permutation[k]`); DaCe's expansions read whole
arrays, so the rule requires whole-array operands (what the frontend makes). `Einsum` reads its
`einsum_str` (explicit `->` or numpy's implicit output; no ellipsis) over the operands' subsets with their
unit dimensions dropped, the inputs ordered by connector name, as its expansion (`SpecializeEinsum`) does.
"""

from __future__ import annotations

import attrs
import dace
from dace import subsets

from gradflow.analysis.ops import constant_beta
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.autodiff.protocols import library_rule
from gradflow.autodiff.rules.library._common import Operand, element, node_of, where
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.wcr import SUM, reduction_type


@attrs.frozen
class Tensor:
    """An operand with the letter of each of its tensor dimensions (`dims`: the subset dimensions they are)."""

    operand: Operand
    letters: str
    dims: tuple[int, ...]

    def element(self, params: dict[str, str]) -> str:
        at: list[str | None] = [None] * self.operand.dims
        for d, letter in zip(self.dims, self.letters):
            at[d] = params[letter]
        return element(self.operand, at)


@attrs.frozen
class Contraction:
    inputs: tuple[Tensor, ...]
    output: Tensor
    alpha: object = 1
    beta: object = 0

    def ranges(self) -> tuple[dict[str, str], dict[str, str]]:
        """Map ranges over every letter, and the map parameter of each letter."""
        sizes: dict[str, object] = {}
        for t in (*self.inputs, self.output):
            for d, letter in zip(t.dims, t.letters):
                sizes.setdefault(letter, t.operand.sizes()[d])
        params = {letter: f"__e_{letter}" for letter in sizes}
        return {params[k]: f"0:{v}" for k, v in sizes.items()}, params


def _edges(site: OpSite):
    """(in-edges, out-edge) of the node, as operands."""
    state, node = site.state, node_of(site)
    ins = []
    for e in state.in_edges(node):
        if not e.data.is_empty():
            subset = e.data.get_src_subset(e, state) or subsets.Range.from_array(state.sdfg.arrays[e.src.data])
            ins.append(Operand(e.dst_conn, e.src.data, subset))
    outs = [Operand(e.src_conn, e.dst.data, e.data.get_dst_subset(e, state)
                    or subsets.Range.from_array(state.sdfg.arrays[e.dst.data]), e.data.wcr)
            for e in state.out_edges(node) if not e.data.is_empty()]
    if len(outs) != 1:
        raise NotDifferentiableError(f"{where(site)}: a contraction with {len(outs)} outputs")
    return ins, outs[0]


def _tensordot(site: OpSite) -> Contraction:
    node = node_of(site)
    ins, out = _edges(site)
    by_conn = {op.conn: op for op in ins}
    left, right = by_conn.get("_left_tensor"), by_conn.get("_right_tensor")
    if left is None or right is None:
        raise NotDifferentiableError(f"{where(site)}: missing a tensor operand")
    for op in (left, right, out):
        if op.subset != subsets.Range.from_array(site.state.sdfg.arrays[op.array]):
            raise NotDifferentiableError(f"{where(site)}: operand {op.array}[{op.subset}] is not a whole array, "
                                         "which DaCe's TensorDot expansions assume", "copy the slice into an array")
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lw = [next(letters) for _ in range(left.dims)]
    shared: list[str | None] = [None] * right.dims  # the letters of the contracted axes of `right`
    for la, ra in zip(node.left_axes, node.right_axes):
        shared[ra] = lw[la]
    rw = [w or next(letters) for w in shared]
    result = [w for d, w in enumerate(lw) if d not in node.left_axes]
    result += [w for d, w in enumerate(rw) if d not in node.right_axes]
    if node.permutation:
        result = [result[p] for p in node.permutation]
    if len(result) != out.dims:
        raise NotDifferentiableError(f"{where(site)}: the result has {len(result)} dimensions, its output {out.dims}")
    return Contraction((Tensor(left, "".join(lw), tuple(range(left.dims))),
                        Tensor(right, "".join(rw), tuple(range(right.dims)))),
                       Tensor(out, "".join(result), tuple(range(out.dims))))


def _einsum(site: OpSite) -> Contraction:
    node = node_of(site)
    ins, out = _edges(site)
    ins = sorted(ins, key=lambda op: op.conn)  # the operands of `einsum_str`, as DaCe's expansion orders them
    spec = node.einsum_str.replace(" ", "")
    if "." in spec:
        raise NotDifferentiableError(f"{where(site)}: an einsum with an ellipsis ('{spec}')",
                                     "write the dimensions out")
    lhs, _, rhs = spec.partition("->")
    terms = lhs.split(",")
    if "->" not in spec:  # numpy's implicit output: the letters used once, sorted
        rhs = "".join(sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1))
    if len(terms) != len(ins):
        raise NotDifferentiableError(f"{where(site)}: '{spec}' names {len(terms)} inputs, the node has {len(ins)}")
    tensors = []
    for op, letters in zip([*ins, out], [*terms, rhs]):
        dims = tuple(op.squeezed())
        if len(dims) != len(letters):
            if len(letters) == 0 and op.dims >= 1:  # a scalar result held in a one-element subset
                dims = ()
            else:
                raise NotDifferentiableError(f"{where(site)}: operand {op.array}[{op.subset}] has {len(dims)} "
                                             f"dimensions, '{letters}' names {len(letters)}")
        tensors.append(Tensor(op, letters, dims))
    return Contraction(tuple(tensors[:-1]), tensors[-1], node.alpha, node.beta)


_READERS = {"TensorDot": _tensordot, "Einsum": _einsum}


def _accumulates(out: Operand, site: OpSite) -> bool:
    if out.wcr is None:
        return False
    if reduction_type(out.wcr) == dace.dtypes.ReductionType.Sum:
        return True
    raise NotDifferentiableError(f"{where(site)}: its output '{out.array}' is written with {out.wcr}")


@library_rule("TensorDot", "Einsum")
class ContractionReverse:
    """The gradient of a contraction, as one contraction map per operand (module doc)."""

    @staticmethod
    def _read(site: OpSite, ctx: ReverseContext) -> Contraction:
        node = node_of(site)
        return ctx.memo(("contraction", site.index), lambda: _READERS[type(node).__name__](site))

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        c = self._read(site, ctx)
        if ctx.grad_of(c.output.operand.array) is None:
            return frozenset()
        need = set()
        for k, t in enumerate(c.inputs):
            if ctx.grad_of(t.operand.array):
                need |= {o.operand.array for j, o in enumerate(c.inputs) if j != k}
        return frozenset(need)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        c = self._read(site, ctx)
        out = c.output.operand
        gout = ctx.grad_of(out.array)
        if gout is None:
            return
        if any(t.operand.array == out.array for t in c.inputs):
            raise NotDifferentiableError(f"{where(site)}: the contraction overwrites its own operand '{out.array}'",
                                         "write the result to a new array")
        ranges, params = c.ranges()
        label = f"{site.state.label}_{out.array}"
        for k, t in enumerate(c.inputs):
            g = ctx.grad_of(t.operand.array)
            if not g:
                continue
            inputs = {"__g": dace.Memlet(f"{gout}[{c.output.element(params)}]")}
            factors = ["__g"]
            for j, other in enumerate(c.inputs):
                if j != k:
                    value = ctx.value_of(site.index, other.operand.array)
                    inputs[f"__x{j}"] = dace.Memlet(f"{value}[{other.element(params)}]")
                    factors.append(f"__x{j}")
            scale = "" if str(c.alpha) in ("1", "1.0") else f"({c.alpha}) * "
            add_element_tasklet(ctx.new_state(f"reverse_{label}_{k}"), f"rev_contract_{label}_{k}", ranges, inputs,
                                f"__o = {scale}{' * '.join(factors)}",
                                {"__o": dace.Memlet(f"{g}[{t.element(params)}]", wcr=SUM)})
        if _accumulates(out, site):
            return
        out_ranges = {params[w]: r for w, r in zip(c.output.letters, (ranges[params[w]] for w in c.output.letters))}
        index = c.output.element(params)
        if constant_beta(c) == 0.0:
            code, reads = "__o = 0", {}
        else:
            code, reads = f"__o = ({c.beta}) * __g", {"__g": dace.Memlet(f"{gout}[{index}]")}
        add_element_tasklet(ctx.new_state(f"clear_{label}"), f"clear_{out.array}", out_ranges or None, reads, code,
                            {"__o": dace.Memlet(f"{gout}[{index}]")})
