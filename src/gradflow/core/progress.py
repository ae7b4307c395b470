"""Progress reports for steps that can take seconds (compiles, ONNX lowering, verification).

Library code announces such steps with `with step("compiling SDFG 'x'"):`; nothing is printed unless a
caller opted in with `with reporting(sink):` (the `gradflow` command prints to stderr). The sink is held
in a context variable, so threads and library users that never opt in are unaffected.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Callable, Iterator

Sink = Callable[[str], None]

_SINK: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("gradflow_progress", default=None)


@contextlib.contextmanager
def reporting(sink: Sink) -> Iterator[None]:
    """Send progress lines to `sink` inside the block."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


def note(text: str) -> None:
    sink = _SINK.get()
    if sink is not None:
        sink(text)


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Report `what ...` on entry and `what: done in 1.2 s` (or `failed`) on exit, when reporting."""
    sink = _SINK.get()
    if sink is None:
        yield
        return
    sink(f"{what} ...")
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        sink(f"{what}: failed after {time.perf_counter() - start:.1f} s")
        raise
    sink(f"{what}: done in {time.perf_counter() - start:.1f} s")
