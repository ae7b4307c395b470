"""Data forwarding: how the forward values a backward sweep reads get there.

A `Forwarding` policy is data (frozen), handed to the `reverse` pass. Every value a reverse rule reads
is either *stored* (kept alive, or pushed on the tape before it is overwritten, then restored in the
backward sweep) or *recomputed* (its defining operation runs again in the backward sweep, right before
the operation that reads it is reversed). The policies:

- `STORE_ALL` (default): store everything, except values that only rearrange data the backward sweep
  holds anyway (a slice, flip or transpose of an input that nothing overwrites, or of a stored array):
  those are rebuilt by rerunning the copy, which costs what a tape push and pop would and keeps no second
  copy (`Forwarding(rebuild_copies=False)` stores them too);
- `RECOMPUTE_ALL`: recompute every array for which recomputation is valid (see `recomputable`), store
  the rest; a rerun that reads arrays a later operation overwrites, larger than the value it saves (sizes
  compared with every symbol at 64), is declined (`ForwardingPlan.declined`): the value is stored; a
  program argument that a single operation writes is kept as under `STORE_ALL`, not rerun;
- `Forwarding(recompute={"a", "b"})`: recompute exactly those arrays (an error names any of them for
  which recomputation is not valid);
- `Forwarding.budget(max_bytes, sizes={...})`: the least rerun work that keeps at most `max_bytes` for
  the backward sweep, chosen exactly by a mixed-integer program (`budget.py`) at the given sizes (the
  functions `value_and_grad` and `gradflow.torch.function` return plan at the call, for the call's sizes:
  no `sizes=` needed, `gradflow/at_call.py`); a budget below what any plan needs is a `BudgetError`
  stating that minimum, and a plan over it is never returned (`budget.check_within`). The inside of a nested SDFG, whose
  tape lives in the backward sweep only, is stored (`Forwarding.inside_nested`).

- `Forwarding.checkpoint(snapshots=s, loops=..., sizes={...})`: the named counted loops (default: every
  outermost one; while loops by label, checkpointed online) keep at most `s` snapshots of their
  loop-carried state and the backward re-advances from them along a binomial (Revolve) schedule
  (`checkpoint.py`, `revolve.py`). A budget chooses this itself when no store/recompute plan fits,
  and a policy with both a budget and snapshots checkpoints with that many and plans the rest within
  what the snapshots leave of the budget.

`loop_bounds` gives, per loop label (the key `"*"`: any other loop), an upper bound on the trip count of
while loops: a memory cap. Without one, what a while loop stores per iteration goes to growable stacks
(`tape.py`), which need no bound. With one, those stacks have a fixed size, the loop stops after `bound`
iterations and sets the program's extra output `gradflow_overflow` (one int64) to its 1-based number in
`ADInterface.bounded_loops`; the gradients of that run are then invalid, and `value_and_grad` raises
`LoopBoundError`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Mapping

import attrs

from gradflow.core.errors import InvalidArgumentError

ALL = "all"


def _frozen_set(value) -> frozenset[str] | str:
    if isinstance(value, str) and value == ALL:
        return ALL
    names = frozenset(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(f"Forwarding(recompute=...) takes array names or 'all', got {type(value).__name__}",
                                   "e.g. gradflow.recompute('A', 'B')")
    return names


def _int_pairs(value, least: int | None) -> tuple[tuple[str, int], ...] | None:
    """`value` (a mapping or pairs) as sorted (name, int) pairs, every int at least `least`; None if it is not."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        return None
    if not all(isinstance(k, str) and isinstance(v, numbers.Integral) and not isinstance(v, bool)
               and (least is None or int(v) >= least) for k, v in pairs):
        return None
    return tuple(sorted((k, int(v)) for k, v in pairs))


def _frozen_map(value) -> tuple[tuple[str, int], ...]:
    pairs = _int_pairs(value, 1)
    if pairs is None:
        raise InvalidArgumentError("Forwarding loop_bounds must map loop labels (or '*') to positive int bounds",
                                   "e.g. gradflow.STORE_ALL.with_loop_bounds(**{'*': 100})")
    return pairs


def _frozen_sizes(value) -> tuple[tuple[str, int], ...]:
    """Symbol -> value at a call: any integer, 0 or below included (an empty axis; a trip-count argument
    whose loop does not run, `range(2, T)` at T = 0)."""
    pairs = _int_pairs(value, None)
    if pairs is None:
        raise InvalidArgumentError("Forwarding sizes must map symbol names to int values",
                                   "e.g. gradflow.Forwarding.budget(2**20, sizes={'N': 1000, 'T': 50})")
    return pairs


def _optional_bytes(value) -> int | None:
    if value is None:
        return None
    from gradflow.core.errors import InvalidArgumentError

    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise InvalidArgumentError(f"a byte budget must be a non-negative whole number, got {value!r}")
    return int(value)


def _optional_snapshots(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidArgumentError(f"Forwarding.checkpoint(snapshots=...) takes a positive int, got {value!r}",
                                   "e.g. gradflow.Forwarding.checkpoint(snapshots=10, sizes={'T': 1000})")
    return int(value)


def _optional_labels(value) -> tuple[str, ...] | None:
    if value is None:
        return None
    labels = tuple(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else None
    if not labels or not all(isinstance(v, str) for v in labels):
        raise InvalidArgumentError(f"Forwarding.checkpoint(loops=...) takes loop labels, got {value!r}",
                                   "e.g. loops=('for_40',); leave it out for every outermost counted loop")
    return tuple(sorted(set(labels)))


@attrs.frozen
class Forwarding:
    recompute: frozenset[str] | str = attrs.field(default=frozenset(), converter=_frozen_set)
    loop_bounds: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_frozen_map)
    max_bytes: int | None = attrs.field(default=None, converter=_optional_bytes)
    sizes: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_frozen_sizes)
    snapshots: int | None = attrs.field(default=None, converter=_optional_snapshots)
    checkpoint_loops: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_labels)
    #: Whether a byte budget may checkpoint loops (False: store or recompute only, the MILP alone).
    budget_checkpoints: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    #: Whether a policy that names nothing to recompute rebuilds the values that only move data it holds
    #: anyway (a slice, flip or transpose of an input) instead of storing them (`recompute.rebuilt_for_free`).
    rebuild_copies: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    #: Whether `sizes` are those of the only calls the program will get (set where a plan is made per call:
    #: `at_call.py`, the torch.compile backend); otherwise a checkpointed loop's forward checks its trip
    #: count against the planned one (`checkpoint._check_trips`).
    planned_at_call: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        if self.snapshots is not None and self.recompute:
            raise InvalidArgumentError("a checkpoint policy cannot also name arrays to recompute",
                                       "use Forwarding.checkpoint(...) alone, or with a byte budget "
                                       "(attrs.evolve(Forwarding.budget(...), snapshots=..., checkpoint_loops=...))")

    @staticmethod
    def budget(max_bytes: int, sizes: Mapping[str, int] | None = None,
               loop_bounds: Mapping[str, int] | None = None, checkpoint: bool = True) -> "Forwarding":
        """Keep at most `max_bytes` for the backward sweep at these sizes (symbol -> value), rerunning
        the cheapest set of definitions that achieves it (see `gradflow.autodiff.budget`), or
        checkpointing the outermost counted loops when no store/recompute plan fits
        (`checkpoint_plan.checkpoint_under_budget`; the plan's policy name then says how many snapshots).
        `checkpoint=False` keeps to storing and recomputing."""
        return Forwarding(max_bytes=max_bytes, sizes=sizes or {}, loop_bounds=loop_bounds or {},
                          budget_checkpoints=checkpoint)

    @staticmethod
    def checkpoint(snapshots: int, loops: Iterable[str] | None = None, sizes: Mapping[str, int] | None = None,
                   loop_bounds: Mapping[str, int] | None = None) -> "Forwarding":
        """Reverse the named loops (default: every outermost counted loop; a named while loop is
        checkpointed online) by binomial checkpointing with at most `snapshots` stored states, for the trip
        counts at these sizes (see `autodiff/checkpoint.py`)."""
        if snapshots is None:
            _optional_snapshots(0)  # the error message for a missing count
        return Forwarding(snapshots=snapshots, checkpoint_loops=loops, sizes=sizes or {},
                          loop_bounds=loop_bounds or {})

    @property
    def name(self) -> str:
        if self.snapshots is not None:
            loops = "" if self.checkpoint_loops is None else f", {', '.join(self.checkpoint_loops)}"
            within = "" if self.max_bytes is None else f"budget({self.max_bytes}) with "
            return f"{within}checkpoint({self.snapshots}{loops})"
        if self.max_bytes is not None:
            return f"budget({self.max_bytes})"
        if self.recompute == ALL:
            return "recompute_all"
        return "store_all" if not self.recompute else f"recompute({', '.join(sorted(self.recompute))})"

    def inside_nested(self) -> "Forwarding":
        """The policy for a nested SDFG's own vjp. Its forward is rerun in the outer backward sweep, so its
        tape lives there and is never forwarded: a byte budget does not constrain it (applied there, it
        rejected programs that forward nothing), and its inside is stored as under `STORE_ALL`."""
        return self if self.max_bytes is None else Forwarding(loop_bounds=self.loop_bounds)

    def bound_of(self, loop_label: str) -> int | None:
        bounds = dict(self.loop_bounds)
        return bounds.get(loop_label, bounds.get("*"))

    def with_loop_bounds(self, **bounds: int) -> "Forwarding":
        return attrs.evolve(self, loop_bounds={**dict(self.loop_bounds), **bounds})


STORE_ALL = Forwarding()
RECOMPUTE_ALL = Forwarding(recompute=ALL)


def recompute(*arrays: str, loop_bounds: Mapping[str, int] | None = None) -> Forwarding:
    return Forwarding(recompute=frozenset(arrays), loop_bounds=loop_bounds or {})
