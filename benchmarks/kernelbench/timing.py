"""Interleaved timing of several callables in one process: medians of single calls, on two clocks.

The machine is shared and loaded, so a peer measured in one block and another peer a minute later see
different loads. Here every round calls each peer in turn (the order rotating from round to round), each
call timed on its own (the benchmark's calls take about a millisecond or more, so the clocks' overhead is
negligible), and a peer's time is the median over all its calls. A call's `prep` (restoring inputs a
kernel updates in place) runs before it, outside the timed region. A slow peer (eager torch running
per-element Python loops) takes part in as many rounds as its time budget allows, at least one call.

Each call is timed on the wall clock and on the process's CPU clock (all its threads). On a loaded machine
the wall clock of a call includes the time the process waits for a core, which is large and uneven: a call
that hands work to another thread and waits for it (torch's autograd engine) waits for that thread to be
scheduled again, at a scheduler quantum each time. With one thread per side the CPU time is the cost of the
call itself; with several threads it also counts threads spinning while they wait, and the wall clock is the
measure (`kernels.py --clock`).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Any, Callable


@dataclasses.dataclass
class Timed:
    name: str
    call: Callable[[], Any]
    prep: Callable[[], None] | None = None
    #: (wall, CPU) seconds of a call made before (the first call, after any compile): it sizes the rounds,
    #: and it is the peer's only sample when one call exceeds the time budget
    first: tuple[float, float] | None = None


@dataclasses.dataclass(frozen=True)
class Stats:
    median: float
    samples: int
    low: float  # first quartile
    high: float  # third quartile

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def time_once(t: Timed) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    if t.prep is not None:
        t.prep()
    cpu, wall = time.process_time(), time.perf_counter()
    t.call()
    return time.perf_counter() - wall, time.process_time() - cpu


def _plan(t: Timed, rounds: int, round_s: float, budget_s: float, max_calls: int) -> tuple[int, int]:
    """(calls per round, rounds) for one peer: each round about `round_s` of CPU time, all rounds within
    `budget_s`."""
    if t.first is None:
        t.first = time_once(t)
    est = max(t.first[1], 1e-7)
    per_round = max(1, min(max_calls, int(round_s / est)))
    n_rounds = max(1, min(rounds, int(budget_s / (est * per_round))))
    return per_round, n_rounds


def measure(peers: list[Timed], rounds: int = 10, round_s: float = 0.1, budget_s: float = 8.0,
            max_calls: int = 200) -> dict[str, dict[str, Stats]]:
    """Per peer, {"wall": Stats, "cpu": Stats} of its calls."""
    plans = {t.name: _plan(t, rounds, round_s, budget_s, max_calls) for t in peers}
    samples: dict[str, list[tuple[float, float]]] = {t.name: [] for t in peers}
    for t in peers:
        if t.first[1] >= budget_s:  # one call exceeds the budget: the first one is the sample
            samples[t.name].append(t.first)
            plans[t.name] = (0, 0)
    gc.collect()
    for r in range(rounds):
        order = peers[r % len(peers):] + peers[:r % len(peers)]
        for t in order:
            per_round, n_rounds = plans[t.name]
            if r >= n_rounds:
                continue
            samples[t.name].extend(time_once(t) for _ in range(per_round))
    return {name: {"wall": summarize([w for w, _ in s]), "cpu": summarize([c for _, c in s])}
            for name, s in samples.items() if s}


def summarize(samples: list[float]) -> Stats:
    if len(samples) >= 4:
        q = statistics.quantiles(samples, n=4)
        low, high = q[0], q[2]
    else:
        low, high = min(samples), max(samples)
    return Stats(statistics.median(samples), len(samples), low, high)
