"""Dropout in training mode, with torch's own masks.

A compiled program cannot draw torch's random numbers, so each mask becomes an input: while exporting, a
training-mode `nn.Dropout` (p > 0) computes `x * mask`, and the attention of a training-mode
`nn.MultiheadAttention` with `dropout` > 0 multiplies its softmax weights by a mask, each mask a buffer of
its module (an ONNX initializer: `<module>.gradflow_dropout_mask`, `<module>.gradflow_attention_mask`).
At every call the compiled module draws the masks as eager torch does on the CPU (`aten::_dropout_impl`:
`empty_like(x).bernoulli_(1 - p)`, then divided by `1 - p`; CPU attention with dropout takes the math
path, which calls the same dropout on the (batch, heads, queries, keys) weights), one per call in the
order the forward makes them, from torch's default generator. So a run seeded with `torch.manual_seed`
draws the same masks as eager torch when the forward draws no other random numbers, and the backward is
exact for the masks used (they are constants of the products).

The masks' shapes are those the example forward saw (`record_calls`); a module called more than once per
forward, a feature dropout (`Dropout1d/2d/3d`, `AlphaDropout`), attention dropout outside
`nn.MultiheadAttention`, and the dropout between the layers of a multi-layer `nn.LSTM`/`GRU`/`RNN` are
refused in training mode (`ExportError` naming the module).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import attrs
import torch

from gradflow.torch.errors import ExportError

MASK, ATTENTION_MASK = "gradflow_dropout_mask", "gradflow_attention_mask"


class AttentionCall(torch.nn.Module):
    """A call of `F.multi_head_attention_forward` as a module with the `dropout` of an
    `nn.MultiheadAttention`: what a captured graph's attention becomes (`gradflow.torch.dynamo`), so its
    dropout gets masks like the module's."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return torch.nn.functional.multi_head_attention_forward(*args, **kwargs)


#: the modules whose attention weights get dropout masks (their `dropout` is the p)
_ATTENTION = (torch.nn.MultiheadAttention, AttentionCall)


@attrs.frozen
class DropoutCall:
    """One dropout site met by the example forward: the module's qualified name, the mask's shape, and
    whether it is the attention weights of an `nn.MultiheadAttention` (else an input of a Dropout)."""

    module: str
    shape: tuple[int, ...]
    attention: bool = False
    #: the strides torch's `empty_like` gives the mask (those of a dense input, e.g. a transposed one):
    #: torch fills the mask in memory order, so the same draws land elsewhere in another layout
    strides: tuple[int, ...] | None = None


@attrs.frozen
class Mask:
    """A mask input of an exported program: the initializer's name, the p it drops with, its shape, dtype."""

    name: str
    p: float
    shape: tuple[int, ...]
    dtype: torch.dtype
    strides: tuple[int, ...] | None = None  # see `DropoutCall.strides` (None: row-major)

    def draw(self) -> torch.Tensor:
        """The mask eager torch's CPU dropout would multiply by, from the same generator draws (dense and
        row-major, as the program reads it)."""
        if self.p == 1.0:  # torch multiplies by zero without drawing
            return torch.zeros(self.shape, dtype=self.dtype)
        noise = (torch.empty(self.shape, dtype=self.dtype) if self.strides is None
                 else torch.empty_strided(self.shape, self.strides, dtype=self.dtype))
        return noise.bernoulli_(1 - self.p).div_(1 - self.p).contiguous()


@contextlib.contextmanager
def _innermost_attention(module: torch.nn.Module) -> Iterator[list[torch.nn.Module]]:
    """A stack of the `nn.MultiheadAttention` modules whose forward is running (innermost last)."""
    stack: list[torch.nn.Module] = []
    hooks = []
    for m in module.modules():
        if isinstance(m, _ATTENTION):
            hooks.append(m.register_forward_pre_hook(lambda mod, args: stack.append(mod)))
            hooks.append(m.register_forward_hook(lambda mod, args, out: stack.pop() and None))  # output kept
    try:
        yield stack
    finally:
        for h in hooks:
            h.remove()


@contextlib.contextmanager
def _attention_wrapped(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """While the block runs, `torch.nn.functional.scaled_dot_product_attention` is `wrap(itself)`."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = wrap(original)
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


@contextlib.contextmanager
def record_calls(module: torch.nn.Module, calls: list[DropoutCall]) -> Iterator[None]:
    """While the block runs `module`'s forward, append every dropout site it meets (in order) to `calls`:
    each Dropout module's call, and each attention computed inside an `nn.MultiheadAttention`."""
    names = {m: n for n, m in module.named_modules()}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args: calls.append(DropoutCall(names[mod], tuple(args[0].shape),
                                                   strides=tuple(torch.empty_like(args[0]).stride()))))
        for m in names if isinstance(m, torch.nn.modules.dropout._DropoutNd)]

    def recording(attention):
        def call(query, key, *args, **kwargs):
            if stack:
                shape = (*query.shape[:-1], key.shape[-2])  # the attention weights: (..., queries, keys)
                calls.append(DropoutCall(names[stack[-1]], tuple(shape), attention=True))
            return attention(query, key, *args, **kwargs)
        return call

    try:
        with _innermost_attention(module) as stack, _attention_wrapped(recording):
            yield
    finally:
        for h in hooks:
            h.remove()


def _training(module: torch.nn.Module,
              calls: Sequence[DropoutCall]) -> list[tuple[str, torch.nn.Module, DropoutCall, float]]:
    """The dropout sites that drop in the modules' current modes, in call order, with their p, checked
    (module doc)."""
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.RNNBase) and m.training and m.dropout > 0 and m.num_layers > 1:
            raise ExportError(f"{type(m).__name__} '{name}' drops values between its layers in training mode "
                              f"(dropout={m.dropout}): gradflow draws no masks inside a recurrent module yet",
                              "stack single-layer modules with an nn.Dropout between them, or set its dropout to 0")
    found, seen = [], set()
    for call in calls:
        m = module.get_submodule(call.module)
        p = m.dropout if call.attention else m.p
        if not m.training or p == 0:
            continue
        if not call.attention and type(m) is not torch.nn.Dropout:
            raise ExportError(f"{type(m).__name__} '{call.module}' is in training mode: gradflow draws masks for "
                              "torch.nn.Dropout only", "call .eval() on it, or use torch.nn.Dropout")
        if call.module in seen:
            raise ExportError(f"{type(m).__name__} '{call.module}' drops values more than once per forward in "
                              "training mode: each would need a mask of its own", "use one module per call")
        seen.add(call.module)
        found.append((call.module, m, call, float(p)))
    return found


@contextlib.contextmanager
def masks_as_inputs(module: torch.nn.Module, calls: Sequence[DropoutCall], dtype: torch.dtype) -> Iterator[list[Mask]]:
    """While exporting: each training-mode Dropout multiplies by a mask buffer of its own, and each
    training-mode `nn.MultiheadAttention` hands its mask to `attention_mask`; yields the masks (in call
    order). The module is as before afterwards."""
    masks, patched, owners = [], [], {}
    try:
        for name, m, call, p in _training(module, calls):
            buffer = ATTENTION_MASK if call.attention else MASK
            m.register_buffer(buffer, torch.ones(call.shape, dtype=dtype))
            patched.append((m, buffer))
            if call.attention:
                owners[m] = getattr(m, buffer)
            else:
                m.forward = (lambda mod: lambda x: x * getattr(mod, MASK))(m)
            masks.append(Mask(f"{name}.{buffer}" if name else buffer, p, call.shape, dtype, call.strides))
        with _innermost_attention(module) as stack:
            _ACTIVE.append((stack, owners))
            try:
                yield masks
            finally:
                _ACTIVE.pop()
    finally:
        for m, buffer in patched:
            del m._buffers[buffer]
            if buffer == MASK:
                del m.forward


#: while `masks_as_inputs` runs: the attention stack and each training-mode attention module's mask
_ACTIVE: list[tuple[list[torch.nn.Module], dict[torch.nn.Module, torch.Tensor]]] = []


def attention_mask() -> torch.Tensor | None:
    """The mask of the attention being exported now (inside the innermost `nn.MultiheadAttention`), if it
    drops values; None when there is none (then attention dropout cannot be exported)."""
    if not _ACTIVE:
        return None
    stack, owners = _ACTIVE[-1]
    return owners.get(stack[-1]) if stack else None
