"""How DaCe's product nodes read their operands, so that a rule differentiates exactly the product DaCe
computes.

An operand edge moves a subset of some array; the product sees it as a vector or a matrix (a *factor*)
laid over some of the subset's dimensions. DaCe squeezes the extent-1 dimensions of a subset
(`Range.squeeze`): `A[0:N, j]` is a vector, `A[i, 0:j]` a row vector, `A[r, 0:M, 0:K]` a matrix, `x[i]`
one element. `Gemm` (what `MatMul` of two matrices becomes) keeps a subset that already has two
dimensions as it is (`blas_helpers.matrix_view`), so `A[0:N, k:k+1]` is an N x 1 matrix there.
`product_of` mirrors `SpecializeMatMul` (which of Gemm, Gemv, Dot or BatchedMatMul a `MatMul` becomes) and
the views of those nodes, and states each product as an einsum over the factors' logical indices.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import dace
import sympy
from dace.libraries.blas import Dot, Gemm, Gemv, MatMul

from gradflow.autodiff.rules.library._common import Operand

#: A one-element vector with no dimension of its subset left (all extents are 1): DaCe squeezes it to
#: the range (0, 0, 1), a vector of length one.
VIRTUAL = None


def _unit(size) -> bool:
    return sympy.sympify(size) == 1


def squeezed_dims(op: Operand) -> tuple[int | None, ...]:
    """The dimensions `Range.squeeze` keeps (a literal extent other than 1), or `(VIRTUAL,)` if none."""
    dims = tuple(d for d, s in enumerate(op.subset.size()) if not _unit(s))
    return dims or (VIRTUAL,)


def matrix_dims(op: Operand) -> tuple[int | None, ...]:
    """`blas_helpers.matrix_view`: a two-dimensional subset as it is, any other squeezed."""
    return (0, 1) if op.dims == 2 else squeezed_dims(op)


@attrs.frozen
class Factor:
    """An operand as a product sees it: `op` (array and subset) indexed over `dims` of its subset, in
    order (`VIRTUAL` for a length-one vector); `dims == ()` is one element (the result of a dot product)."""

    op: Operand
    dims: tuple[int | None, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def sizes(self) -> list:
        full = self.op.subset.size()
        return [1 if d is VIRTUAL else full[d] for d in self.dims]

    def index(self, params: Sequence[str]) -> str:
        """The element of `op.subset` at logical index `params` (one per entry of `dims`)."""
        at = dict(zip(self.dims, params))
        out = []
        for d, (begin, _end, step) in enumerate(self.op.subset):
            out.append(f"({begin}) + ({step}) * {at[d]}" if d in at else str(begin))
        return ", ".join(out)

    def strided(self) -> bool:
        """True when a dimension the product indexes has a step other than 1 (`A[0:N:2, :]`)."""
        steps = [self.op.subset[d][2] for d in self.dims if d is not VIRTUAL]
        return any(not (sympy.sympify(s) == 1) for s in steps)


@attrs.frozen
class Product:
    """`out[oi] = alpha * Σ x[xi] * y[yi]`, an einsum summed over the letters `oi` lacks; `kind` names the
    DaCe node that computes it ("gemm", "gemv", "dot" or "batched")."""

    kind: str
    x: Factor
    xi: str
    y: Factor
    yi: str
    out: Factor
    oi: str


def _gemm(a: Operand, b: Operand, c: Operand, ta: bool, tb: bool) -> Product:
    fa, fb, fc = Factor(a, matrix_dims(a)), Factor(b, matrix_dims(b)), Factor(c, matrix_dims(c))
    return Product("gemm", fa, "ki" if ta else "ik", fb, "jk" if tb else "kj", fc, "ij")


def _gemv(m: Operand, v: Operand, y: Operand, trans: bool) -> Product | None:
    fm, fv, fy = Factor(m, squeezed_dims(m)), Factor(v, squeezed_dims(v)), Factor(y, squeezed_dims(y))
    if (fm.rank, fv.rank, fy.rank) != (2, 1, 1):
        return None
    return Product("gemv", fm, "ki" if trans else "ik", fv, "k", fy, "i")


def _dot(x: Operand, y: Operand, r: Operand) -> Product | None:
    fx, fy = Factor(x, squeezed_dims(x)), Factor(y, squeezed_dims(y))
    if fx.rank != 1 or fy.rank != 1 or not all(_unit(s) for s in r.subset.size()):
        return None
    return Product("dot", fx, "k", fy, "k", Factor(r, ()), "")


def product_of(node, a: Operand, b: Operand, c: Operand) -> Product | None:
    """The product `node` computes from operands `a`, `b` into `c` (`Dot`: `_x`, `_y`, `_result`;
    `Gemv`: `_A`, `_x`, `_y`), or None where DaCe's own nodes would not compute one."""
    if isinstance(node, Dot):
        return _dot(a, b, c)
    if isinstance(node, Gemv):
        return _gemv(a, b, c, bool(node.transA))
    ta, tb = bool(getattr(node, "transA", False)), bool(getattr(node, "transB", False))
    if isinstance(node, Gemm):
        product = _gemm(a, b, c, ta, tb)
        return product if (product.x.rank, product.y.rank, product.out.rank) == (2, 2, 2) else None
    if not isinstance(node, MatMul):
        return None
    # SpecializeMatMul's choice, on squeezed ranks (sa, sb, sc) and raw ranks (a.dims, b.dims)
    sa, sb, sc = (len(squeezed_dims(op)) for op in (a, b, c))
    batched = sa >= 3 or sb >= 3 or (sc >= 3 and (a.dims >= 3 or b.dims >= 3))
    if sc == 2 and ((sa == 2 and sb == 2) or (a.dims == 2 and b.dims == 2)):
        return _gemm(a, b, c, ta, tb)
    if batched and sa >= 2 and sb >= 2:
        return _batched(a, b, c)
    if (sa, sb) == (2, 1):
        return _gemv(a, b, c, ta)
    if (sa, sb) == (1, 2):  # x @ B: a Gemv of B, transposed unless transB
        return _gemv(b, a, c, not tb)
    if (sa, sb) == (1, 1):
        return _dot(a, b, c)
    return None


def _batched(a: Operand, b: Operand, c: Operand) -> Product:
    """A batched product over the raw dimensions (the last two are the matrices; batch dimensions are
    aligned from the right and broadcast where an operand lacks them or has extent 1)."""
    letters = "abcdefgh"
    nb = c.dims - 2

    def batch(op: Operand) -> str:
        return letters[nb - (op.dims - 2):nb]

    fa, fb, fc = (Factor(op, tuple(range(op.dims))) for op in (a, b, c))
    return Product("batched", fa, batch(a) + "ik", fb, batch(b) + "kj", fc, letters[:nb] + "ij")


def layout_issue(product: Product, sdfg: dace.SDFG) -> str | None:
    """Why DaCe's expansion of the forward node would not compute `product`, or None.

    DaCe's BLAS and pure expansions of these nodes address an operand by its first element and the
    array's strides, ignoring the step of the subset, and the batched ones assume every operand of three
    or more dimensions is one contiguous block."""
    for factor in (product.x, product.y, product.out):
        op = factor.op
        if isinstance(sdfg.arrays[op.array], dace.data.View):
            return f"'{op.array}' is a view that remove_views could not remove"
        if factor.strided():
            return f"{op.array}[{op.subset}] has a step other than 1, which DaCe's product expansions ignore"
    if product.kind == "batched":
        for factor in (product.x, product.y, product.out):
            op = factor.op
            sizes = op.sizes()
            if op.dims >= 3 and not op.subset.is_contiguous_subset(sdfg.arrays[op.array]):
                return (f"{op.array}[{op.subset}] is not one contiguous block, which DaCe's batched product "
                        "assumes")
            units = [d for d, s in enumerate(sizes) if _unit(s)]
            if units and (units != list(range(len(units))) or len(units) > op.dims - 2 or op is product.out.op):
                return (f"{op.array}[{op.subset}] has extent-1 dimensions that are not leading batch dimensions; "
                        "DaCe's batched product squeezes them")
    return None
