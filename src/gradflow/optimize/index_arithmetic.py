"""`simplify_index_arithmetic`: integer divisions and remainders in memlets that a map's ranges decide.

A reshape that regroups dimensions (an attention layer's `(T, B, H*D) -> (T, B*H, D)`) is lowered as a copy
reading its source at the row-major position of each element, `flat // 2048`, `(flat // 128) % 16`,
`flat % 128`; composed with the transpose after it, the copy's map has one parameter per dimension, e.g.
`flat = 128*p0 + 32*p1 + 2048*p2 + p3` over `p0 < 16, p1 < 4, p2 < 64, p3 < 32`. The divisions run in the
innermost loop and keep the copy from vectorizing (a GPT layer's head split took 0.36 ms where a strided
copy takes a tenth of that). Over those ranges the index is affine: `flat // 2048 = p2`,
`(flat // 128) % 16 = p0`, `flat % 128 = 32*p1 + p3`.

The rewrite, for `int_floor(E, c)` (`//`, which DaCe's C++ computes as C's truncating `/`), `CMod(E, c)` (C's
`%`) and `Mod(E, c)` (Python's), with `c` a positive integer and `E` affine in the parameters of the maps
around the memlet: split `E = c*Q + R` term by term, each coefficient and the constant into its quotient by
`c` (in `Q`) and its remainder (in `R`). Then `floor(E / c) = Q` and `E mod c = R` whenever
`0 <= R <= c - 1` at every point of the ranges; C's `/` and `%` round towards zero, so for them also
`E >= 0` there. Both bounds come from interval arithmetic over the parameters' ranges (each term at
the end of its range that makes it smallest or largest); anything the bounds do not prove (a symbol that is
no map parameter in `R`, a product of parameters, a bound SymPy cannot sign) stays as it is. Inner
divisions go first, so a nested `(flat // 128) % 16` becomes `(16*p2 + p0) % 16`, then `p0`.

Each rewritten index equals the old one at every iteration: the program reads and writes the same elements.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd
from returns.result import Success

from gradflow.analysis.indices import affine_row
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass

_DIVISIONS = (symbolic.int_floor, symbolic.CMod, sympy.Mod)


def _has_division(expr) -> bool:
    return isinstance(expr, sympy.Basic) and any(expr.atoms(f) for f in _DIVISIONS)


def divides(memlet: dace.Memlet) -> bool:
    """Whether an index of `memlet` (either subset) divides or takes a remainder."""
    return not memlet.is_empty() and any(_has_division(v) for s in (memlet.subset, memlet.other_subset)
                                         if isinstance(s, subsets.Range) for r in s.ranges for v in r)


def _affine(expr: sympy.Expr, params: dict) -> tuple[dict, sympy.Expr] | None:
    """(parameter -> coefficient, the rest) of `expr`, affine in the symbols `params` names with integer
    coefficients (`analysis.indices.affine_row`, the parameters looked up by name); None otherwise."""
    expr = sympy.expand(expr)
    symbols = [s for s in expr.free_symbols if str(s) in params]
    row = affine_row(expr, symbols)
    if row is None or not all(c.is_Integer for c in row):
        return None
    coeffs = dict(zip(symbols, row))
    return coeffs, sympy.expand(expr - sum((c * p for p, c in coeffs.items()), sympy.Integer(0)))


def _bounds(coeffs: dict, rest: sympy.Expr, params: dict) -> tuple[sympy.Expr, sympy.Expr]:
    """Least and greatest value of `sum c_p * p + rest` over the parameters' ranges (integer `c_p`)."""
    low = high = rest
    for p, c in coeffs.items():
        lo, hi = params[str(p)]
        low, high = (low + c * lo, high + c * hi) if c >= 0 else (low + c * hi, high + c * lo)
    return sympy.expand(low), sympy.expand(high)


def _proven(expr: sympy.Expr) -> bool:
    """`expr >= 0` for every value of its symbols (a number, or SymPy's assumptions say so)."""
    return bool(sympy.sympify(expr).is_nonnegative)


def _split(expr: sympy.Expr, divisor: sympy.Integer, params: dict, truncating: bool):
    """(quotient, remainder) of `expr` by `divisor` where the ranges prove them affine, else None."""
    found = _affine(expr, params)
    if found is None:
        return None
    coeffs, rest = found
    quotient = {p: c // divisor for p, c in coeffs.items()}  # c = divisor * (c // divisor) + c % divisor
    remainder = {p: c % divisor for p, c in coeffs.items()}
    number, other = rest.as_independent(*rest.free_symbols, as_Add=True) if rest.free_symbols else (rest, 0)
    other_quotient = sympy.simplify(other / divisor)
    if not (number.is_Integer and other_quotient.is_integer):
        return None  # what no parameter carries must divide evenly, but for a constant
    low, high = _bounds(remainder, number % divisor, params)
    if not (_proven(low) and _proven(divisor - 1 - high)):
        return None
    if truncating and not _proven(_bounds(coeffs, rest, params)[0]):
        return None  # C's / and % of a negative number round towards 0: not the quotient and remainder above
    q = number // divisor + other_quotient + sum((c * p for p, c in quotient.items()), sympy.Integer(0))
    r = number % divisor + sum((c * p for p, c in remainder.items()), sympy.Integer(0))
    return q, r


def simplify(expr, params: dict):
    """`expr` with every division and remainder that the ranges in `params` (parameter name -> (least,
    greatest)) decide replaced by its affine value, innermost first."""
    if not _has_division(expr):
        return expr
    args = [simplify(a, params) for a in expr.args]
    if args != list(expr.args):
        expr = expr.func(*args)
    if isinstance(expr, _DIVISIONS) and len(expr.args) == 2:
        value, divisor = expr.args
        if divisor.is_Integer and divisor > 0:
            split = _split(value, divisor, params, truncating=not isinstance(expr, sympy.Mod))
            if split is not None:
                return split[0] if isinstance(expr, symbolic.int_floor) else split[1]
    return expr


def _scope_params(scope: nd.EntryNode | None, scopes: dict) -> dict:
    """Parameter symbol -> (least, greatest) of the maps from `scope` outwards."""
    params: dict = {}
    while scope is not None:
        if isinstance(scope, nd.MapEntry):
            for name, (begin, end, step) in zip(scope.map.params, scope.map.range):
                if not sympy.sympify(step).is_positive:
                    return {}  # a range walked downwards: leave the whole scope alone
                params[name] = (sympy.sympify(begin), sympy.sympify(end))
        scope = scopes[scope]
    return params


def _edge_scope(state: dace.SDFGState, edge, scopes: dict):
    if isinstance(edge.src, nd.EntryNode):
        return edge.src
    if isinstance(edge.dst, nd.ExitNode):
        return state.entry_node(edge.dst)
    return scopes[edge.dst]


def _simplified_subset(subset, params: dict):
    if isinstance(subset, subsets.Range):
        ranges = [tuple(simplify(v, params) for v in r) for r in subset.ranges]
        if ranges != [tuple(r) for r in subset.ranges]:
            return subsets.Range(ranges)
    return None


def simplify_indices(sdfg: dace.SDFG) -> int:
    """The pass's work, in place; the number of memlets rewritten."""
    count = 0
    for state in sdfg.states():
        scopes = None
        for edge in state.edges():
            memlet = edge.data
            if not divides(memlet):
                continue
            scopes = scopes if scopes is not None else state.scope_dict()
            params = _scope_params(_edge_scope(state, edge, scopes), scopes)
            if not params:
                continue
            for attr in ("subset", "other_subset"):
                new = _simplified_subset(getattr(memlet, attr), params)
                if new is not None:
                    setattr(memlet, attr, new)
                    count += 1
    return count


@register_pass
@attrs.frozen
class SimplifyIndexArithmetic(Pass):
    """Replace divisions and remainders in memlet indices by the affine values a map's ranges prove them
    to have (see the module docstring)."""

    name: ClassVar[str] = "simplify_index_arithmetic"

    def run(self, graph: Graph) -> PassResult:
        if not any(divides(e.data) for state in graph.sdfg.states() for e in state.edges()):
            return Success(graph)
        sdfg = graph.editable()
        if not simplify_indices(sdfg):
            return Success(graph)  # no division the ranges decide
        return Success(Graph.adopt(sdfg, graph.meta))
