"""Dropout in training mode, with torch's own masks.

A compiled program cannot draw torch's random numbers, so each mask becomes an input: while exporting, a
training-mode `nn.Dropout` (p > 0) computes `x * mask`, and the attention of a training-mode
`nn.MultiheadAttention` with `dropout` > 0 multiplies its softmax weights by a mask, each mask an extra
input of the exported forward (after the module's own), reshaped in the graph to the shape it multiplies
(`ONNX Shape -> Reshape`, so a mask whose size grows with the batch serves every batch size).
At every call the compiled module draws the masks as eager torch does on the CPU (`aten::_dropout_impl`:
`empty_like(x).bernoulli_(1 - p)`, then divided by `1 - p`; CPU attention with dropout takes the math
path, which calls the same dropout on the (batch, heads, queries, keys) weights), one per call in the
order the forward makes them, from torch's default generator, in the shapes and memory order that call's
eager forward meets (`record_calls`). So a run seeded with `torch.manual_seed` draws the same masks as
eager torch when the forward draws no other random numbers, and the backward is exact for the masks used
(they are constants of the products).

A module called more than once per forward, a feature dropout (`Dropout1d/2d/3d`, `AlphaDropout`),
attention dropout outside `nn.MultiheadAttention`, and the dropout between the layers of a multi-layer
`nn.LSTM`/`GRU`/`RNN` are refused in training mode (`ExportError` naming the module).

The random numbers the model's own code draws (`torch.randn_like`...) are inputs of the same kind, drawn
in the same order (`gradflow.torch.draws`): a `RandomSite` is a dropout site or such a draw.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import attrs
import torch

from gradflow.torch import draws
from gradflow.torch.errors import ExportError


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
class RandomSite:
    """One random input met by the example forward: a dropout site (`module` the module's qualified name;
    `attention`: the attention weights of an `nn.MultiheadAttention`, else an input of a Dropout) or a draw
    of the model's code (`fill` set; `module` names the draw: function, number, place), with the shape."""

    module: str
    shape: tuple[int, ...]
    attention: bool = False
    #: the strides torch's `empty_like` gives the mask (those of a dense input, e.g. a transposed one):
    #: torch fills the mask in memory order, so the same draws land elsewhere in another layout
    strides: tuple[int, ...] | None = None
    #: a draw's fill ('normal' or 'uniform', '' for a dropout site), its two scalars and its dtype
    fill: str = ""
    scalars: tuple[float, float] = (0.0, 1.0)
    dtype: torch.dtype | None = None


@attrs.frozen
class Mask:
    """A random input of an exported program (a dropout mask, or a draw when `fill` is set): the site's
    module (or draw), the p it drops with, the dtype, and the input's layout: `cols` None for a flat
    vector, else `(batch, cols)` rows (an input whose size is the batch times `cols`, for a program that
    serves every batch size)."""

    module: str
    p: float
    dtype: torch.dtype
    attention: bool = False
    cols: int | None = None
    fill: str = ""
    scalars: tuple[float, float] = (0.0, 1.0)

    def draw(self, call: RandomSite) -> torch.Tensor:
        """What eager torch draws at the site `call` (its shape and memory order at this call): the mask
        its CPU dropout multiplies by, or the draw itself, from the same generator draws, laid out as the
        program reads it."""
        if self.fill:
            drawn = draws.redraw(call.shape, call.strides, self.dtype, self.fill, self.scalars)
            return drawn.reshape(-1) if self.cols is None else drawn.reshape(-1, self.cols)
        if self.p == 1.0:  # torch multiplies by zero without drawing
            mask = torch.zeros(call.shape, dtype=self.dtype)
        else:
            noise = (torch.empty(call.shape, dtype=self.dtype) if call.strides is None
                     else torch.empty_strided(call.shape, call.strides, dtype=self.dtype))
            mask = noise.bernoulli_(1 - self.p).div_(1 - self.p).contiguous()
        return mask.reshape(-1) if self.cols is None else mask.reshape(-1, self.cols)


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
def record_calls(module: torch.nn.Module, calls: list[RandomSite]) -> Iterator[None]:
    """While the block runs `module`'s forward, append every random site it meets (in order) to `calls`:
    each Dropout module's call, each attention computed inside an `nn.MultiheadAttention`, and each draw
    of the model's code (`draws.Recording`)."""
    names = {m: n for n, m in module.named_modules()}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args: calls.append(RandomSite(names[mod], tuple(args[0].shape),
                                                  strides=tuple(torch.empty_like(args[0]).stride()))))
        for m in names if isinstance(m, torch.nn.modules.dropout._DropoutNd)]

    def recording(attention):
        def call(query, key, *args, **kwargs):
            if stack:
                shape = (*query.shape[:-1], key.shape[-2])  # the attention weights: (..., queries, keys)
                calls.append(RandomSite(names[stack[-1]], tuple(shape), attention=True))
            return attention(query, key, *args, **kwargs)
        return call

    try:
        with _innermost_attention(module) as stack, _attention_wrapped(recording), draws.Recording(calls, RandomSite):
            yield
    finally:
        for h in hooks:
            h.remove()


def dropping_calls(module: torch.nn.Module, calls: Sequence[RandomSite]) -> list[tuple[RandomSite, float]]:
    """The random sites among `calls` that draw in the modules' current modes, in call order, with their p
    (0 for a draw of the model's code, random in every mode), checked (module doc)."""
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.RNNBase) and m.training and m.dropout > 0 and m.num_layers > 1:
            raise ExportError(f"{type(m).__name__} '{name}' drops values between its layers in training mode "
                              f"(dropout={m.dropout}): gradflow draws no masks inside a recurrent module yet",
                              "stack single-layer modules with an nn.Dropout between them, or set its dropout to 0")
    found, seen = [], set()
    for call in calls:
        if call.fill:  # a draw: random in every mode
            found.append((call, 0.0))
            continue
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
        found.append((call, float(p)))
    return found


def mask_example(call: RandomSite, cols: int | None, dtype: torch.dtype) -> torch.Tensor:
    """A stand-in for the random input of `call` while exporting (its values do not matter)."""
    numel = int(torch.Size(call.shape).numel())
    return torch.ones((numel,) if cols is None else (numel // cols, cols), dtype=call.dtype or dtype)


@contextlib.contextmanager
def masks_as_inputs(module: torch.nn.Module, calls: Sequence[RandomSite], dtype: torch.dtype, n_inputs: int,
                    cols: Sequence[int | None] | None = None) -> Iterator[tuple[list[Mask], list[torch.Tensor]]]:
    """While exporting: `module`'s forward takes, after its `n_inputs` inputs, one input per random site
    (`dropping_calls`: dropout sites that drop, and draws), laid out as `cols` says (default: flat
    vectors); each training-mode Dropout multiplies by its mask, each training-mode `nn.MultiheadAttention`
    hands its mask to `attention_mask`, and each draw of the model's code returns its input
    (`draws.AsInputs`). Yields the masks and example tensors (call order). The module is as before
    afterwards."""
    sites = dropping_calls(module, calls)
    cols = list(cols) if cols is not None else [None] * len(sites)
    masks = [Mask(call.module, p, call.dtype or dtype, call.attention, c, call.fill, call.scalars)
             for (call, p), c in zip(sites, cols)]
    current: list[torch.Tensor] = []
    patched, owners = [], {}
    drawing = draws.AsInputs(current, [k for k, (call, _) in enumerate(sites) if call.fill])
    try:
        for k, (call, _) in enumerate(sites):
            if call.fill:
                continue
            m = module.get_submodule(call.module)
            if call.attention:
                owners[m] = k
            else:
                m.forward = (lambda j: lambda x: x * current[j].reshape(x.shape))(k)
                patched.append(m)
        if sites:
            inner = module.forward

            def forward(*args: Any) -> Any:
                current[:] = args[n_inputs:]
                drawing.restart()
                return inner(*args[:n_inputs])
            module.forward = forward
            patched.append(module)
        with _innermost_attention(module) as stack, drawing if drawing.slots else contextlib.nullcontext():
            _ACTIVE.append((stack, owners, current))
            try:
                yield masks, [mask_example(call, c, dtype) for (call, _), c in zip(sites, cols)]
            finally:
                _ACTIVE.pop()
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)


#: while `masks_as_inputs` runs: the attention stack, each training-mode attention module's mask number,
#: and the masks of the forward being traced
_ACTIVE: list[tuple[list[torch.nn.Module], dict[torch.nn.Module, int], list[torch.Tensor]]] = []


def attention_drops() -> bool:
    """Whether the attention being exported now (inside the innermost `nn.MultiheadAttention`) has a mask."""
    if not _ACTIVE:
        return False
    stack, owners, _ = _ACTIVE[-1]
    return bool(stack) and stack[-1] in owners


def attention_mask(shape: torch.Size) -> torch.Tensor:
    """The mask of the attention being exported now, reshaped to its weights' `shape` (`attention_drops`)."""
    stack, owners, current = _ACTIVE[-1]
    return current[owners[stack[-1]]].reshape(shape)
