"""`gradflow.torch.compile(module, example_inputs)`: a torch model as a drop-in compiled `nn.Module`.

The compiled module *is* the original's state: it registers the original's child modules, parameters and
buffers under the same names (no prefix), so `named_parameters()`, `state_dict()`, optimizers and
`load_state_dict` see exactly the original's tensors. Its forward runs the module's ONNX export, lowered
and differentiated by gradflow, with those live tensors bound to the initializers of the same name.

One program per (train/eval modes of the modules, dtype, input shapes, which tensors need a gradient):
exported, lowered and compiled on first use, so switching `train()`/`eval()`, freezing a parameter or a
smaller last batch re-exports once, and a call under `torch.no_grad()` runs a forward-only program.
BatchNorm running statistics are updated after each training-mode call exactly as torch updates them
(`_update_batch_stats`).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree

from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.core.checks import ERROR_FLAG, FLAG_SIZE, raise_for_flag
from gradflow.core.errors import ArgumentError, InvalidArgumentError, describe
from gradflow.torch.dropout import DropoutCall, Mask, record_calls
from gradflow.torch.export import BatchStats, Exported, ExportError, adopt_model, export_module


def _option(problem: Callable[[Any], str]):
    """An attrs validator raising the `InvalidArgumentError` that names the option, when `problem(value)`
    says what is wrong ('' when fine)."""
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        text = problem(value)
        if text:
            raise InvalidArgumentError(f"option {attribute.name}={describe(value)}: {text}")
    return check


@attrs.frozen
class CompileOptions:
    """The options of `gradflow.torch.compile`, checked when it is called (see its docstring)."""

    dispatcher: str = attrs.field(default="ctypes", validator=_option(
        lambda v: "" if v in ("ctypes", "cpp") else "must be 'ctypes' or 'cpp'"))
    optimize: bool = attrs.field(default=True, validator=_option(
        lambda v: "" if isinstance(v, bool) else "must be True or False"))
    #: an ONNX model exported from the module, used instead of exporting (None: gradflow exports)
    onnx_model: Any = attrs.field(default=None, validator=_option(
        lambda v: "" if v is None or isinstance(v, (str, bytes, onnx.ModelProto)) or hasattr(v, "__fspath__")
        else "must be a path, the serialized bytes or an onnx.ModelProto"))

    #: how values reach the backward (`gradflow.Forwarding`; a byte budget is planned for the example's
    #: sizes, which every call has)
    forwarding: Forwarding = attrs.field(default=STORE_ALL, validator=_option(
        lambda v: "" if isinstance(v, Forwarding) else "must be a gradflow.Forwarding, e.g. "
        "gradflow.Forwarding.budget(1 << 20)"))

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> CompileOptions:
        """The record of keyword options; an unknown name is an `InvalidArgumentError` listing the known."""
        known = [f.name for f in attrs.fields(cls)]
        for name in options:
            if name not in known:
                raise InvalidArgumentError(f"unknown option '{name}' of gradflow.torch.compile",
                                           f"options: {', '.join(known)}")
        return cls(**options)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


@contextlib.contextmanager
def _untouched(module: torch.nn.Module):
    """Run torch's tracing of `module` without it showing: buffers (BatchNorm statistics, counters), the
    train/eval flag of the root and the random number generator are restored afterwards."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    training = module.training
    rng = torch.random.get_rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
        module.training = training
        torch.random.set_rng_state(rng)


class _Slot:
    """Where a module tensor lives: looked up at every call, since `.to()` replaces buffers (not parameters)."""

    __slots__ = ("owner", "attr", "is_param")

    def __init__(self, root: torch.nn.Module, name: str) -> None:
        path, _, self.attr = name.rpartition(".")
        self.owner = root.get_submodule(path)
        self.is_param = self.attr in self.owner._parameters

    def get(self) -> torch.Tensor:
        return (self.owner._parameters if self.is_param else self.owner._buffers)[self.attr]


class _Lowered:
    """One export of the module, lowered: which array is which input, and where each weight's value lives."""

    def __init__(self, source: torch.nn.Module, exported: Exported, program: Any, spec: Any) -> None:
        sig = program.signature
        self.spec = spec  # the structure of the forward's output, its leaves the program's outputs
        self.exported = exported
        self.graph = program.graph
        self.signature = sig
        self.inputs = [(k, p.array) for k, name in enumerate(exported.inputs) if name is not None
                       for p in sig.inputs if p.onnx_name == name]
        masks = {m.name: m for m in exported.masks}
        tensors = set(exported.tensors) - set(masks)
        #: per weight array: the slot of a module tensor, a dropout mask drawn per call, or the value of a
        #: constant initializer
        self.weights: list[tuple[str, _Slot | Mask | torch.Tensor]] = [
            (w.array, _Slot(source, w.onnx_name) if w.onnx_name in tensors else masks[w.onnx_name]
             if w.onnx_name in masks else torch.from_numpy(np.array(sig.params[w.array]))) for w in sig.weights]

    def needs_grad(self, args: Sequence[torch.Tensor]) -> tuple[bool, ...] | None:
        """Per input array (inputs, then weights): whether torch wants its gradient; None if none is wanted."""
        if not torch.is_grad_enabled():
            return None
        flags = [args[k].requires_grad for k, _ in self.inputs]
        flags += [isinstance(s, _Slot) and s.get().requires_grad for _, s in self.weights]
        return tuple(flags) if any(flags) else None


class _Program:
    """One compiled program of a `_Lowered` export: a `gradflow.torch.function` differentiated with respect
    to what needs a gradient, or (nothing does) the lowered graph run forward only."""

    def __init__(self, source: torch.nn.Module, lowered: _Lowered, needs_grad: tuple[bool, ...] | None,
                 options: CompileOptions) -> None:
        sig = lowered.signature
        ports = {p.onnx_name: p for p in sig.outputs}
        self.lowered = lowered
        self.outputs = [ports[name] for name in lowered.exported.outputs]
        self.batchnorms = [(source.get_submodule(s.module), s) for s in lowered.exported.stats]
        stats_ports = [ports[name] for s in lowered.exported.stats for name in (s.mean_output, s.var_output)]
        #: running statistics this call updates: passed as copies, so the update cannot touch a saved value
        self.updated = {(id(bn), attr) for bn, _ in self.batchnorms for attr in ("running_mean", "running_var")}
        self.in_arrays = [a for _, a in lowered.inputs] + [a for a, _ in lowered.weights]
        out_ports = self.outputs + stats_ports
        differentiable = [p.array for p in self.outputs if p.dtype.kind == "f"]
        wrt = [] if needs_grad is None else [a for a, need in zip(self.in_arrays, needs_grad) if need]
        self.function = self.runner = None
        if wrt and differentiable:
            from gradflow.api import vjp
            from gradflow.torch.function import function

            pair = vjp(lowered.graph, wrt=wrt, of=differentiable, optimize=options.optimize,
                       forwarding=options.forwarding)
            self.function = function(pair, inputs=self.in_arrays, outputs=[p.array for p in out_ports],
                                     dispatcher=options.dispatcher)
        else:
            from gradflow.optimize import optimized
            from gradflow.runtime.calling import Runner

            graph = optimized(lowered.graph) if options.optimize else lowered.graph
            self.runner = Runner(graph)
            self.allocate = [(p.array, [int(d) for d in p.shape] or [1], _torch_dtype(p.dtype)) for p in out_ports]

    def __call__(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        vals = [args[k] for k, _ in self.lowered.inputs]
        drawn = {m.name: m.draw() for m in self.lowered.exported.masks}  # in the order the forward uses them
        for _, slot in self.lowered.weights:
            if isinstance(slot, Mask):
                vals.append(drawn[slot.name])
            elif not isinstance(slot, _Slot):
                vals.append(slot)
            elif (id(slot.owner), slot.attr) in self.updated:
                vals.append(slot.get().detach().clone())
            else:
                vals.append(slot.get())
        if self.function is not None:
            outs = self.function(*vals)
            outs = list(outs) if isinstance(outs, tuple) else [outs]
        else:
            outs = self._run(vals)
        n = len(self.outputs)
        for k, (bn, stats) in enumerate(self.batchnorms):
            _update_batch_stats(bn, stats, outs[n + 2 * k].detach(), outs[n + 2 * k + 1].detach())
        return [o.reshape(()) if not p.shape else o for o, p in zip(outs[:n], self.outputs)]

    def _run(self, vals: list[torch.Tensor]) -> list[torch.Tensor]:
        kwargs = dict(zip(self.in_arrays, vals))
        outs = []
        for array, shape, dtype in self.allocate:
            outs.append(torch.zeros(shape, dtype=dtype))
            kwargs[array] = outs[-1]
        flag = None
        if self.lowered.signature.error_flag:
            flag = kwargs[ERROR_FLAG] = torch.zeros(FLAG_SIZE, dtype=torch.int64)
        self.runner(**kwargs)
        if flag is not None:
            raise_for_flag(flag.numpy(), self.lowered.signature.sites)
        return outs


def _update_batch_stats(bn: torch.nn.modules.batchnorm._BatchNorm, stats: BatchStats, mean: torch.Tensor,
                        var: torch.Tensor) -> None:
    """What `torch.nn.functional.batch_norm` does to the buffers in training mode: count the batch, then
    blend the batch mean and the *unbiased* batch variance into the running statistics with the module's
    momentum (or the cumulative average, 1 / batches seen, when momentum is None). torch's trace has already
    refused a batch with one value per channel, so `count` > 1."""
    with torch.no_grad():
        if bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
        unbiased = var * (stats.count / (stats.count - 1))
        bn.running_mean.copy_(factor * mean + (1 - factor) * bn.running_mean)
        bn.running_var.copy_(factor * unbiased + (1 - factor) * bn.running_var)


class CompiledModule(torch.nn.Module):
    """A drop-in for a torch module whose forward and backward run as gradflow-compiled programs.

    Made by `gradflow.torch.compile`; it shares the original's submodules, parameters and buffers."""

    def __init__(self, module: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...],
                 options: CompileOptions) -> None:
        super().__init__()
        for name, child in module.named_children():
            self.add_module(name, child)
        for name, p in module._parameters.items():
            self.register_parameter(name, p)
        for name, b in module._buffers.items():
            self.register_buffer(name, b, persistent=name not in module._non_persistent_buffers_set)
        self.training = module.training
        # plain attributes (not submodules): the original is traced, never registered twice
        self.__dict__["_gf_source"] = module
        self._gf_options = options
        self._gf_arity = len(example_inputs)
        self.__dict__["_gf_names"] = _positional_names(module)
        self._gf_modules = tuple(m for m in module.modules() if m is not module)
        self._gf_traced: dict[tuple, _Traced] = {}
        self._gf_exports: dict[tuple, _Lowered] = {}
        self._gf_programs: dict[tuple, _Program] = {}
        self._gf_given = None
        if options.onnx_model is not None:
            from gradflow.frontend.onnx.model import read_model

            self._gf_given = read_model(options.onnx_model).proto()
        # unsupported models (and a forward that returns no tensors) fail here, not at the first call
        self._export(self._modes(), example_inputs, _shapes(example_inputs))

    @property
    def original(self) -> torch.nn.Module:
        """The module this one was compiled from (it shares all its tensors), e.g. for its other methods."""
        return self._gf_source

    # -- modes and programs --------------------------------------------------------------------------
    def _modes(self) -> tuple[bool, ...]:
        return (self.training, *(m.training for m in self._gf_modules))

    def _traced(self, args: Sequence[torch.Tensor], key: tuple) -> _Traced:
        """What a forward of the module at the shapes of `args` (`key`) returns and meets, from one eager
        forward that leaves no trace (once per set of shapes)."""
        found = self._gf_traced.get(key)
        if found is None:
            module = self._gf_source
            calls: list[DropoutCall] = []
            with _untouched(module), torch.no_grad(), record_calls(module, calls):
                out = module(*[x.detach() for x in args])
            leaves, spec = pytree.tree_flatten(out)
            if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
                raise InvalidArgumentError(
                    f"{type(module).__name__}'s forward returns {describe(out)}; gradflow.torch.compile needs "
                    "tensors (or tuples, lists, dicts of tensors)")
            found = self._gf_traced[key] = _Traced(spec, tuple(tuple(t.shape) for t in leaves), tuple(calls))
        return found

    def _export(self, modes: tuple[bool, ...], args: Sequence[torch.Tensor], shapes: tuple) -> _Lowered:
        key = (modes, tuple(x.dtype for x in args), shapes)
        found = self._gf_exports.get(key)
        if found is not None:
            return found
        import gradflow.onnx

        source = self._gf_source
        traced = self._traced(args, shapes)
        if self._gf_given is not None:
            if self._gf_exports:
                raise ExportError(
                    f"the ONNX model given to gradflow.torch.compile serves the train/eval modes, dtype and input "
                    f"shapes {type(source).__name__} had when compiled; it is now called with others",
                    "compile without onnx_model= to let gradflow export the module once per mode and shapes")
            exported = adopt_model(self._gf_given, source, len(args), traced.shapes)
            found = self._gf_exports[key] = _Lowered(source, exported, gradflow.onnx.load(exported.model),
                                                     traced.spec)
            return found
        with _untouched(source):
            source.training = self.training
            exported = export_module(source, [x.detach() for x in args], traced.shapes, traced.dropouts)
        found = self._gf_exports[key] = _Lowered(source, exported, gradflow.onnx.load(exported.model), traced.spec)
        return found

    def _program(self, args: Sequence[torch.Tensor]) -> _Program:
        modes, shapes = self._modes(), _shapes(args)
        lowered = self._export(modes, args, shapes)
        needs = lowered.needs_grad(args)
        key = (modes, tuple(x.dtype for x in args), shapes, needs)
        program = self._gf_programs.get(key)
        if program is None:
            program = self._gf_programs[key] = _Program(self._gf_source, lowered, needs, self._gf_options)
        return program

    # -- calling -----------------------------------------------------------------------------------------
    def forward(self, *args: Any) -> Any:
        self._check_inputs(args)
        # as torch accepts them: a transposed, sliced or broadcast (stride 0) input is copied once into the
        # dense layout the program reads; torch's `contiguous` passes the gradient back to the caller's tensor
        args = tuple(x.contiguous() for x in args)
        program = self._program(args)
        return pytree.tree_unflatten(program(args), program.lowered.spec)

    def _input(self, k: int) -> str:
        """How the user knows input `k`: its position and, when `forward` names it, its name."""
        names = self._gf_names
        return f"input {k} ('{names[k]}')" if k < len(names) else f"input {k}"

    def _check_inputs(self, args: tuple) -> None:
        name = type(self._gf_source).__name__
        if len(args) != self._gf_arity:
            raise ArgumentError(f"the compiled {name} takes {self._gf_arity} inputs, got {len(args)}")
        for k, x in enumerate(args):
            if not isinstance(x, torch.Tensor):
                raise ArgumentError(f"{self._input(k)} of the compiled {name}: expected a tensor, got {describe(x)}")
            if x.numel() == 0:
                raise ArgumentError(f"{self._input(k)} of the compiled {name} has no elements (shape "
                                    f"{tuple(x.shape)})", "call it with a batch of at least one")

    def extra_repr(self) -> str:
        return f"gradflow.torch.compile of {type(self._gf_source).__name__}"


@attrs.frozen
class _Traced:
    """One eager forward of the module at some input shapes: its output structure and the shapes of its
    output tensors (what the export must return), and the dropout sites it met."""

    spec: Any
    shapes: tuple[tuple[int, ...], ...]
    dropouts: tuple[DropoutCall, ...]


def _shapes(args: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(x.shape) for x in args)


def _positional_names(module: torch.nn.Module) -> tuple[str, ...]:
    """The names of `module.forward`'s positional parameters, up to a `*args` (none when it has no signature
    Python can read)."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    names = []
    for p in parameters:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names.append(p.name)
    return tuple(names)


def _as_inputs(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not inputs:
        raise InvalidArgumentError(f"example_inputs must be a tensor or a tuple of tensors, got "
                                   f"{describe(example_inputs)}", "e.g. gradflow.torch.compile(model, (x,))")
    for k, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise InvalidArgumentError(f"example_inputs[{k}] must be a tensor, got {describe(x)}")
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"example_inputs[{k}] is on {x.device}; gradflow runs on the CPU")
        if x.numel() == 0:
            raise InvalidArgumentError(f"example_inputs[{k}] has no elements (shape {tuple(x.shape)})",
                                       "compile with a batch of at least one")
    return tuple(inputs)


def compile(module: torch.nn.Module, example_inputs: Any, **options: Any) -> CompiledModule:  # noqa: A001
    """A drop-in `nn.Module` for `module` whose forward and backward are gradflow-compiled.

    `example_inputs`: a tensor or tuple of tensors `module` is called with (the program for their shapes is
    built here; calls with other shapes, e.g. a smaller last batch, build one more program each, once).
    Options: `dispatcher` ('ctypes' or 'cpp', see `gradflow.torch.function`), `optimize` (as for
    `gradflow.vjp`), `forwarding` (a `gradflow.Forwarding`: what the backward keeps, e.g. a byte budget,
    planned for each call's sizes), `onnx_model` (a path, bytes or `onnx.ModelProto` exported from this
    module, used instead of exporting; it serves the modes and shapes the module has now, and must hold the module's
    tensors as initializers: `LostParameterError` otherwise). The module is exported with
    `torch.onnx.export(dynamo=False)` (a trace: Python control flow is fixed by the example inputs) once per
    combination of train/eval modes, dtype and input shapes, lazily; see docs/torch.md for what is shared, updated and
    rejected.
    """
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"module must be a torch.nn.Module, got {describe(module)}")
    return CompiledModule(module, _as_inputs(example_inputs), CompileOptions.of(options))
