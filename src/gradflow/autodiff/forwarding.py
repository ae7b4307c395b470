"""Data forwarding: how the forward values a backward sweep reads get there.

A `Forwarding` policy is data (frozen), handed to the `reverse` pass. Every value a reverse rule reads
is either *stored* (kept alive, or pushed on the tape before it is overwritten, then restored in the
backward sweep) or *recomputed* (its defining operation runs again in the backward sweep, right before
the operation that reads it is reversed). The policies:

- `STORE_ALL` (default): store everything;
- `RECOMPUTE_ALL`: recompute every array for which recomputation is valid (see `recomputable`), store
  the rest;
- `Forwarding(recompute={"a", "b"})`: recompute exactly those arrays (an error names any of them for
  which recomputation is not valid).

`loop_bounds` gives, per loop label (the key `"*"`: any other loop), an upper bound on the trip count of
while loops: a memory cap. Without one, what a while loop stores per iteration goes to growable stacks
(`tape.py`), which need no bound. With one, those stacks have a fixed size, the loop stops after `bound`
iterations and sets the program's extra output `gradflow_overflow` (one int64) to its 1-based number in
`ADInterface.bounded_loops`; the gradients of that run are then invalid, and `value_and_grad` raises
`LoopBoundError`.
"""

from __future__ import annotations

from typing import Mapping

import attrs

ALL = "all"


def _frozen_set(value) -> frozenset[str] | str:
    return ALL if value == ALL else frozenset(value)


def _frozen_map(value) -> tuple[tuple[str, int], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), int(v)) for k, v in items))


@attrs.frozen
class Forwarding:
    recompute: frozenset[str] | str = attrs.field(default=frozenset(), converter=_frozen_set)
    loop_bounds: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_frozen_map)

    @property
    def name(self) -> str:
        if self.recompute == ALL:
            return "recompute_all"
        return "store_all" if not self.recompute else f"recompute({', '.join(sorted(self.recompute))})"

    def bound_of(self, loop_label: str) -> int | None:
        bounds = dict(self.loop_bounds)
        return bounds.get(loop_label, bounds.get("*"))

    def with_loop_bounds(self, **bounds: int) -> "Forwarding":
        return attrs.evolve(self, loop_bounds={**dict(self.loop_bounds), **bounds})


STORE_ALL = Forwarding()
RECOMPUTE_ALL = Forwarding(recompute=ALL)


def recompute(*arrays: str, loop_bounds: Mapping[str, int] | None = None) -> Forwarding:
    return Forwarding(recompute=frozenset(arrays), loop_bounds=loop_bounds or {})
