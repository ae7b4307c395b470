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

Online (a while loop, whose trip count is known only once its forward has run): the forward keeps
snapshots at the multiples of a stride `d` (slot `j` holds the state at `j*d`); when all `s` slots are
full it doubles `d` and keeps the even ones (`thinned`). The backward then reverses the segments between
stored states last to first, each by the schedule above with the slots the earlier segments leave free
(`online_schedule`): at most `s` snapshots throughout. The backward computes that schedule at run time,
one action per call, with `NEXT_ACTION_CPP`, the same expansion in C++.
"""

from __future__ import annotations

from math import comb

import attrs

from gradflow.core.errors import InvalidArgumentError

ADVANCE, TAKESHOT, RESTORE, REVERSE, DONE = 0, 1, 2, 3, 4
KIND_NAMES = ("advance", "takeshot", "restore", "reverse", "done")


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


def _check(steps, snapshots) -> None:
    """The arguments of `schedule` and `thinned`: a whole number of steps, at least one snapshot."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InvalidArgumentError(f"Revolve needs a non-negative whole number of steps, got {steps!r}")
    if isinstance(snapshots, bool) or not isinstance(snapshots, int) or snapshots < 1:
        raise InvalidArgumentError(f"Revolve needs at least one snapshot, got {snapshots!r}",
                                   "pass snapshots=1 or more (the initial state takes one)")


def schedule(steps: int, snapshots: int) -> tuple[Action, ...]:
    """The action sequence reversing `steps` steps with at most `snapshots` stored states, starting from
    the initial state (stored first, in slot 0) and attaining `min_advances(steps, snapshots)` advances."""
    _check(steps, snapshots)
    if steps == 0:
        return ()
    return (Action(TAKESHOT, 0, 0),) + _expand([(steps, snapshots, 0, 0, True)])


def thinned(steps: int, snapshots: int) -> tuple[int, tuple[int, ...]]:
    """The stride and the positions held in slots 0, 1, ... after the online forward ran `steps` steps
    (the loop the forward sweep runs, in Python: the state at position `n` is stored, if at all, before
    step `n` runs)."""
    _check(steps, snapshots)
    stride, next_at = 1, 0
    stored: list[int] = []
    keep = (snapshots + 1) // 2
    for n in range(steps):
        if n == next_at and len(stored) == snapshots:  # full: keep the even slots, double the stride
            stored = stored[0:2 * keep:2]
            stride *= 2
            next_at = keep * stride
        if n == next_at:
            stored.append(n)
            next_at += stride
    return stride, tuple(stored)


def online_schedule(steps: int, snapshots: int) -> tuple[Action, ...]:
    """The backward's actions after the online forward ran `steps` steps: the segments between stored
    states reversed last to first, segment `j` (from slot `j`) with the `snapshots - j` slots from `j` on."""
    stride, stored = thinned(steps, snapshots)
    return _expand([(min(stride, steps - j * stride), snapshots - j, j * stride, j, False)
                    for j in range(len(stored))])


def _expand(tasks: list[tuple[int, int, int, int, bool]]) -> tuple[Action, ...]:
    """Iterative form of the recursion (a deep `steps` would overflow Python's stack): each task reverses
    `n` steps from position `p`, whose state is in slot `slot`, with `s` snapshots (`slot`'s included);
    `fresh` says whether the current state already is the one at `p` (no restore needed). The last task
    runs first. `NEXT_ACTION_CPP` is the same loop, one action per call."""
    out: list[Action] = []
    tasks = list(tasks)
    while tasks:
        n, s, p, slot, fresh = tasks.pop()
        if not fresh:
            out.append(Action(RESTORE, slot, p))
        if n == 1:
            out.append(Action(REVERSE, 0, p))
            continue
        m = n - 1 if s == 1 else _split(n, s)
        out.append(Action(ADVANCE, m, p))
        if s == 1:  # no slot left: advance to the last step, reverse it, start over from `p`
            out.append(Action(REVERSE, 0, p + m))
            tasks.append((n - 1, s, p, slot, False))
            continue
        out.append(Action(TAKESHOT, slot + 1, p + m))
        tasks.append((m, s, p, slot, False))  # runs second
        tasks.append((n - m, s - 1, p + m, slot + 1, True))  # runs first
    return tuple(out)


#: Words of the run-time generator's state before its task stack: [0] tasks on the stack, [1] actions
#: pending, [2] the next pending one, [3:12] up to three pending actions (kind, arg, position), [12] steps
#: left to reverse without any snapshot (a step whose reverse reads no state).
HEADER = 13


def generator_words(snapshots: int) -> int:
    """int64 words of the generator state for `snapshots` slots: the stack holds at most one task per
    segment (up to `snapshots`) plus one per snapshot taken on the way down (up to `snapshots`)."""
    return HEADER + 5 * (2 * snapshots + 2)


#: C++ tasklet code: set up the generator state `__gf_g` from `__gf_info` = (steps, stride, stored slots) as the
#: online forward leaves them; `snapshots` and `linear` are substituted (`linear`: no state is stored, the
#: steps are reversed last to first).
INIT_CPP = """
const int64_t steps = __gf_info[0], stride = __gf_info[1], stored = __gf_info[2];
for (int i = 0; i < HEADER_WORDS; ++i) __gf_g[i] = 0;
if (LINEAR) {
    __gf_g[12] = steps;
} else {
    for (int64_t j = 0; j < stored; ++j) {
        int64_t* t = __gf_g + HEADER_WORDS + 5 * __gf_g[0];
        t[0] = (steps - j * stride < stride) ? steps - j * stride : stride;
        t[1] = SNAPSHOTS - j; t[2] = j * stride; t[3] = j; t[4] = 0;
        __gf_g[0] += 1;
    }
}
"""

#: C++ tasklet code: the next action (kind, arg, position) into `__gf_act`, DONE when none is left (reads
#: and writes the generator state through `__gf_g`; the tasklet's input `__gf_gi` only records the read).
NEXT_ACTION_CPP = """
auto min_advances = [](int64_t l, int64_t s) -> int64_t {
    if (l <= 1) return 0;
    int64_t r = 0, c = 1;  // c = C(s + r, s)
    while (c < l) { r += 1; c = c * (s + r) / r; }
    return r * l - c * r / (s + 1);
};
if (__gf_g[12] > 0) {
    __gf_g[12] -= 1;
    __gf_act[0] = 3; __gf_act[1] = 0; __gf_act[2] = __gf_g[12];
} else {
    if (__gf_g[1] == 0 && __gf_g[0] > 0) {
        __gf_g[0] -= 1;
        int64_t* t = __gf_g + HEADER_WORDS + 5 * __gf_g[0];
        const int64_t l = t[0], s = t[1], p = t[2], slot = t[3], fresh = t[4];
        int64_t n = 0;
        auto pend = [&](int64_t kind, int64_t arg, int64_t at) {
            __gf_g[3 + 3 * n] = kind; __gf_g[4 + 3 * n] = arg; __gf_g[5 + 3 * n] = at; n += 1;
        };
        auto push = [&](int64_t l2, int64_t s2, int64_t p2, int64_t slot2, int64_t fresh2) {
            int64_t* u = __gf_g + HEADER_WORDS + 5 * __gf_g[0];
            u[0] = l2; u[1] = s2; u[2] = p2; u[3] = slot2; u[4] = fresh2;
            __gf_g[0] += 1;
        };
        if (!fresh) pend(2, slot, p);
        if (l == 1) {
            pend(3, 0, p);
        } else {
            int64_t m = l - 1;
            if (s > 1) {
                const int64_t best = min_advances(l, s);
                while (m > 1 && m + min_advances(l - m, s - 1) + min_advances(m, s) != best) m -= 1;
            }
            pend(0, m, p);
            if (s == 1) {
                pend(3, 0, p + m);
                push(l - 1, s, p, slot, 0);
            } else {
                pend(1, slot + 1, p + m);
                push(m, s, p, slot, 0);
                push(l - m, s - 1, p + m, slot + 1, 1);
            }
        }
        __gf_g[1] = n; __gf_g[2] = 0;
    }
    if (__gf_g[1] > 0) {
        const int64_t i = __gf_g[2];
        __gf_act[0] = __gf_g[3 + 3 * i]; __gf_act[1] = __gf_g[4 + 3 * i]; __gf_act[2] = __gf_g[5 + 3 * i];
        __gf_g[2] += 1; __gf_g[1] -= 1;
    } else {
        __gf_act[0] = 4; __gf_act[1] = 0; __gf_act[2] = 0;
    }
}
"""


#: Connector names of the two tasklets (unlikely to clash with a program's array names).
INFO, STATE, STATE_IN, ACTION = "__gf_info", "__gf_g", "__gf_gi", "__gf_act"


def init_code(snapshots: int, linear: bool) -> str:
    return (INIT_CPP.replace("HEADER_WORDS", str(HEADER)).replace("SNAPSHOTS", str(int(snapshots)))
            .replace("LINEAR", "true" if linear else "false"))


def next_action_code() -> str:
    return NEXT_ACTION_CPP.replace("HEADER_WORDS", str(HEADER))


def forward_phase(actions: tuple[Action, ...]) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
    """The actions before the first `REVERSE` (advances and snapshots a forward sweep takes on its way to
    the last step) and the rest, which begins by reversing the last step."""
    first = next((k for k, a in enumerate(actions) if a.kind == REVERSE), len(actions))
    return actions[:first], actions[first:]


def advances(actions) -> int:
    return sum(a.arg for a in actions if a.kind == ADVANCE)
