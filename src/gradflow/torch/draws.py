"""Random numbers the model's forward draws (`torch.randn_like`, `torch.rand`, `.normal_()`...), with torch's
own generator.

A compiled program cannot draw torch's random numbers, and the ONNX export writes a draw as a `RandomNormal`
node gradflow cannot run as torch does (found 2026-12-05: a VAE's `mu + torch.randn_like(mu) * std` was
refused). So each draw of the model's own code becomes an input, like a dropout mask
(`gradflow.torch.dropout`): the eager trace notes each draw (`recording`: its function, shape, memory
order, dtype and scalar arguments) in the same ordered list as the dropout sites, the export hands the
program the input in its place (`as_inputs`), and every call redraws it with the same call on torch's
default generator, in the forward's order (`redraw`). A run seeded with `torch.manual_seed` therefore draws
what eager torch draws, and the backward is exact for the draws used (constants of the program, as in torch,
where they carry no gradient).

Served: `torch.randn`, `torch.rand`, `torch.randn_like`, `torch.rand_like`, `torch.normal(mean, std, size)`
with numbers for `mean` and `std`, and `Tensor.normal_` / `Tensor.uniform_` on a dense tensor of its own
(e.g. `torch.empty_like(std).normal_()`). Refused, by name and place, with `ExportError`: a draw from a
generator of the model's own (`generator=`), in place into a view or a strided tensor, and the other random
functions (integers, Bernoulli, multinomial...), which the program cannot replay. Draws inside torch's own
modules are not the model's: a lazy module's initialisation is left alone; a training-mode `nn.Dropout` is
served by its mask, and other random modules (`nn.RReLU`) are refused by the lowering.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from gradflow.torch.errors import ExportError
from gradflow.torch.stops import _users

_NORMAL = ("normal", (0.0, 1.0))
_UNIFORM = ("uniform", (0.0, 1.0))


def _scalars(args: tuple, kwargs: dict, names: tuple[str, str], defaults: tuple[float, float],
             first: int = 0) -> tuple[float, float]:
    """The two scalar arguments of a fill (mean and std, or from and to), positional from `first` or named."""
    out = []
    for k, (name, default) in enumerate(zip(names, defaults)):
        out.append(float(args[first + k]) if len(args) > first + k else float(kwargs.get(name, default)))
    return out[0], out[1]


def _fill_of(func: Callable, args: tuple, kwargs: dict) -> tuple[str, tuple[float, float]] | None:
    """How a served draw fills its result (`normal` or `uniform`, with its two scalars), or None for a
    function that draws nothing."""
    if func in (torch.randn, torch.randn_like):
        return _NORMAL
    if func in (torch.rand, torch.rand_like):
        return _UNIFORM
    if func is torch.normal:
        return "normal", _scalars(args, kwargs, ("mean", "std"), (0.0, 1.0))
    if func is torch.Tensor.normal_:
        return "normal", _scalars(args, kwargs, ("mean", "std"), (0.0, 1.0), first=1)
    if func is torch.Tensor.uniform_:
        return "uniform", _scalars(args, kwargs, ("from", "to"), (0.0, 1.0), first=1)
    return None


_SERVED = (torch.randn, torch.rand, torch.randn_like, torch.rand_like, torch.normal, torch.Tensor.normal_,
           torch.Tensor.uniform_)
_IN_PLACE = (torch.Tensor.normal_, torch.Tensor.uniform_)
#: random functions a program cannot replay
_REFUSED = {f for f in (
    torch.randint, torch.randint_like, torch.randperm, torch.bernoulli, torch.multinomial, torch.poisson,
    torch.Tensor.bernoulli_, torch.Tensor.bernoulli, torch.Tensor.random_, torch.Tensor.exponential_,
    torch.Tensor.cauchy_, torch.Tensor.log_normal_, torch.Tensor.geometric_, torch.Tensor.multinomial)}


def _name(func: Callable) -> str:
    owner = "Tensor." if getattr(func, "__objclass__", None) is not None or func in _IN_PLACE else "torch."
    return owner + getattr(func, "__name__", str(func))


def _model_frame() -> Any | None:
    """The frame of the model's code that called the torch function being handled (None: torch's or
    gradflow's own code called it)."""
    frame = sys._getframe(2)  # _model_frame <- __torch_function__ <- the caller (the served are C functions)
    while frame is not None and frame.f_code.co_name == "__torch_function__":
        frame = frame.f_back  # another mode's handler (gradflow.torch.stops) passing the call on
    return frame if frame is not None and _users(frame) else None


def _where(frame: Any) -> str:
    name = frame.f_code.co_filename
    return f" at {name}:{frame.f_lineno}" if not name.startswith("<") else ""


def _check(func: Callable, args: tuple, kwargs: dict, frame: Any) -> None:
    """Refuse a draw of the model's that no input can stand for (module doc)."""
    if func in _REFUSED:
        raise ExportError(f"{_name(func)}{_where(frame)} draws random numbers gradflow cannot replay in a compiled "
                          "program", "draw them outside the model and pass them in as an input, or use "
                          "torch.rand/torch.randn (served)")
    if kwargs.get("generator") is not None:
        raise ExportError(f"{_name(func)}{_where(frame)} draws from a generator of the model's own: gradflow "
                          "redraws from torch's default generator only", "draw without generator=, or pass the "
                          "draws in as an input")
    if func is torch.normal and any(isinstance(a, torch.Tensor) for a in (*args[:2], kwargs.get("mean"),
                                                                           kwargs.get("std"))):
        raise ExportError(f"torch.normal{_where(frame)} with a tensor mean or std: gradflow redraws draws of "
                          "fixed mean and std only", "write mean + std * torch.randn_like(std)")
    if func in _IN_PLACE:
        target = args[0]
        if target._base is not None or tuple(target.stride()) != tuple(torch.empty_like(target).stride()):
            raise ExportError(f"{_name(func)}{_where(frame)} draws in place into a view or strided tensor",
                              "draw into a tensor of its own, e.g. torch.empty_like(x).normal_()")


class Recording(TorchFunctionMode):
    """While active (the compiled module's eager trace), each draw of the model's code runs as usual and is
    appended to `calls` as a `RandomSite` (via `site`, which makes the record), checked (`_check`)."""

    def __init__(self, calls: list, site: Callable[..., Any]) -> None:
        super().__init__()
        self.calls = calls
        self.site = site
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SERVED or func in _REFUSED:
            frame = _model_frame()
            if frame is not None:
                _check(func, args, kwargs, frame)
                out = func(*args, **kwargs)
                fill, scalars = _fill_of(func, args, kwargs)
                self.calls.append(self.site(f"{_name(func)} (draw {self.count}{_where(frame)})", tuple(out.shape),
                                            strides=tuple(out.stride()), fill=fill, scalars=scalars,
                                            dtype=out.dtype))
                self.count += 1
                return out
        return func(*args, **kwargs)


class AsInputs(TorchFunctionMode):
    """While active (the export), the k-th draw of the model's code returns instead `current[slots[k]]`
    (the program's input for it), reshaped to the draw's shape; an in-place draw copies it into its tensor.
    `restart` is called at the start of each forward."""

    def __init__(self, current: list[torch.Tensor], slots: Sequence[int]) -> None:
        super().__init__()
        self.current = current
        self.slots = list(slots)
        self.count = 0

    def restart(self) -> None:
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SERVED and self.count < len(self.slots) and _model_frame() is not None:
            value = self.current[self.slots[self.count]]
            self.count += 1
            if func in _IN_PLACE:
                return args[0].copy_(value.reshape(args[0].shape))
            if func in (torch.randn_like, torch.rand_like):
                shape = args[0].shape
            else:
                shape = kwargs.get("size", args[2] if func is torch.normal else args)
                if func is not torch.normal and len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
                    shape = args[0]
            return value.reshape(tuple(shape))
        return func(*args, **kwargs)


def redraw(shape: Sequence[int], strides: Sequence[int] | None, dtype: torch.dtype, fill: str,
           scalars: tuple[float, float]) -> torch.Tensor:
    """The draw the eager forward makes at a site (same shape, memory order, dtype and fill, from torch's
    default generator), in logical order."""
    out = (torch.empty(tuple(shape), dtype=dtype) if strides is None
           else torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype))
    (out.normal_ if fill == "normal" else out.uniform_)(*scalars)
    return out.contiguous()
