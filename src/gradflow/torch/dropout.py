"""Dropout in training mode, with torch's own masks.

A compiled program cannot draw torch's random numbers, so the mask becomes an input: while exporting, each
training-mode `nn.Dropout` (p > 0) computes `x * mask` with `mask` a buffer of its own (an ONNX
initializer, `<module>.gradflow_dropout_mask`), and at every call the compiled module draws the masks as
eager torch does on the CPU (`aten::_dropout_impl`: `empty_like(x).bernoulli_(1 - p)`, then divided by
`1 - p`), one per Dropout in the order the forward calls them, from torch's default generator. So a run
seeded with `torch.manual_seed` draws the same masks as eager torch when the forward draws no other random
numbers, and the backward is exact for the mask used (it is a constant of the product).

The shapes of the masks are those of the Dropouts' inputs in the example forward (`record_calls`); a
Dropout called more than once per forward, or a feature dropout (`Dropout1d/2d/3d`, `AlphaDropout`), is
refused in training mode (`ExportError` naming the module).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import attrs
import torch

from gradflow.torch.errors import ExportError

MASK = "gradflow_dropout_mask"


@attrs.frozen
class DropoutCall:
    """One call of a Dropout module in the example forward: its qualified name and its input's shape."""

    module: str
    shape: tuple[int, ...]


@attrs.frozen
class Mask:
    """A mask input of an exported program: the initializer's name, the Dropout's p, the mask's shape."""

    name: str
    p: float
    shape: tuple[int, ...]
    dtype: torch.dtype

    def draw(self) -> torch.Tensor:
        """The mask eager torch's CPU dropout would multiply by, from the same generator draws."""
        if self.p == 1.0:  # torch multiplies by zero without drawing
            return torch.zeros(self.shape, dtype=self.dtype)
        noise = torch.empty(self.shape, dtype=self.dtype).bernoulli_(1 - self.p)
        return noise.div_(1 - self.p)


@contextlib.contextmanager
def record_calls(module: torch.nn.Module, calls: list[DropoutCall]) -> Iterator[None]:
    """While the block runs `module`'s forward, append every Dropout call (in order) to `calls`."""
    names = {m: n for n, m in module.named_modules()}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args: calls.append(DropoutCall(names[mod], tuple(args[0].shape)))) for m in names
        if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def _training(module: torch.nn.Module, calls: Sequence[DropoutCall]) -> list[tuple[str, torch.nn.Module, DropoutCall]]:
    """The training-mode Dropouts with p > 0 that `calls` saw, in call order, checked (see the module doc)."""
    found, seen = [], set()
    for call in calls:
        m = module.get_submodule(call.module)
        if not m.training or m.p == 0:
            continue
        if type(m) is not torch.nn.Dropout:
            raise ExportError(f"{type(m).__name__} '{call.module}' is in training mode: gradflow draws masks for "
                              "torch.nn.Dropout only", "call .eval() on it, or use torch.nn.Dropout")
        if call.module in seen:
            raise ExportError(f"Dropout '{call.module}' is called more than once per forward in training mode: "
                              "each call would need a mask of its own", "use one Dropout module per call")
        seen.add(call.module)
        found.append((call.module, m, call))
    return found


@contextlib.contextmanager
def masks_as_inputs(module: torch.nn.Module, calls: Sequence[DropoutCall], dtype: torch.dtype) -> Iterator[list[Mask]]:
    """While exporting: each training-mode Dropout multiplies by a mask buffer of its own; yields the masks
    (in call order). The module is as before afterwards."""
    masks, patched = [], []
    try:
        for name, m, call in _training(module, calls):
            m.register_buffer(MASK, torch.ones(call.shape, dtype=dtype))
            m.forward = (lambda mod: lambda x: x * getattr(mod, MASK))(m)
            patched.append(m)
            masks.append(Mask(f"{name}.{MASK}" if name else MASK, float(m.p), call.shape, dtype))
        yield masks
    finally:
        for m in patched:
            del m._buffers[MASK]
            del m.forward
