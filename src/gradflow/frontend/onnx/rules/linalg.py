"""Contractions. Floating MatMul and Gemm become DaCe BLAS library nodes (`Gemm`, or a `MatMul` that DaCe
specializes into Gemv, Dot or BatchedMatMul): the compiled program calls BLAS, and reverse mode keeps them
whole and differentiates them with the op-level product rule, whose backward is BLAS again. Everything
else (integer operands, empty extents, batch dims broadcast in ways BatchedMatMul does not take, Einsum)
lowers to one pattern, a map over every index of the contraction whose tasklet multiplies the operands and
accumulates into the output with a sum WCR (an init state writes zeros, or Gemm's `beta * C`). Broadcast
batch dims index 0 in the smaller operand.
"""

from __future__ import annotations

import string

import dace
import numpy as np
import sympy
from dace.libraries.blas import Gemm, MatMul

from gradflow.core.wcr import SUM
from gradflow.frontend.onnx.builder import (
    Dim, InvalidNode, Lowering, RuleUnsupported, Tensor, bcast_index, broadcast_shapes, literal_float, norm_dim, params,
    prod, row_major_index, same_extent,
)
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, onnx_rule



def contract(
    lw: Lowering,
    label: str,
    out: Tensor,
    out_index: list[str],
    ranges: list[tuple[str, Dim]],
    operands: list[tuple[Tensor, list[str]]],
    scale: str = "",
    init: tuple[str, dict] | None = None,
) -> None:
    """out[out_index] (+)= scale * prod(operand[index]) over `ranges`; `init` = (code, ins) for the init map."""
    p = params("p", out.rank)
    if init is None:
        lw.fill(label, out, "0")
    else:
        code, ins = init
        lw.map(label, list(zip(p, out.shape)), {c: (t, bcast_index(t.shape, out.shape, p)) for c, t in ins.items()},
               code, {"o": (out, p, None)})
    conns = {f"a{k}": (t, idx) for k, (t, idx) in enumerate(operands)}
    expr = " * ".join(conns) if conns else "1"
    if scale:
        expr = f"{scale} * {expr}"
    lw.map(label, ranges, conns, f"o = {expr}", {"o": (out, out_index, SUM)})


#: element types BLAS multiplies
_BLAS_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def on_blas(*tensors: Tensor, matrices: tuple | None = None) -> bool:
    """Whether a product of `tensors` can be a BLAS node: one floating type BLAS has, no extent known to be 0
    (the library nodes' expansions do not handle empty operands; the map is then empty and writes zeros),
    and no matrix extent known to be 1: the rows and columns of the matrices the node multiplies
    (`matrices`, by default the last two dims of every tensor of rank 2 or more). DaCe's expansion reads the
    layout of a matrix from its strides, and a (5, 1) matrix has strides (1, 1): it passed a leading
    dimension of 1 and OpenBLAS refused the call, leaving the output unwritten."""
    dtypes = {np.dtype(t.dtype) for t in tensors}
    if matrices is None:
        matrices = tuple(d for t in tensors if t.rank >= 2 for d in t.shape[-2:])
    return (len(dtypes) == 1 and dtypes <= set(_BLAS_TYPES)
            and not any(isinstance(d, int) and d == 0 for t in tensors for d in t.shape)
            and not any(norm_dim(d) == 1 for d in matrices))


def library_product(lw: Lowering, label: str, lib, reads: dict[str, Tensor], out: Tensor,
                     state: dace.SDFGState | None = None) -> None:
    """`lib` (a library node) reading whole tensors through the connectors of `reads`, writing `out` (`_c`)."""
    st = state or lw.state(label)
    lib.label = lw.namer("blas", label)
    st.add_node(lib)
    for conn, t in reads.items():
        st.add_edge(st.add_read(t.array), None, lib, conn, t.at(None))
    st.add_edge(lib, "_c", st.add_write(out.array), None, out.at(None))


def _batched_on_blas(a: Tensor, b: Tensor) -> bool:
    """Whether DaCe's BatchedMatMul takes these operands as they are: batch dims equal, or only one operand
    batched (the other a matrix)."""
    if a.rank < 2 or b.rank < 2:
        return False
    if a.rank == 2 or b.rank == 2:
        return True
    return a.rank == b.rank and all(norm_dim(sympy.sympify(x) - y) == 0 for x, y in zip(a.shape[:-2], b.shape[:-2]))


@onnx_rule("MatMul")
def matmul(lw: Lowering, node: Node) -> None:
    a, b = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    if a.rank == 0 or b.rank == 0:
        raise RuleUnsupported("MatMul of a scalar")
    a_batch = a.shape[:-2] if a.rank >= 2 else ()
    b_batch = b.shape[:-2] if b.rank >= 2 else ()
    batch = broadcast_shapes(a_batch, b_batch)
    bp = params("b", len(batch))
    k_dim = a.shape[-1]
    same_extent(k_dim, b.shape[-2] if b.rank >= 2 else b.shape[0], "the contracted dims of MatMul's inputs")
    shape = list(batch) + ([a.shape[-2]] if a.rank >= 2 else []) + ([b.shape[-1]] if b.rank >= 2 else [])
    out = lw.output(node.outputs[0], shape, a.dtype)
    # B the transpose of a matrix W (a Linear layer's `x @ W.T`): the product reads W with its transposed
    # flag, and reverse mode writes W's gradient directly, not through a transposed copy each way
    source = lw.transposes.get(node.inputs[1]) if b.rank == 2 else None
    w = lw.get(source) if source is not None else None
    if a.rank >= 3 and b.rank == 2 and on_blas(a, b, out, matrices=(prod(list(a.shape[:-1])), k_dim, b.shape[-1])):
        _rows_times_matrix(lw, node, a, b if w is None else w, out, transposed=w is not None)
        return
    if on_blas(a, b, out) and (max(a.rank, b.rank) <= 2 or _batched_on_blas(a, b)):
        if a.rank == 2 and b.rank == 2:
            lib = Gemm("gemm", alpha=1, beta=0, cin=False, transB=w is not None)
            b = b if w is None else w
        else:
            lib = MatMul("matmul")
        library_product(lw, node.label, lib, {"_a": a, "_b": b}, out)
        return
    ranges = list(zip(bp, batch))
    a_idx = bcast_index(a_batch, batch, bp)
    b_idx = bcast_index(b_batch, batch, bp)
    out_idx = list(bp)
    if a.rank >= 2:
        ranges.append(("i", a.shape[-2]))
        a_idx.append("i")
        out_idx.append("i")
    if b.rank >= 2:
        ranges.append(("j", b.shape[-1]))
        out_idx.append("j")
    ranges.append(("k", k_dim))
    a_idx.append("k")
    b_idx += ["k", "j"] if b.rank >= 2 else ["k"]
    contract(lw, node.label, out, out_idx, ranges, [(a, a_idx), (b, b_idx)])


def _rows_times_matrix(lw: Lowering, node: Node, a: Tensor, b: Tensor, out: Tensor, transposed: bool = False) -> None:
    """A[..., m, k] @ B[k, n] (a Linear layer on a batch of sequences; with `transposed`, `b` is B's
    transpose): every row of A times B, as one Gemm over A's rows gathered into a matrix (a copy in, a copy
    out), not a batched product of small matrices.
    Reverse mode then makes B's gradient one Gemm over all rows; the batched form made one product per
    batch item and summed them with a map (transformer layer: 0.15 ms of its 1 ms backward per Linear)."""
    rows = prod(list(a.shape[:-1]))
    p = params("p", a.rank)
    fa = lw.temp([rows, a.shape[-1]], a.dtype, "rows")
    lw.map(node.label, list(zip(p, a.shape)), {"x": (a, p)}, "o = x",
           {"o": (fa, [row_major_index(p[:-1], list(a.shape[:-1])), p[-1]], None)})
    fc = lw.temp([rows, b.shape[0] if transposed else b.shape[-1]], a.dtype, "rows_product")
    library_product(lw, node.label, Gemm("gemm", alpha=1, beta=0, cin=False, transB=transposed), {"_a": fa, "_b": b},
                    fc)
    q = params("q", out.rank)
    lw.map(node.label, list(zip(q, out.shape)), {"x": (fc, [row_major_index(q[:-1], list(out.shape[:-1])), q[-1]])},
           "o = x", {"o": (out, q, None)})


@onnx_rule("Gemm", opsets=(7, LATEST_OPSET))  # Gemm-1/6 broadcast C by a `broadcast` attribute
def gemm(lw: Lowering, node: Node) -> None:
    a, b = lw.get(node.inputs[0]), lw.get(node.inputs[1])
    ta, tb = node.attr("transA", 0), node.attr("transB", 0)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if a.rank != 2 or b.rank != 2:
        raise InvalidNode(f"Gemm multiplies matrices; the inputs have ranks {a.rank} and {b.rank}")
    m, k = (a.shape[1], a.shape[0]) if ta else (a.shape[0], a.shape[1])
    n = b.shape[0] if tb else b.shape[1]
    same_extent(k, b.shape[1] if tb else b.shape[0], "the contracted dims of Gemm's inputs")
    out = lw.output(node.outputs[0], [m, n], a.dtype)
    has_c = bool(node.input(2)) and beta != 0.0
    if on_blas(a, b, out) and (not has_c or on_blas(lw.get(node.input(2)), out)):
        lib = Gemm("gemm", alpha=alpha, beta=0, cin=False, transA=bool(ta), transB=bool(tb))
        if not has_c:
            library_product(lw, node.label, lib, {"_a": a, "_b": b}, out)
            return
        # the product into a temporary, then out = product + beta * C (broadcast) in one map: a Gemm that
        # updates C in place gets no BLAS expansion from DaCe (see `runtime.blas`)
        prod_ = lw.temp([m, n], out.dtype, "gemm")
        library_product(lw, node.label, lib, {"_a": a, "_b": b}, prod_)
        c = lw.get(node.input(2))
        p = params("p", 2)
        scaled = f"{literal_float(beta)} * c" if beta != 1.0 else "c"
        lw.map(node.label, list(zip(p, out.shape)), {"ab": (prod_, p), "c": (c, bcast_index(c.shape, out.shape, p))},
               f"o = ab + {scaled}", {"o": (out, p, None)})
        return
    init = None
    if node.input(2) and beta != 0.0:
        init = (f"o = {literal_float(beta)} * c" if beta != 1.0 else "o = c", {"c": lw.get(node.input(2))})
    contract(
        lw, node.label, out, ["i", "j"], [("i", m), ("j", n), ("k", k)],
        [(a, ["k", "i"] if ta else ["i", "k"]), (b, ["j", "k"] if tb else ["k", "j"])],
        scale=literal_float(alpha) if alpha != 1.0 else "", init=init,
    )


@onnx_rule("Einsum")
def einsum(lw: Lowering, node: Node) -> None:
    ops = [lw.get(n) for n in node.inputs if n]
    eq = str(node.attr("equation")).replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    # the equation's grammar was checked with the node's attributes (`spec.Equation`)
    if len(terms) != len(ops):
        raise InvalidNode(f"equation {eq!r} has {len(terms)} input terms for {len(ops)} inputs")
    free = [c for c in string.ascii_letters if c not in eq]
    ell_rank = max((t.rank - (len(term) - 3) for term, t in zip(terms, ops) if "..." in term), default=0)
    ell = free[:ell_rank]
    dims: dict[str, Dim] = {}
    op_letters: list[list[str]] = []
    ell_shapes = []
    for term, t in zip(terms, ops):
        if "..." in term:
            pre, post = term.split("...")
            n_ell = t.rank - len(pre) - len(post)
            letters = list(pre) + ell[ell_rank - n_ell:] + list(post)
            ell_shapes.append(t.shape[len(pre): len(pre) + n_ell])
        else:
            letters = list(term)
        if len(letters) != t.rank:
            raise InvalidNode(f"term {term!r} does not match an input of rank {t.rank}")
        op_letters.append(letters)
    ell_dims = broadcast_shapes(*ell_shapes) if ell_shapes else ()
    for letter, d in zip(ell, ell_dims):
        dims[letter] = d
    for letters, t in zip(op_letters, ops):
        for c, d in zip(letters, t.shape):
            if c in ell:
                continue
            if c in dims and d != 1 and dims[c] != 1 and norm_dim(sympy.sympify(d) - dims[c]) != 0:
                bad = InvalidNode if isinstance(norm_dim(sympy.sympify(d) - dims[c]), int) else RuleUnsupported
                raise bad(f"label {c!r} has extents {dims[c]} and {d} in equation {eq!r}")
            if c not in dims or dims[c] == 1:
                dims[c] = d
    if "->" in eq:
        out_letters = list(rhs.replace("...", "".join(ell))) if "..." in rhs else list(rhs)
    else:
        counts = {c: sum(l.count(c) for l in op_letters) for c in dims}
        out_letters = ell + sorted(c for c in dims if c not in ell and counts[c] == 1)
    pname = {c: f"e{k}" for k, c in enumerate(dims)}
    out = lw.output(node.outputs[0], [dims[c] for c in out_letters], ops[0].dtype)
    operands = []
    for letters, t in zip(op_letters, ops):
        idx = ["0" if (d == 1 and dims[c] != 1) else pname[c] for c, d in zip(letters, t.shape)]
        operands.append((t, idx))
    contract(lw, node.label, out, [pname[c] for c in out_letters], [(pname[c], dims[c]) for c in dims], operands)
