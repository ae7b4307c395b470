"""Emitting `out[o] += alpha * Σ x[i] * y[j]` (an einsum of two factors, summed over the letters `o` lacks)
for the backward of products: one BLAS library node where the layout allows, else one map.

- matrix = matrix @ matrix: a `Gemm` node with beta = 1 (`cblas_?gemm` once compiled);
- vector = matrix @ vector: a `Gemv` node with beta = 1 (`cblas_?gemv`);
- anything else (a rank-1 update `gA[i, k] += gy[i] * x[k]`, a scaled vector `gx[k] += g * y[k]`), and
  the two above where BLAS cannot address an operand: a map over every letter whose tasklet adds
  `alpha * x * y` into `out` (write-conflict sum).
DaCe's BLAS nodes address an operand by its first element and the strides of its array, and view the
subset as `Gemm`/`Gemv` do (`_factors`); they are used only when every factor is laid out the way that
view reads it (step 1, an array with packed C or Fortran strides, a matrix contiguous in one dimension).
A rank-1 update or a scaled vector has no reduction (each output element is one product): it stays a map,
memory-bound as the BLAS call (`?ger`, `?axpy`) would be.
"""

from __future__ import annotations

import attrs
import dace
import sympy
from dace.libraries.blas import Gemm, Gemv

from gradflow.autodiff.context import ReverseContext
from gradflow.autodiff.emit import add_element_tasklet
from gradflow.autodiff.rules.library._factors import (
    VIRTUAL,
    Factor,
    matrix_dims,
    squeezed_dims,
)
from gradflow.core.wcr import SUM


@attrs.frozen
class Term:
    """A factor of a contraction: the array holding it (a forward value, a gradient buffer), how it is
    laid over that array's subset, and its einsum letters."""

    array: str
    factor: Factor
    letters: str

    def memlet(self) -> dace.Memlet:
        return self.factor.op.memlet(self.array)

    def at(self, params: dict[str, str]) -> str:
        return f"{self.array}[{self.factor.index([params[c] for c in self.letters])}]"


def _one(x) -> bool:
    return sympy.sympify(x) == 1


def _blas_layout(ctx: ReverseContext, term: Term, view) -> bool:
    """Can a BLAS node whose view of the subset is `view` read `term` as the factor it is?"""
    factor = term.factor
    if factor.dims != view(factor.op) or VIRTUAL in factor.dims or factor.strided():
        return False
    desc = ctx.sdfg.arrays[term.array]
    if type(desc) is not dace.data.Array or not (desc.is_packed_c_strides() or desc.is_packed_fortran_strides()):
        return False
    return factor.rank == 1 or any(_one(desc.strides[d]) for d in factor.dims)


def contract(ctx: ReverseContext, label: str, out: Term, x: Term, y: Term, alpha) -> None:
    """out += alpha * einsum(x, y) (module docstring)."""
    summed = sorted(set(x.letters + y.letters) - set(out.letters))
    if len(summed) == 1 and _as_gemm(ctx, label, out, x, y, summed[0], alpha):
        return
    if len(summed) == 1 and _as_gemv(ctx, label, out, x, y, summed[0], alpha):
        return
    _as_map(ctx, label, out, x, y, alpha)


def _as_gemm(ctx, label, out: Term, x: Term, y: Term, s: str, alpha) -> bool:
    if not (len(out.letters) == len(x.letters) == len(y.letters) == 2):
        return False
    left, right = (x, y) if out.letters[0] in x.letters else (y, x)
    if set(left.letters) != {out.letters[0], s} or set(right.letters) != {s, out.letters[1]}:
        return False
    if not all(_blas_layout(ctx, t, matrix_dims) for t in (out, left, right)):
        return False
    state = ctx.new_state(f"reverse_{label}")
    gemm = Gemm(f"rev_{label}", transA=left.letters != out.letters[0] + s, transB=right.letters != s + out.letters[1],
                alpha=alpha, beta=1, cin=False)
    state.add_node(gemm)
    reads: dict[str, dace.nodes.AccessNode] = {}
    for conn, term in (("_a", left), ("_b", right)):
        node = reads.setdefault(term.array, state.add_read(term.array))
        state.add_edge(node, None, gemm, conn, term.memlet())
    state.add_edge(gemm, "_c", state.add_write(out.array), None, out.memlet())
    return True


def _as_gemv(ctx, label, out: Term, x: Term, y: Term, s: str, alpha) -> bool:
    if len(out.letters) != 1:
        return False
    matrix, vector = (x, y) if len(x.letters) == 2 else (y, x)
    if len(matrix.letters) != 2 or vector.letters != s or set(matrix.letters) != {out.letters, s}:
        return False
    if not (_blas_layout(ctx, matrix, squeezed_dims) and _blas_layout(ctx, vector, squeezed_dims)
            and _blas_layout(ctx, out, squeezed_dims)):
        return False
    state = ctx.new_state(f"reverse_{label}")
    # beta = 1 set after construction, so that the node has no `_y` input: like a Gemm with cin=False it
    # then adds into `_y` through its output (DaCe's CBLAS expansion declares an input `_y` twice)
    gemv = Gemv(f"rev_{label}", transA=matrix.letters != out.letters + s, alpha=alpha, beta=0)
    gemv.beta = 1
    state.add_node(gemv)
    reads: dict[str, dace.nodes.AccessNode] = {}
    for conn, term in (("_A", matrix), ("_x", vector)):
        node = reads.setdefault(term.array, state.add_read(term.array))
        state.add_edge(node, None, gemv, conn, term.memlet())
    state.add_edge(gemv, "_y", state.add_write(out.array), None, out.memlet())
    return True


def _as_map(ctx, label, out: Term, x: Term, y: Term, alpha) -> None:
    sizes: dict[str, object] = {}
    for term in (out, x, y):
        for letter, size in zip(term.letters, term.factor.sizes()):
            sizes.setdefault(letter, size)
    params = {letter: f"__{letter}" for letter in sizes}
    ranges = {params[letter]: f"0:{size}" for letter, size in sizes.items()}
    code = "__o = __x * __y" if str(alpha) == "1" else f"__o = ({alpha}) * __x * __y"
    add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_{label}", ranges or None,
                        {"__x": dace.Memlet(x.at(params)), "__y": dace.Memlet(y.at(params))}, code,
                        {"__o": dace.Memlet(out.at(params), wcr=SUM)})
