"""`Tensor.detach()` in a module's forward, which the ONNX export drops.

torch stops the gradient at a detach; ONNX has no such stop, so the exported graph carries the value
straight through and gradflow would differentiate through it: a different gradient, silently (found by a
model written outside the project on 2026-12-05: `h * h.detach().sum(-1, keepdim=True)` trained with a
gradient off by 0.6). `recorded` notes the detaches the user's own code makes during the compiled module's
eager trace (calls from torch's and gradflow's own modules are theirs, not the model's); a program that
trains is then refused (`compiled._Program`), while forward-only calls, which a detach does not change, run.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch


def _users(frame: Any) -> bool:
    """Whether `frame` runs the model's code: not torch's, not gradflow's (an FX graph Dynamo captured from
    the model counts as the model's)."""
    module = str(frame.f_globals.get("__name__", ""))
    return not any(module == p or module.startswith(p + ".") for p in ("torch", "gradflow"))


@contextlib.contextmanager
def recorded() -> Iterator[list[str]]:
    """While active, where the model's code calls `detach` (`file:line`), in call order."""
    found: list[str] = []
    method, function = torch.Tensor.detach, torch.detach

    def note() -> None:
        frame = sys._getframe(2)
        if _users(frame):
            found.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")

    def detach_method(self, *args, **kwargs):
        note()
        return method(self, *args, **kwargs)

    def detach_function(x, *args, **kwargs):
        note()
        return function(x, *args, **kwargs)

    torch.Tensor.detach, torch.detach = detach_method, detach_function  # type: ignore[method-assign]
    try:
        yield found
    finally:
        torch.Tensor.detach, torch.detach = method, function  # type: ignore[method-assign]
