"""The twin's `stop_gradient`: a value central differences see as a constant.

Central differences of a program through `x * stop_gradient(x)` move the stopped value with x and find
2x, where the stop means x. So the checker runs the twin once at the unperturbed data while `recording`
(each call of `stop_gradient` keeps a copy of its value, in call order) and then takes its differences
while `replaying` (the k-th call of a run returns the k-th recorded value): every stopped value is held
where the program's gradient holds it. A perturbed run that calls it otherwise (a data-dependent branch or
loop that flips) raises `Diverged`: no difference is taken there. Outside both, `stop_gradient` is the
identity, as `gradflow.stop_gradient` is in plain Python.

Second order is not checked on such programs: gradflow's Hessian-vector product differentiates the
gradient's own stops as constants (as JAX does), which central differences of the gradient program,
whose stops move, cannot reproduce.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np


class Diverged(ValueError):
    """A replayed run called `stop_gradient` otherwise than the recorded run did."""


_recorded: list[Any] | None = None
_replaying = False
_next = 0


def stop_gradient(x: Any) -> Any:
    """`x`; while recording, also kept; while replaying, the value kept at this call instead (module doc)."""
    global _next
    if _replaying:
        assert _recorded is not None
        if _next >= len(_recorded) or np.shape(_recorded[_next]) != np.shape(x):
            raise Diverged(f"stop_gradient call {_next} differs from the unperturbed run")
        kept = _recorded[_next]
        _next += 1
        return np.array(kept, copy=True) if isinstance(kept, np.ndarray) else kept
    if _recorded is not None:
        _recorded.append(np.array(x, copy=True) if isinstance(x, np.ndarray) else x)
    return x


def restart() -> None:
    """A run of the twin begins: replay from the first recorded call."""
    global _next
    _next = 0


@contextlib.contextmanager
def replaying(record: Callable[[], Any]) -> Iterator[None]:
    """Run `record()` (the twin at the unperturbed data) keeping every stopped value, then replay them while
    the block runs."""
    global _recorded, _replaying
    _recorded, _replaying = [], False
    try:
        restart()
        record()
        _replaying = True
        restart()
        yield
    finally:
        _recorded, _replaying = None, False
