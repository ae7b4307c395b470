"""What the ONNX export of a module's forward drops without a word: detaches, `.data`, the backward of an
`autograd.Function`.

torch stops the gradient at a detach; ONNX has no such stop, so the exported graph carries the value
straight through and gradflow would differentiate through it: a different gradient, silently (found by a
model written outside the project on 2026-12-05: `h * h.detach().sum(-1, keepdim=True)` trained with a
gradient off by 0.6). `recorded` notes the detaches the user's own code makes during the compiled module's
eager trace (calls from torch's and gradflow's own modules are theirs, not the model's); a program that
trains is then refused (`compiled._Program`), while forward-only calls, which a detach does not change, run.

A user-defined `torch.autograd.Function` is the same kind of loss: the export traces its forward, its
backward is lost, and gradflow differentiates the forward instead (a straight-through ReLU, forward
`clamp(min=0)` and backward the identity: gradient off by 4.2). Its applications are recorded too, in
eager code (`Function.apply`) and in a graph Dynamo captured (its `autograd_function_apply` operator).

`h.data` is worse: the trace records its value as a constant, so the compiled module computes with the
example's values at every later call (an output off by 2.2 for other inputs). Reading it in forward is
refused whatever the call (`data at file:line`); `detach_()` counts as a detach.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Sequence

import torch

from gradflow.torch.errors import DroppedOptionError


def _models(module: str) -> bool:
    """Whether code of the module named `module` is the model's: not torch's, not gradflow's (an FX graph
    Dynamo captured from the model counts as the model's)."""
    return not any(module == p or module.startswith(p + ".") for p in ("torch", "gradflow"))


def _users(frame: Any) -> bool:
    """Whether `frame` runs the model's code."""
    return _models(str(frame.f_globals.get("__name__", "")))


def _custom(fn: type) -> bool:
    """Whether an `autograd.Function` subclass is the model's."""
    return _models(str(getattr(fn, "__module__", "")))


@contextlib.contextmanager
def recorded() -> Iterator[list[str]]:
    """While active, what the model's code does that stops or replaces torch's gradient, in call order:
    `detach at file:line` (`detach` in code Dynamo generated), `data at file:line`, or `Name, an
    autograd.Function` (one with its own backward; `an autograd.Function` where a Dynamo graph hides its
    name)."""
    found: list[str] = []
    method, function = torch.Tensor.detach, torch.detach
    apply = torch.autograd.Function.__dict__["apply"]
    hop = type(torch.ops.higher_order.autograd_function_apply)
    hop_call = hop.__call__
    detach_ = torch.Tensor.detach_
    data = torch._C.TensorBase.__dict__["data"]

    def note(what: str = "detach") -> None:
        frame = sys._getframe(2)  # note <- the patched method <- its caller
        if _users(frame):
            found.append(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}"
                         if not frame.f_code.co_filename.startswith("<") else what)

    def detach_in_place(self, *args, **kwargs):
        note()
        return detach_(self, *args, **kwargs)

    def data_read(self):
        note("data")
        return data.__get__(self)

    def data_write(self, value):
        data.__set__(self, value)

    def apply_noted(cls, *args, **kwargs):
        if _custom(cls):
            found.append(f"{cls.__qualname__}, an autograd.Function")
        return apply.__func__(cls, *args, **kwargs)

    def hop_noted(self, *args, **kwargs):
        found.append("an autograd.Function")
        return hop_call(self, *args, **kwargs)

    def detach_method(self, *args, **kwargs):
        note()
        return method(self, *args, **kwargs)

    def detach_function(x, *args, **kwargs):
        note()
        return function(x, *args, **kwargs)

    torch.Tensor.detach, torch.detach = detach_method, detach_function  # type: ignore[method-assign]
    torch.Tensor.detach_ = detach_in_place  # type: ignore[method-assign]
    torch.Tensor.data = property(data_read, data_write)  # type: ignore[assignment, method-assign]
    torch.autograd.Function.apply = classmethod(apply_noted)  # type: ignore[method-assign, assignment]
    hop.__call__ = hop_noted  # type: ignore[method-assign]
    try:
        yield found
    finally:
        torch.Tensor.detach, torch.detach = method, function  # type: ignore[method-assign]
        torch.Tensor.detach_ = detach_  # type: ignore[method-assign]
        del torch.Tensor.data  # TensorBase's own descriptor again
        torch.autograd.Function.apply = apply  # type: ignore[method-assign]
        hop.__call__ = hop_call  # type: ignore[method-assign]


def refuse(found: Sequence[str], module: Any, training: bool) -> None:
    """Raise for the first of `found` (what `recorded` noted) that changes this call's result: a `.data` read
    always, a detach or an `autograd.Function` when the call trains. The error names `module` as the user
    knows it (a Dynamo graph's `owner`)."""
    owner = getattr(module, "owner", type(module).__name__)
    for what in found:
        kind, _, where = what.partition(" at ")
        at = f" ({where})" if where else ""
        if kind == "data":
            raise DroppedOptionError(
                f"{owner} reads a tensor's .data in its forward{at}: the export gradflow.torch.compile traces "
                "records its value at the example as a constant, so the compiled module would compute with the "
                "example's values at every later call",
                "use .detach() for a value without gradient (its training is refused for the same reason, but "
                "forward-only calls run), or compute it outside the module and pass it in")
        if not training:
            continue
        if kind == "detach":
            raise DroppedOptionError(
                f"{owner} detaches a tensor in its forward{at}: torch stops the gradient there, but ONNX has no "
                "such stop and the export gradflow.torch.compile traces writes the value straight through, so "
                "training through gradflow would give another gradient",
                "compute the detached value outside the compiled module and pass it in as an input that does not "
                "require grad; a call under torch.no_grad() runs as it is")
        raise DroppedOptionError(
            f"{owner} applies {what} with its own backward: the export gradflow.torch.compile traces keeps its "
            "forward only, so training through gradflow would differentiate that forward instead",
            "write the function with torch operations whose own gradient is the one wanted, or call it outside "
            "the compiled module; a call under torch.no_grad() runs as it is")
