"""Which iterations of a loop nest can write the same element: affine index analysis.

An index dimension `a_1 p_1 + ... + a_k p_k + b` with constant coefficients `a` (its row) in the loop
parameters `p`, the rest `b` free of them, tells iterations apart along its row; dimensions whose rows have
full column rank together determine the parameters, so no two iterations write the same element. One
analysis for the three questions the optimizer and the build ask of a sum into an array: may a parallel
map's threads meet on an element (`runtime/races.py`), may a loop's accumulations be an OpenMP `simd`
reduction (`optimize/simd_sums.py`), does one parameter own the elements it writes (`optimize/
nest_reductions.py`, `optimize/schedules.py`).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import sympy
from dace import symbolic


def affine_row(expr, params: list, others: Iterable = ()) -> list | None:
    """The constant coefficients of `expr` in `params` (sympy symbols), or None when it is not affine in them
    with constant coefficients or uses one of `others` (symbols or names; compared by name)."""
    expr = sympy.expand(sympy.sympify(expr))
    if {str(s) for s in expr.free_symbols} & {str(o) for o in others}:
        return None
    row = []
    for p in params:
        c = sympy.diff(expr, p)
        if c.free_symbols or not c.is_number:
            return None
        row.append(c)
    rest = sympy.expand(expr - sum(c * p for c, p in zip(row, params)))
    return row if not rest.free_symbols & set(params) else None


def same_value(a, b) -> bool:
    """`a == b` as expressions, both re-parsed from text: DaCe's frontend gives one name symbols with
    different assumptions (a loop variable, the same name in a memlet), which sympy would keep apart."""
    return sympy.simplify(symbolic.pystr_to_symbolic(str(a)) - symbolic.pystr_to_symbolic(str(b))) == 0


def point_indices(subset) -> Iterator:
    """The index of each dimension of `subset` that is a single element (begin == end)."""
    for begin, end, _ in subset.ndrange():
        if symbolic.simplify(end - begin) == 0:
            yield begin


def injective(rows: list[list], count: int) -> bool:
    """Whether dimensions with these rows (over `count` parameters) determine all the parameters."""
    return bool(rows) and sympy.Matrix(rows).rank() == count
