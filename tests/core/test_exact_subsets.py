"""`core/exact_subsets`: gradflow's covers and unions hold for every value of the symbols, and never claim a
cover DaCe's positivity assumption or a dimension mismatch would give."""

from __future__ import annotations

import dace
import pytest
from dace import subsets

from gradflow.core.exact_subsets import covers, union

N, i = dace.symbol("N"), dace.symbol("i")


def rows(*ranges) -> subsets.Range:
    return subsets.Range([(b, e, 1) for b, e in ranges])


def test_a_cover_is_claimed_only_where_it_holds_for_every_size() -> None:
    assert covers(rows((0, N - 1)), rows((0, N - 1)))
    assert covers(rows((0, N - 1)), rows((1, N - 2)))
    # DaCe by default: `0:N - 1` covers `0:5` (it takes N as large); false for N < 6
    assert not covers(rows((0, N - 2)), rows((0, 4)))
    # DaCe's covers returns a ValueError object here, which is true as a bool
    assert not covers(rows((0, 4)), rows((0, 1), (0, 1)))


@pytest.mark.parametrize("value", [0, 1, 5])
def test_a_union_holds_both_subsets_at_every_value(value: int) -> None:
    (begin, end, _), = union(rows((i, i)), rows((1, 1))).ranges
    low, high = (int(dace.symbolic.evaluate(x, {"i": value})) for x in (begin, end))
    assert low <= min(value, 1) and high >= max(value, 1)
