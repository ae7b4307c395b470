"""Pure activity analysis over the operations of a program, in program order.

An array is *varied* when its value depends on a `wrt` array, *useful* when `of` depends on it; only arrays
that are both (plus `wrt` and `of` themselves) carry a gradient. The analysis is at array granularity,
which is conservative (never misses a dependence) and cheap. Operations inside loops can feed operations
that come earlier in program order, so both sweeps repeat until nothing changes (for straight-line code
the second sweep changes nothing).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs
import dace


def is_float(desc: dace.data.Data) -> bool:
    return desc.dtype in (dace.float16, dace.float32, dace.float64)


@attrs.frozen
class OpAccess:
    """The arrays an operation reads and writes (names only)."""

    reads: frozenset[str]
    writes: frozenset[str]


@attrs.frozen
class Activity:
    varied: frozenset[str]
    useful: frozenset[str]
    carrying: frozenset[str]  # arrays that get a gradient buffer

    def has_gradient(self, array: str) -> bool:
        return array in self.carrying


def activity(
    arrays: dict[str, dace.data.Data], ops: Sequence[OpAccess], wrt: Iterable[str], of: Iterable[str]
) -> Activity:
    varied = set(wrt)
    while True:
        before = len(varied)
        for op in ops:
            if op.reads & varied:
                varied |= {a for a in op.writes if is_float(arrays[a])}
        if len(varied) == before:
            break
    useful = set(of)
    while True:
        before = len(useful)
        for op in reversed(ops):
            if op.writes & useful:
                useful |= {a for a in op.reads if is_float(arrays[a])}
        if len(useful) == before:
            break
    carrying = (varied & useful) | set(wrt) | set(of)
    return Activity(frozenset(varied), frozenset(useful), frozenset(carrying))
