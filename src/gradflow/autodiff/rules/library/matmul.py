"""Matrix products: `MatMul` (what `@`, `np.dot` and `np.matmul` become), `Gemm` and `Dot`.

For `C = alpha * op(A) @ op(B) + beta * C` (op: optional transpose; a Gemm with beta != 0 updates C in
place, reading it through its `_c` input or its output, and its gradient becomes beta * gC):
    g op(A) += alpha * gC @ op(B)^T        g op(B) += alpha * op(A)^T @ gC
Matrix-matrix products reverse into two `Gemm` library nodes with beta = 1 (they add into the gradient
buffers); compiled, each is one `cblas_?gemm` call (`gradflow.runtime.blas`). Matrix-vector products
reverse into a `MatMul` (a `gemv`) into a temporary plus an addition, and a rank-1 map for the matrix;
vector-vector products into two scaled additions. Batched products (3-D and more, with broadcast batch
dimensions) reverse into two batched products (`MatMul` nodes, a loop of gemm calls once compiled) against
operands whose last two dimensions are swapped, summed over the broadcast dimensions.
"""

from __future__ import annotations

import dace
from dace.libraries.blas import Dot, Gemm, MatMul

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import SUM, add_element_tasklet
from gradflow.autodiff.rules import library_rule
from gradflow.autodiff.rules.library._common import (
    Operand, accumulate, accumulates, clear, element, node_of, operands, ranges_over, transient, where,
)
from gradflow.core.errors import NotDifferentiableError


def _shape_kind(a: Operand, b: Operand, c: Operand) -> str | None:
    dims = (a.dims, b.dims, c.dims)
    kind = {(2, 2, 2): "mm", (2, 1, 1): "mv", (1, 2, 1): "vm", (1, 1, 1): "vv"}.get(dims)
    if kind is None and min(a.dims, b.dims) >= 2 and c.dims == max(a.dims, b.dims) and c.dims >= 3:
        kind = "batched"
    return kind


def _alpha(node):
    """The node's alpha as the node holds it (a number): DaCe's expansions of the Gemm nodes emitted here
    compare it with numbers, which a string would break (`sdfg.compile()` of the result)."""
    return getattr(node, "alpha", 1)  # Dot has no alpha


def _product_operands(site: OpSite):
    node = node_of(site)
    ins, outs = operands(site)
    if isinstance(node, Dot):
        return node, ins["_x"], ins["_y"], outs["_result"]
    return node, ins["_a"], ins["_b"], outs["_c"]


def _check(site: OpSite, a: Operand, b: Operand, c: Operand) -> str:
    node = node_of(site)
    kind = _shape_kind(a, b, c)
    if kind is None:
        raise NotDifferentiableError(
            f"{where(site)}: operands of {a.dims}, {b.dims} and {c.dims} dimensions; only matrix and vector "
            "products have an op-level rule")
    if c.array in (a.array, b.array):
        raise NotDifferentiableError(f"{where(site)}: the product overwrites its own operand '{c.array}'",
                                     "write the result to a new array")
    ins, _ = operands(site)
    if "_c" in ins and (ins["_c"].array != c.array or ins["_c"].subset != c.subset):
        raise NotDifferentiableError(
            f"{where(site)}: it reads C from {ins['_c'].array}[{ins['_c'].subset}] and writes "
            f"{c.array}[{c.subset}]; DaCe passes one pointer for the connector `_c`, so such a node computes "
            "alpha * A @ B only (its expansions ignore C_in)",
            "update C in place (C = alpha * A @ B + beta * C), or add beta * C_in with a separate operation")
    if kind == "batched" and (getattr(node, "transA", False) or getattr(node, "transB", False)):
        raise NotDifferentiableError(f"{where(site)}: a batched product with transposed operands")
    if kind == "vv" and not isinstance(node, (Dot, MatMul)):
        raise NotDifferentiableError(f"{where(site)}: vector-vector product in a {type(node).__name__}")
    return kind


def _gemm(ctx: ReverseContext, label: str, x: tuple[str, Operand], y: tuple[str, Operand],
          out: tuple[str, Operand], trans_x: bool, trans_y: bool, alpha) -> None:
    """out += alpha * op(x) @ op(y), as one Gemm library node with beta = 1."""
    state = ctx.new_state(f"reverse_{label}")
    gemm = Gemm(f"rev_{label}", transA=trans_x, transB=trans_y, alpha=alpha, beta=1, cin=False)
    state.add_node(gemm)
    reads = {}
    for conn, (array, op) in (("_a", x), ("_b", y)):
        node = reads.setdefault(array, state.add_read(array))
        state.add_edge(node, None, gemm, conn, op.memlet(array))
    array, op = out
    state.add_edge(gemm, "_c", state.add_write(array), None, op.memlet(array))


@library_rule("MatMul", "Gemm", "Dot")
class ProductReverse:
    """Reverse of a matrix or vector product (MatMul, Gemm, Dot)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        _, a, b, c = _product_operands(site)
        if ctx.grad_of(c.array) is None:
            return frozenset()
        need = set()
        if ctx.grad_of(a.array):
            need.add(b.array)
        if ctx.grad_of(b.array):
            need.add(a.array)
        return frozenset(need)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node, a, b, c = _product_operands(site)
        kind = _check(site, a, b, c)
        gc = ctx.grad_of(c.array)
        if gc is None:
            return
        label = f"{site.state.label}_{node.label}"
        alpha = _alpha(node)
        ta, tb = bool(getattr(node, "transA", False)), bool(getattr(node, "transB", False))
        va, vb = ctx.value_of(site.index, a.array), ctx.value_of(site.index, b.array)
        ga, gb = ctx.grad_of(a.array), ctx.grad_of(b.array)
        gC = (gc, c)
        if kind == "mm":
            if ga:
                if not ta:  # gA += alpha gC op(B)^T
                    _gemm(ctx, f"{label}_ga", gC, (vb, b), (ga, a), False, not tb, alpha)
                else:  # A^T was used: gA += alpha op(B) gC^T
                    _gemm(ctx, f"{label}_ga", (vb, b), gC, (ga, a), tb, True, alpha)
            if gb:
                if not tb:  # gB += alpha op(A)^T gC
                    _gemm(ctx, f"{label}_gb", (va, a), gC, (gb, b), not ta, False, alpha)
                else:  # B^T was used: gB += alpha gC^T op(A)
                    _gemm(ctx, f"{label}_gb", gC, (va, a), (gb, b), True, ta, alpha)
        elif kind == "mv":
            self._matvec(ctx, label, site, (a, va, ga, ta), (b, vb, gb), c, alpha, matrix_first=True)
        elif kind == "vm":
            # SpecializeMatMul: y = op'(B) x with op' = B^T unless transB
            self._matvec(ctx, label, site, (b, vb, gb, not tb), (a, va, ga), c, alpha, matrix_first=False)
        elif kind == "batched":
            self._batched(ctx, label, (a, va, ga), (b, vb, gb), c, alpha)
        else:
            self._dot(ctx, label, (a, va, ga), (b, vb, gb), c, alpha)
        self._finish(site, ctx, c, label)

    @staticmethod
    def _finish(site: OpSite, ctx: ReverseContext, c: Operand, label: str) -> None:
        node = node_of(site)
        if accumulates(c, site):
            return
        beta = getattr(node, "beta", 0)
        if beta == 0:
            clear(ctx, c, label)
            return
        ranges, params = ranges_over(c, "__k")
        index = element(c, params)
        g = ctx.grad_of(c.array)
        add_element_tasklet(ctx.new_state(f"scale_{label}"), f"scale_{c.array}", ranges or None,
                            {"__g": dace.Memlet(f"{g}[{index}]")}, f"__o = ({beta}) * __g",
                            {"__o": dace.Memlet(f"{g}[{index}]")})

    @staticmethod
    def _matvec(ctx, label, site, matrix, vector, y: Operand, alpha, matrix_first: bool) -> None:
        """y = alpha * op(M) @ v, with M given as stored and `tm` telling whether op is a transpose."""
        m, vm, gm, tm = matrix
        v, vv, gv = vector
        gy = ctx.grad_of(y.array)
        if gv:  # gv += alpha * op(M)^T gy, as a matrix-vector product into a temporary
            (rows, cols) = m.sizes()
            tmp = transient(ctx, [cols if not tm else rows], v.array, "mv")
            state = ctx.new_state(f"reverse_{label}_gv")
            mm = MatMul(f"rev_{label}_gv", transA=not tm)
            state.add_node(mm)
            state.add_edge(state.add_read(vm), None, mm, "_a", m.memlet(vm))
            state.add_edge(state.add_read(gy), None, mm, "_b", y.memlet(gy))
            state.add_edge(mm, "_c", state.add_write(tmp), None, dace.Memlet.from_array(tmp, ctx.sdfg.arrays[tmp]))
            accumulate(ctx, Operand("_t", tmp, dace.subsets.Range.from_array(ctx.sdfg.arrays[tmp])), v, f"{label}_gv",
                       alpha)
        if gm:  # gM[i, k] += alpha * gy[i] * v[k]  (transposed indices when op(M) = M^T)
            ranges, params = ranges_over(m, "__r")
            i, k = params
            yi, vk = (i, k) if not tm else (k, i)
            add_element_tasklet(
                ctx.new_state(f"reverse_{label}_gm"), f"rev_{label}_gm", ranges,
                {"__gy": dace.Memlet(f"{gy}[{element(y, [yi])}]"), "__v": dace.Memlet(f"{vv}[{element(v, [vk])}]")},
                f"__o = ({alpha}) * __gy * __v",
                {"__o": dace.Memlet(f"{gm}[{element(m, params)}]", wcr=SUM)},
            )

    @staticmethod
    def _batched(ctx, label, a, b, c: Operand, alpha) -> None:
        """C[..., m, n] = alpha * A[..., m, k] @ B[..., k, n] with broadcast batch dimensions.

        gA_full = gC @ swap(B) and gB_full = swap(A) @ gC as BatchedMatMul nodes (batched gemm) into
        temporaries of C's batch shape, then summed over the batch dimensions the operand was broadcast in.
        """
        (a, va, ga), (b, vb, gb) = a, b
        gc = ctx.grad_of(c.array)
        for (x, vx, gx), (y, vy, _), tag in (((a, va, ga), (b, vb, gb), "ga"), ((b, vb, gb), (a, va, ga), "gb")):
            if not gx:
                continue
            ysw = _swapped(ctx, y, vy, f"{label}_{tag}")
            full_shape = list(c.sizes()[:-2]) + list(x.sizes()[-2:])
            full = transient(ctx, full_shape, x.array, f"{label}_{tag}")
            state = ctx.new_state(f"reverse_{label}_{tag}")
            bmm = MatMul(f"rev_{label}_{tag}")
            state.add_node(bmm)
            lhs, rhs = ((gc, c.memlet(gc)), ysw) if tag == "ga" else (ysw, (gc, c.memlet(gc)))
            state.add_edge(state.add_read(lhs[0]), None, bmm, "_a", lhs[1])
            state.add_edge(state.add_read(rhs[0]), None, bmm, "_b", rhs[1])
            state.add_edge(bmm, "_c", state.add_write(full), None, dace.Memlet.from_array(full, ctx.sdfg.arrays[full]))
            _reduce_broadcast(ctx, full, x, f"{label}_{tag}", alpha)

    @staticmethod
    def _dot(ctx, label, x, y, r: Operand, alpha) -> None:
        """r = alpha * x . y: gx += alpha * gr * y, gy += alpha * gr * x."""
        gr = ctx.grad_of(r.array)
        for (p, vp, gp), (_q, vq, _gq), tag in ((x, y, "gx"), (y, x, "gy")):
            if not gp:
                continue
            ranges, params = ranges_over(p, "__r")
            q = _q
            add_element_tasklet(
                ctx.new_state(f"reverse_{label}_{tag}"), f"rev_{label}_{tag}", ranges,
                {"__g": dace.Memlet(f"{gr}[{element(r, [None] * r.dims)}]"),
                 "__o2": dace.Memlet(f"{vq}[{element(q, params)}]")},
                f"__o = ({alpha}) * __g * __o2",
                {"__o": dace.Memlet(f"{gp}[{element(p, params)}]", wcr=SUM)},
            )


def _swapped(ctx: ReverseContext, x: Operand, vx: str, label: str) -> tuple[str, dace.Memlet]:
    """A temporary holding `x` with its last two dimensions swapped."""
    sizes = x.sizes()
    shape = list(sizes[:-2]) + [sizes[-1], sizes[-2]]
    tmp = transient(ctx, shape, x.array, f"{label}_swap")
    ranges, params = ranges_over(x, "__s")
    out_index = ", ".join(params[:-2] + [params[-1], params[-2]])
    add_element_tasklet(ctx.new_state(f"swap_{label}"), f"swap_{label}", ranges,
                        {"__i": dace.Memlet(f"{vx}[{element(x, params)}]")}, "__o = __i",
                        {"__o": dace.Memlet(f"{tmp}[{out_index}]")})
    return tmp, dace.Memlet.from_array(tmp, ctx.sdfg.arrays[tmp])


def _reduce_broadcast(ctx: ReverseContext, full: str, x: Operand, label: str, alpha) -> None:
    """grad(x) += alpha * full, summed over the leading dimensions x lacks or has as literal 1."""
    fshape = ctx.sdfg.arrays[full].shape
    ranges = {f"__b{d}": f"0:{s}" for d, s in enumerate(fshape)}
    fparams = list(ranges)
    offset = len(fshape) - x.dims
    xparams: list[str | None] = []
    for d, size in enumerate(x.sizes()):
        broadcast = d < x.dims - 2 and str(size) == "1" and str(fshape[d + offset]) != "1"
        xparams.append(None if broadcast else fparams[d + offset])
    add_element_tasklet(ctx.new_state(f"sum_{label}"), f"sum_{label}", ranges,
                        {"__f": dace.Memlet(f"{full}[{', '.join(fparams)}]")}, f"__o = ({alpha}) * __f",
                        {"__o": dace.Memlet(f"{ctx.grad_of(x.array)}[{element(x, xparams)}]", wcr=SUM)})

