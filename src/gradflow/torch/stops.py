"""Where the model's forward stops or replaces torch's gradient: detaches, `.data`, the backward of an
`autograd.Function`.

torch stops the gradient at a detach; ONNX has no such stop, so the TorchScript export writes the value
straight through, and gradflow differentiated through it: a different gradient, silently (found by a model
written outside the project on 2026-12-05: `h * h.detach().sum(-1, keepdim=True)` trained with a gradient
off by 0.6). `exported_as_stops` makes each detach of the model's own code (`Tensor.detach`, `torch.detach`)
a `_Stop` while the module is exported, which the exporter writes as a `StopGradient` node of gradflow's
domain, lowered to a stop of the gradient (`core.stop_gradient`): the compiled module trains as torch does.
`recorded` notes the same detaches during the compiled module's eager trace (calls from torch's and
gradflow's own modules are theirs, not the model's), for a model given as ONNX (`onnx_model=`), which has
no stops: training it is refused. An in-place `detach_()` is not turned into a stop and is refused when
the call trains.

A user-defined `torch.autograd.Function` is a loss of the same kind: the export traces its forward, its
backward is lost, and gradflow would differentiate the forward instead (a straight-through ReLU, forward
`clamp(min=0)` and backward the identity: gradient off by 4.2). Its applications are recorded too, in
eager code (`Function.apply`) and in a graph Dynamo captured (its `autograd_function_apply` operator),
and refused when the call trains.

`h.data` is worse: the trace records its value as a constant, so the compiled module computes with the
example's values at every later call (an output off by 2.2 for other inputs). Reading it in forward is
refused whatever the call (`data at file:line`).

Gradients turned off inside forward (`with torch.no_grad():`, `set_grad_enabled(False)`, `inference_mode`;
a submodule's forward under `@torch.no_grad()`) leave values without gradient in torch; the trace recorded
them as any other (a gradient off by 2.1, silently, found 2026-12-05). While gradflow exports, gradients
are on (whatever the calling code had) and `_StoppedWithoutGrad` stops every floating result of a torch
function computed where the model turned them off.

Gradient hooks are torch's alone: one the forward registers on a tensor (`h.register_hook(fn)`; Dynamo's
`register_hook` operator in a captured graph) and a module's backward hooks (`register_full_backward_hook`
on the model or a submodule) are never called by gradflow's backward (found 2026-12-05: a hook scaling the
gradient by 3 was skipped, the gradient off by 5.4, silently; a submodule's backward hook, off by 0.97).
Training is refused when the trace or the export met the first (`exported_as_stops` lists them; the
export runs with gradients, so a hook under `if h.requires_grad:` is seen) or the model has the second
(`refuse_backward_hooks`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Sequence

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from gradflow.frontend.onnx.table import GRADFLOW_DOMAIN
from gradflow.torch.errors import DroppedOptionError


def _hook_operator() -> type | None:
    """The class of Dynamo's `register_hook` operator (a gradient hook the model's forward registers, as it
    appears in a captured graph), where this torch has one."""
    try:
        from torch._higher_order_ops.register_hook import RegisterHookOp
    except ImportError:
        return None
    return RegisterHookOp


@contextlib.contextmanager
def _hook_operator_noting(found: list[str]) -> Iterator[None]:
    """While active, Dynamo's `register_hook` operator (where this torch has one) appends "register_hook" to
    `found` and registers nothing: gradflow's backward would never call the hook."""
    op = _hook_operator()
    if op is None:
        yield
        return
    call = op.__call__

    def noted(self, tensor, *args, **kwargs):
        found.append("register_hook")
        return tensor

    op.__call__ = noted  # type: ignore[method-assign]
    try:
        yield
    finally:
        op.__call__ = call  # type: ignore[method-assign]


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
    register_hook = torch.Tensor.register_hook
    data = torch._C.TensorBase.__dict__["data"]

    def note(what: str = "detach") -> None:
        frame = sys._getframe(2)  # note <- the patched method <- its caller
        if _users(frame):
            found.append(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}"
                         if not frame.f_code.co_filename.startswith("<") else what)

    def detach_in_place(self, *args, **kwargs):
        note("detach_")
        return detach_(self, *args, **kwargs)

    def hook_noted(self, hook):
        note("register_hook")
        if _users(sys._getframe(1)) or not self.requires_grad:
            return _NoHook()  # the trace runs without gradients, where torch would refuse the hook
        return register_hook(self, hook)

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
    torch.Tensor.register_hook = hook_noted  # type: ignore[method-assign]
    torch.Tensor.data = property(data_read, data_write)  # type: ignore[assignment, method-assign]
    torch.autograd.Function.apply = classmethod(apply_noted)  # type: ignore[method-assign, assignment]
    hop.__call__ = hop_noted  # type: ignore[method-assign]
    try:
        with _hook_operator_noting(found):
            yield found
    finally:
        torch.Tensor.detach, torch.detach = method, function  # type: ignore[method-assign]
        torch.Tensor.detach_ = detach_  # type: ignore[method-assign]
        torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]
        del torch.Tensor.data  # TensorBase's own descriptor again
        torch.autograd.Function.apply = apply  # type: ignore[method-assign]
        hop.__call__ = hop_call  # type: ignore[method-assign]


class _Stop(torch.autograd.Function):
    """x with no gradient, which the TorchScript exporter writes as gradflow's `StopGradient` node."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> None:
        return None

    @staticmethod
    def symbolic(g: Any, x: Any) -> Any:
        return g.op(f"{GRADFLOW_DOMAIN}::StopGradient", x).setType(x.type())


def stopped(x: torch.Tensor) -> torch.Tensor:
    """`x` with no gradient, exported as gradflow's `StopGradient` (for what gradflow itself writes into an
    export, such as an embedding's padding row)."""
    return _Stop.apply(x)


class _StoppedWithoutGrad(TorchFunctionMode):
    """While gradients are off inside the exported forward (the model's `with torch.no_grad():`, a
    `set_grad_enabled(False)` or `inference_mode` region; the export itself runs with them on), every
    floating-point tensor a torch function returns is `_Stop`ped: in torch such a value carries no gradient,
    and the trace would otherwise record it as any other."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            return out
        return pytree.tree_map(lambda t: _Stop.apply(t) if isinstance(t, torch.Tensor) and t.is_floating_point()
                               else t, out)


class _NoHook:
    """The handle of a gradient hook that was noted, not registered."""

    def remove(self) -> None:
        pass


@contextlib.contextmanager
def exported_as_stops() -> Iterator[list[str]]:
    """While active, the detaches the model's own code makes (`Tensor.detach`, `torch.detach`; those of
    torch's and gradflow's modules are left alone, as `recorded` leaves them) are `_Stop`, which the
    TorchScript exporter writes as a `StopGradient` node (the exporter imports its domain at version 1; naming
    it in `custom_opsets` would warn on every model without a detach): the lowered
    program then stops the gradient where torch does. The gradient hooks the model's code registers on its
    tensors (`register_hook at file:line`, which the export runs with gradients, so also those under an
    `if h.requires_grad:`) are listed, not registered: no program calls them."""
    method, function = torch.Tensor.detach, torch.detach
    register_hook = torch.Tensor.register_hook
    hooks: list[str] = []

    def detach_method(self, *args, **kwargs):
        if _users(sys._getframe(1)):
            return _Stop.apply(self)
        return method(self, *args, **kwargs)

    def detach_function(x, *args, **kwargs):
        if _users(sys._getframe(1)):
            return _Stop.apply(x)
        return function(x, *args, **kwargs)

    def hook_listed(self, hook):
        frame = sys._getframe(1)
        if not _users(frame):
            return register_hook(self, hook)
        hooks.append(f"register_hook at {frame.f_code.co_filename}:{frame.f_lineno}"
                     if not frame.f_code.co_filename.startswith("<") else "register_hook")
        return _NoHook()

    torch.Tensor.detach, torch.detach = detach_method, detach_function  # type: ignore[method-assign]
    torch.Tensor.register_hook = hook_listed  # type: ignore[method-assign]
    try:
        # gradients off inside are the model's own doing
        with torch.enable_grad(), _StoppedWithoutGrad(), _hook_operator_noting(hooks):
            yield hooks
    finally:
        torch.Tensor.detach, torch.detach = method, function  # type: ignore[method-assign]
        torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]


def refuse(found: Sequence[str], module: Any, training: bool, stops_exported: bool = True) -> None:
    """Raise for the first of `found` (what `recorded` noted) that changes this call's result: a `.data` read
    always; when the call trains, an in-place `detach_()`, an `autograd.Function`, and a detach unless the
    export wrote the detaches as stops (`stops_exported`: gradflow's own export; a model given as ONNX has none).
    The error names `module` as the user knows it (a Dynamo graph's `owner`)."""
    owner = getattr(module, "owner", type(module).__name__)
    for what in found:
        kind, _, where = what.partition(" at ")
        at = f" ({where})" if where else ""
        if kind == "data":
            raise DroppedOptionError(
                f"{owner} reads a tensor's .data in its forward{at}: the export gradflow.torch.compile traces "
                "records its value at the example as a constant, so the compiled module would compute with the "
                "example's values at every later call",
                "use .detach() for a value without gradient, or compute it outside the module and pass it in")
        if not training or (kind == "detach" and stops_exported):
            continue
        if kind == "detach":
            raise DroppedOptionError(
                f"{owner} detaches a tensor in its forward{at}: torch stops the gradient there, but the ONNX model "
                "given to gradflow.torch.compile has no such stop (ONNX has none), so training through gradflow "
                "would give another gradient",
                "compile without onnx_model=: gradflow's own export writes each detach as a stop")
        if kind == "register_hook":
            raise DroppedOptionError(
                f"{owner} registers a gradient hook on a tensor in its forward{at}: the compiled module's "
                "backward is gradflow's program, which does not call it, so training through gradflow would "
                "give another gradient (or skip what the hook does)",
                "register the hook on the compiled module's output or inputs, outside forward, or train the "
                "module with eager torch; a call under torch.no_grad() runs as it is")
        if kind == "detach_":
            raise DroppedOptionError(
                f"{owner} detaches a tensor in place in its forward{at} (detach_()): the export gradflow.torch."
                "compile traces does not see where the gradient stops, so training through gradflow would give "
                "another gradient",
                "write h = h.detach() instead, which gradflow exports as a stop of the gradient")
        raise DroppedOptionError(
            f"{owner} applies {what} with its own backward: the export gradflow.torch.compile traces keeps its "
            "forward only, so training through gradflow would differentiate that forward instead",
            "write the function with torch operations whose own gradient is the one wanted, or call it outside "
            "the compiled module; a call under torch.no_grad() runs as it is")


def refuse_backward_hooks(module: torch.nn.Module) -> None:
    """Raise when `module` or one of its submodules (or every module: torch's global hooks) has a backward
    hook (`register_full_backward_hook`, `register_backward_hook`, `register_full_backward_pre_hook`): the
    compiled module's backward is gradflow's program, which calls none of them."""
    import torch.nn.modules.module as modules

    named = [name for name, m in module.named_modules() if _hooked(m)]
    if not named and not (modules._global_backward_hooks or modules._global_backward_pre_hooks):
        return
    where = "torch has global" if not named else "it has" if not named[0] else f"its submodule '{named[0]}' has"
    raise DroppedOptionError(
        f"{type(module).__name__} is trained through gradflow, but {where} backward hooks "
        "(register_full_backward_hook or its kin): the compiled module's backward is gradflow's program, which "
        "calls none of them, so the gradients would differ from torch's (or what the hooks do be skipped)",
        "remove the hooks before compiling (hooks on the compiled module itself run), or train with eager torch")


def _hooked(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "_backward_hooks", None) or getattr(module, "_backward_pre_hooks", None))
