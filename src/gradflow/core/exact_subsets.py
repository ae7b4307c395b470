"""DaCe's subset reasoning without its assumption that every symbol is positive and large.

By default (`optimizer.symbolic_positive`) DaCe decides a comparison it cannot prove by assuming the
symbols in it large: its union of the rows {i} and {1} is `1:i + 1` (row 0 is lost at i = 0), and
`0:N - 1` "covers" `0:5` whatever N is. gradflow differentiates what those subsets say is read and
overwritten, so an over-optimistic subset is a wrong gradient, not a slower one: `loops_to_maps`
propagated such a union and the old value of an element a product had read was never kept (fuzz seed
10467, program 17). Under `exact_subsets()` a union is a bounding box with Min/Max where the order is
unknown and a cover that cannot be shown is not claimed. Every pass runs under it (`Pass.__call__`), and
so do the analyses the runtime asks outside a pipeline (`analysis.writes`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import dace
from dace import subsets


@contextlib.contextmanager
def exact_subsets() -> Iterator[None]:
    """Within the block, DaCe's unions and covers take no sign or size of a symbol for granted."""
    with dace.config.set_temporary("optimizer", "symbolic_positive", value=False):
        yield


def covers(outer, inner) -> bool:
    """Whether the subset `outer` provably holds every element of `inner` (bounding boxes, as DaCe's
    `covers`; False where the comparison cannot be decided, and for subsets of different dimensions, for
    which DaCe's `covers` returns a `ValueError` object, which is true as a bool)."""
    with exact_subsets():
        try:
            return outer.covers(inner) is True
        except TypeError:  # a symbolic comparison SymPy cannot decide
            return False


def union(a, b):
    """A bounding box of the subsets `a` and `b` valid for every value of their symbols (None when DaCe
    cannot form one)."""
    with exact_subsets():
        return subsets.union(a, b)


def disjoint(a, b) -> bool:
    """Whether the subsets `a` and `b` provably share no element (False where the comparison cannot be
    decided, or where it holds only for some values of their symbols)."""
    with exact_subsets():
        try:
            return a.intersects(b) is False
        except (TypeError, ValueError):  # a symbolic comparison SymPy cannot decide; other dimensions
            return False
