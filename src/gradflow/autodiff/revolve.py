"""Binomial checkpointing (Revolve, Griewank & Walther 2000): the schedule, as pure data.

Reversing `steps` applications of a step function with room for `snapshots` stored states (one of them
the initial state) costs at least `t(l, s) = r*l - C(s + r, s + 1)` forward advances, where `r` is the
least repetition number with `C(s + r, s) >= l`. `schedule` returns an action sequence attaining that
bound, built by the recursion behind it: to reverse `l` steps from a held snapshot at position `p`,
advance `m` steps, take a snapshot there, reverse the last `l - m` steps with one snapshot fewer, restore
`p` and reverse the first `m` steps; `m` is a split for which the costs add up to `t(l, s)`.

An action is a record `(kind, arg, position)`: `ADVANCE` runs `arg` steps from `position`; `TAKESHOT`
stores the current state (at `position`) in slot `arg`; `RESTORE` loads slot `arg`, whose state is the
one at `position`; `REVERSE` reverses the step starting at `position` (Revolve's `firstturn` for the
first one, `youturn` for the others) and leaves the current state undefined.
"""

from __future__ import annotations

from math import comb

import attrs

from gradflow.core.errors import InvalidArgumentError

ADVANCE, TAKESHOT, RESTORE, REVERSE = 0, 1, 2, 3
KIND_NAMES = ("advance", "takeshot", "restore", "reverse")


@attrs.frozen
class Action:
    kind: int
    arg: int  # steps (ADVANCE), slot (TAKESHOT, RESTORE), unused (REVERSE)
    position: int  # the step index of the current state when the action starts (RESTORE: after it)

    def __str__(self) -> str:
        return f"{KIND_NAMES[self.kind]}({self.arg}@{self.position})"


def repetition_number(steps: int, snapshots: int) -> int:
    """The least r with C(snapshots + r, snapshots) >= steps."""
    r = 0
    while comb(snapshots + r, snapshots) < steps:
        r += 1
    return r


def min_advances(steps: int, snapshots: int) -> int:
    """`t(steps, snapshots)`: the fewest forward advances that reverse `steps` steps with `snapshots`
    stored states (the initial one included)."""
    if steps <= 1:
        return 0
    r = repetition_number(steps, snapshots)
    return r * steps - comb(snapshots + r, snapshots + 1)


def _split(steps: int, snapshots: int) -> int:
    """A first snapshot distance `m` at which the recursion's cost equals `min_advances`."""
    best = min_advances(steps, snapshots)
    for m in range(steps - 1, 0, -1):  # farthest first: the forward phase then takes few snapshots
        if m + min_advances(steps - m, snapshots - 1) + min_advances(m, snapshots) == best:
            return m
    raise AssertionError(f"no optimal split for {steps} steps and {snapshots} snapshots")  # pragma: no cover


def schedule(steps: int, snapshots: int) -> tuple[Action, ...]:
    """The action sequence reversing `steps` steps with at most `snapshots` stored states, starting from
    the initial state (stored first, in slot 0) and attaining `min_advances(steps, snapshots)` advances."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InvalidArgumentError(f"Revolve needs a non-negative whole number of steps, got {steps!r}")
    if isinstance(snapshots, bool) or not isinstance(snapshots, int) or snapshots < 1:
        raise InvalidArgumentError(f"Revolve needs at least one snapshot, got {snapshots!r}",
                                   "pass snapshots=1 or more (the initial state takes one)")
    if steps == 0:
        return ()
    out: list[Action] = [Action(TAKESHOT, 0, 0)]
    # Iterative form of the recursion (a deep `steps` would overflow Python's stack): each task reverses
    # `l` steps from position `p`, whose state is in slot `slot`, with `s` snapshots (`slot`'s included);
    # `fresh` says whether the current state already is the one at `p` (no restore needed).
    tasks = [(steps, snapshots, 0, 0, True)]
    while tasks:
        l, s, p, slot, fresh = tasks.pop()
        if not fresh:
            out.append(Action(RESTORE, slot, p))
        if l == 1:
            out.append(Action(REVERSE, 0, p))
            continue
        m = l - 1 if s == 1 else _split(l, s)
        out.append(Action(ADVANCE, m, p))
        if s == 1:  # no slot left: advance to the last step, reverse it, start over from `p`
            out.append(Action(REVERSE, 0, p + m))
            tasks.append((l - 1, s, p, slot, False))
            continue
        out.append(Action(TAKESHOT, slot + 1, p + m))
        tasks.append((m, s, p, slot, False))  # runs second
        tasks.append((l - m, s - 1, p + m, slot + 1, True))  # runs first
    return tuple(out)


def forward_phase(actions: tuple[Action, ...]) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
    """The actions before the first `REVERSE` (advances and snapshots a forward sweep takes on its way to
    the last step) and the rest, which begins by reversing the last step."""
    first = next((k for k, a in enumerate(actions) if a.kind == REVERSE), len(actions))
    return actions[:first], actions[first:]


def advances(actions) -> int:
    return sum(a.arg for a in actions if a.kind == ADVANCE)
