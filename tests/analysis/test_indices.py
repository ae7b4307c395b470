"""The affine index analysis shared by the race check, simd sums and the owner tests."""

from __future__ import annotations

import dace
import pytest
from dace import symbolic

from gradflow.analysis import indices

i, k = symbolic.symbol("i"), symbolic.symbol("k")


@pytest.mark.parametrize("expr, row", [
    ("2*i + k + 3", [2, 1]),
    ("i - k", [1, -1]),
    ("7", [0, 0]),
    ("i*k", None),  # coefficients that are not constants
    ("Mod(i, 7)", None),  # not affine
    ("int_floor(i, 2)", None),
    ("i + N", [1, 0]),  # another symbol is a constant offset
])
def test_affine_rows(expr, row) -> None:
    got = indices.affine_row(symbolic.pystr_to_symbolic(expr), [i, k])
    assert got == row


def test_a_row_that_uses_an_excluded_symbol_is_none_whatever_its_assumptions() -> None:
    # compared by name: a symbol of the same name with other assumptions is still excluded
    j = symbolic.pystr_to_symbolic("j")
    other = dace.symbol("j", nonnegative=True)
    assert indices.affine_row(i + j, [i], [other]) is None
    assert indices.affine_row(i + j, [i], ["j"]) is None
    assert indices.affine_row(i + j, [i], []) == [1]


def test_injective_needs_full_column_rank() -> None:
    assert indices.injective([[1, 0], [0, 1]], 2)
    assert indices.injective([[1, 1], [1, -1]], 2)
    assert not indices.injective([[1, 1], [2, 2]], 2)  # only i + k is known
    assert not indices.injective([], 1)


def test_point_indices_skip_ranges() -> None:
    subset = dace.subsets.Range.from_string("i, 0:k, 2*i + 1")
    assert [str(b) for b in indices.point_indices(subset)] == ["i", "2*i + 1"]
