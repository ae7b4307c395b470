"""The forwarding policies the memory benchmark compares, as one table of rows.

A `Policy` turns what it is measured against (`STORE_ALL`'s forwarded bytes at the benchmark size, and the
sizes themselves) into a `gradflow.Forwarding`. A new policy is one more row of `POLICIES` (a checkpointed
loop, say `Policy("checkpoint(10)", lambda ref, sizes: Forwarding.checkpoint(snapshots=10))`); the worker, the
checks and the report take their rows from here. Every policy bounds while loops at the corpus's bound.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from gradflow.autodiff.forwarding import RECOMPUTE_ALL, STORE_ALL, Forwarding

#: trip-count bound of while loops whose values are stored per iteration (the kernel benchmark's bound)
LOOP_BOUNDS = {"*": 64}
#: budgets as fractions of STORE_ALL's forwarded bytes
FRACTIONS = (0.10, 0.25, 0.50, 0.75)
#: the policy every other one's gradients are checked against
REFERENCE = "store_all"
#: the policy a budget's time must be no worse than
BASELINE = "recompute_all"


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    #: (STORE_ALL's forwarded bytes, sizes) -> the forwarding policy
    make: Callable[[int, Mapping[str, int]], Forwarding]
    #: the byte budget the policy promises to respect, when it has one
    limit: Callable[[int], int] | None = None

    def forwarding(self, reference_bytes: int, sizes: Mapping[str, int]) -> Forwarding:
        return self.make(reference_bytes, sizes).with_loop_bounds(**LOOP_BOUNDS)


def _budget(fraction: float) -> Policy:
    def limit(reference_bytes: int) -> int:
        return int(fraction * reference_bytes)

    return Policy(f"budget {fraction:.0%}", lambda ref, sizes: Forwarding.budget(limit(ref), sizes=dict(sizes)),
                  limit)


POLICIES: tuple[Policy, ...] = (
    Policy(REFERENCE, lambda ref, sizes: STORE_ALL),
    Policy(BASELINE, lambda ref, sizes: RECOMPUTE_ALL),
    *(_budget(f) for f in FRACTIONS),
)
