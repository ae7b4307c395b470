"""`gradflow.torch.compile(module, example_inputs)`: a torch model as a drop-in compiled `nn.Module`.

The compiled module *is* the original's state: it registers the original's child modules, parameters and
buffers under the same names (no prefix), so `named_parameters()`, `state_dict()`, optimizers and
`load_state_dict` see exactly the original's tensors. Its forward runs the module's ONNX export, lowered
and differentiated by gradflow, with those live tensors bound to the initializers of the same name.

Programs per (train/eval modes of the modules, dtype, which tensors need a gradient), exported,
lowered and compiled on first use, so switching `train()`/`eval()` or freezing a parameter builds once
more, and a call under `torch.no_grad()` runs a forward-only program: one for the example's input shapes,
and one whose batch dimension (the first of the inputs) is symbolic for every other batch size, where
`gradflow.torch.batch` finds that the trace does not depend on the batch size; otherwise, and for calls
with other shapes, one program per input shapes.
BatchNorm running statistics are updated after each training-mode call exactly as torch updates them
(`_update_batch_stats`).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any, Callable, Mapping, Sequence

import attrs
import dace
import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree

from gradflow.at_call import plans_at_call
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.core.checks import ERROR_FLAG, FLAG_SIZE, raise_for_flag
from gradflow.core.errors import ArgumentError, GradflowError, InvalidArgumentError, describe
from gradflow.torch import batch as batching
from gradflow.torch import stops
from gradflow.torch.dropout import RandomSite, dropping_calls, record_calls
from gradflow.torch.embedding import recorded, refuse
from gradflow.torch.errors import DroppedOptionError
from gradflow.torch.export import Exported, ExportError, adopt_model, export_module, named_tensors


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
    #: the batch (first) dimension of the inputs symbolic: one program for every batch size, where the trace
    #: allows (`gradflow.torch.batch`); False: one program per input shapes, as torch.compile(dynamic=False)
    dynamic: bool = attrs.field(default=True, validator=_option(
        lambda v: "" if isinstance(v, bool) else "must be True or False"))
    #: an ONNX model exported from the module, used instead of exporting (None: gradflow exports)
    onnx_model: Any = attrs.field(default=None, validator=_option(
        lambda v: "" if v is None or isinstance(v, (str, bytes, onnx.ModelProto)) or hasattr(v, "__fspath__")
        else "must be a path, the serialized bytes or an onnx.ModelProto"))

    #: how values reach the backward (`gradflow.Forwarding`; a byte budget or checkpointing is planned for
    #: each call's sizes, once per batch size)
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
def _untouched(module: torch.nn.Module, training: bool):
    """Run torch's tracing of `module`, its root in mode `training` (the compiled module's), without it
    showing: buffers (BatchNorm statistics, counters), parameters, the train/eval flag of the root and the
    random number generator are restored afterwards. Yields a list that then names the buffers and
    parameters the run changed in place, BatchNorm's buffers aside (the compiled module updates those)."""
    saved = [(name, b, b.detach().clone()) for name, b in (*module.named_buffers(), *module.named_parameters())
             if not torch.nn.parameter.is_lazy(b)]  # a lazy module's first forward makes its tensors
    norms = {name for name, m in module.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    rng = torch.random.get_rng_state()
    training, module.training = module.training, training
    changed: list[str] = []
    try:
        yield changed
    finally:
        with torch.no_grad():
            for name, b, value in saved:
                if name.rpartition(".")[0] not in norms and not torch.equal(b, value) and not (
                        b.is_floating_point() and torch.isnan(value).any()):
                    changed.append(name)
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
    """One export of the module, lowered: which array is which input, dropout mask and weight, and where
    each weight's value lives; `batch` is the symbol of the batch dimension (None: fixed shapes)."""

    def __init__(self, source: torch.nn.Module, exported: Exported, program: Any, spec: Any) -> None:
        sig = program.signature
        self.spec = spec  # the structure of the forward's output, its leaves the program's outputs
        self.exported = exported
        self.graph = program.graph
        self.signature = sig
        ports = {p.onnx_name: p for p in sig.inputs}
        self.inputs = [(k, ports[name].array) for k, name in enumerate(exported.inputs) if name in ports]
        self.masks = [(mask, ports[name]) for mask, name in zip(exported.masks, exported.mask_inputs)
                      if name in ports]
        tensors = set(exported.tensors)
        #: per weight array: the slot of a module tensor, or the value of a constant initializer
        self.weights: list[tuple[str, _Slot | torch.Tensor]] = [
            (w.array, _Slot(source, w.onnx_name) if w.onnx_name in tensors
             else torch.from_numpy(np.array(sig.params[w.array]))) for w in sig.weights]
        self.arrays = [a for _, a in self.inputs] + [p.array for _, p in self.masks] + [a for a, _ in self.weights]
        #: the program's size symbols (a batch program has one, the batch; a given ONNX model may have more)
        self.symbols = sorted({str(s) for p in (*sig.inputs, *sig.outputs) for d in p.shape for s in _symbols_of(d)})
        self.batch = self.symbols[0] if len(self.symbols) == 1 else None

    def needs_grad(self, args: Sequence[torch.Tensor]) -> tuple[bool, ...] | None:
        """Per input array (inputs, masks, then weights): whether torch wants its gradient; None if none is."""
        if not torch.is_grad_enabled():
            return None
        flags = [args[k].requires_grad for k, _ in self.inputs] + [False] * len(self.masks)
        flags += [isinstance(s, _Slot) and s.get().requires_grad for _, s in self.weights]
        return tuple(flags) if any(flags) else None

    def shape(self, port: Any, size: int | None) -> tuple[int, ...]:
        """The shape of `port` at batch `size`."""
        bind = {} if self.batch is None else {self.batch: size}
        return tuple(int(d) if isinstance(d, (int, np.integer)) else int(dace.symbolic.evaluate(d, bind))
                     for d in port.shape)

    def serves(self, traced: _Traced, sites: Sequence[RandomSite], size: int | None) -> bool:
        """Whether this program computes what the eager forward `traced` did (at batch `size`): the same
        output shapes and the same dropout sites, each mask of the program's size."""
        outputs = {p.onnx_name: p for p in self.signature.outputs}
        if tuple(self.shape(outputs[name], size) for name in self.exported.outputs) != traced.shapes:
            return False
        if [c.module for c in sites] != [m.module for m in self.exported.masks]:
            return False
        numels = {m.module: int(np.prod(self.shape(p, size), dtype=np.int64)) for m, p in self.masks}
        return all(numels.get(c.module, -1) in (-1, int(np.prod(c.shape, dtype=np.int64))) for c in sites)


def _symbols_of(d: Any) -> set:
    return set() if isinstance(d, (int, np.integer)) else set(getattr(d, "free_symbols", ()))


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
        self.stats_ports = [ports[name] for s in lowered.exported.stats for name in (s.mean_output, s.var_output)]
        #: running statistics this call updates: passed as copies, so the update cannot touch a saved value
        self.updated = {(id(bn), attr) for bn, _ in self.batchnorms for attr in ("running_mean", "running_var")}
        self.differentiable = [p.array for p in self.outputs if p.dtype.kind == "f"]
        self.wrt = [] if needs_grad is None else [a for a, need in zip(lowered.arrays, needs_grad) if need]
        self.options = options
        #: a byte budget or checkpointing of a batch program is planned per batch size (the sizes it prices)
        self.per_size = plans_at_call(options.forwarding) and lowered.batch is not None
        self.functions: dict[int | None, Any] = {}
        self.runner = None
        if self.wrt and self.differentiable:
            if not self.per_size:
                self._function(None)
        else:
            from gradflow.optimize import optimized
            from gradflow.runtime.calling import Runner

            graph = optimized(lowered.graph) if options.optimize else lowered.graph
            self.runner = Runner(graph)

    def __call__(self, args: Sequence[torch.Tensor], traced: _Traced, sites: Sequence[RandomSite],
                 size: int | None) -> list[torch.Tensor]:
        """Run on `args`, whose eager forward is `traced` (at batch `size`) and meets the dropout `sites`."""
        lowered = self.lowered
        vals = [args[k] for k, _ in lowered.inputs]
        # every site's mask is drawn, in the forward's order, as eager torch draws them (also one the graph
        # does not read), so the generator stays where eager torch would leave it
        drawn = {mask.module: mask.draw(call) for mask, call in zip(lowered.exported.masks, sites)}
        vals += [drawn[mask.module] for mask, _ in lowered.masks]
        for _, slot in lowered.weights:
            if not isinstance(slot, _Slot):
                vals.append(slot)
            elif (id(slot.owner), slot.attr) in self.updated:
                vals.append(slot.get().detach().clone())
            else:
                vals.append(slot.get())
        if self.runner is None:
            outs = self._function(size)(*vals)
            outs = list(outs) if isinstance(outs, tuple) else [outs]
        else:
            outs = self._run(vals, traced, size)
        n = len(self.outputs)
        counts = traced.counts_for([stats.module for _, stats in self.batchnorms])
        for k, ((bn, _), count) in enumerate(zip(self.batchnorms, counts)):
            _update_batch_stats(bn, count, outs[n + 2 * k].detach(), outs[n + 2 * k + 1].detach())
        return [o.reshape(()) if not p.shape else o for o, p in zip(outs[:n], self.outputs)]

    def _function(self, size: int | None) -> Any:
        """The `gradflow.torch.function` of the vjp (for batch `size` when planned per size), built once."""
        key = size if self.per_size else None
        found = self.functions.get(key)
        if found is None:
            from gradflow.api import vjp
            from gradflow.torch.function import function

            forwarding = self.options.forwarding
            if self.per_size:
                forwarding = attrs.evolve(forwarding, sizes={**dict(forwarding.sizes), self.lowered.batch: size},
                                         planned_at_call=True)
            pair = vjp(self.lowered.graph, wrt=self.wrt, of=self.differentiable, optimize=self.options.optimize,
                       forwarding=forwarding)
            found = self.functions[key] = function(
                pair, inputs=self.lowered.arrays, outputs=[p.array for p in self.outputs + self.stats_ports],
                dispatcher=self.options.dispatcher)
        return found

    def _run(self, vals: list[torch.Tensor], traced: _Traced, size: int | None) -> list[torch.Tensor]:
        kwargs = dict(zip(self.lowered.arrays, vals))
        outs = []
        shapes = [*traced.shapes, *(self.lowered.shape(p, size) for p in self.stats_ports)]
        for p, shape in zip(self.outputs + self.stats_ports, shapes):
            outs.append(torch.zeros(list(shape) or [1], dtype=_torch_dtype(p.dtype)))
            kwargs[p.array] = outs[-1]
        flag = None
        if self.lowered.signature.error_flag:
            flag = kwargs[ERROR_FLAG] = torch.zeros(FLAG_SIZE, dtype=torch.int64)
        self.runner(**kwargs)
        if flag is not None:
            raise_for_flag(flag.numpy(), self.lowered.signature.sites)
        return outs


def _update_batch_stats(bn: torch.nn.modules.batchnorm._BatchNorm, count: int, mean: torch.Tensor,
                        var: torch.Tensor) -> None:
    """What `torch.nn.functional.batch_norm` does to the buffers in training mode: count the batch, then
    blend the batch mean and the *unbiased* batch variance into the running statistics with the module's
    momentum (or the cumulative average, 1 / batches seen, when momentum is None). torch's trace has already
    refused a batch with one value per channel, so `count` (values per channel) > 1."""
    with torch.no_grad():
        if bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
        unbiased = var * (count / (count - 1))
        bn.running_mean.copy_(factor * mean + (1 - factor) * bn.running_mean)
        bn.running_var.copy_(factor * unbiased + (1 - factor) * bn.running_var)


class CompiledModule(torch.nn.Module):
    """A drop-in for a torch module whose forward and backward run as gradflow-compiled programs.

    Made by `gradflow.torch.compile`; it shares the original's submodules, parameters and buffers."""

    def __init__(self, module: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...],
                 options: CompileOptions, batch: Sequence[bool] | None = None) -> None:
        """`batch`: per input, whether its first dimension is the batch (default: `batch.batch_inputs`)."""
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
        self._gf_example = _shapes(example_inputs)
        self._gf_batch = tuple(batch) if batch is not None else batching.batch_inputs(self._gf_example)
        self._gf_traced: dict[tuple, _Traced] = {}
        self._gf_exports: dict[tuple, _Lowered] = {}
        #: (modes, dtypes) -> why their trace cannot serve every batch size
        self._gf_fixed: dict[tuple, str] = {}
        self._gf_calls: dict[tuple, _Call] = {}
        self._gf_programs: dict[tuple, _Program] = {}
        self._gf_given = None
        if options.onnx_model is not None:
            from gradflow.frontend.onnx.model import read_model

            self._gf_given = read_model(options.onnx_model).proto()
        # unsupported models (and a forward that returns no tensors) fail here, not at the first call
        self._call(self._modes(), example_inputs, self._gf_example)

    @property
    def original(self) -> torch.nn.Module:
        """The module this one was compiled from (it shares all its tensors), e.g. for its other methods."""
        return self._gf_source

    # -- modes and programs --------------------------------------------------------------------------
    def _modes(self) -> tuple[bool, ...]:
        return (self.training, *(m.training for m in self._gf_modules))

    def _traced(self, args: Sequence[torch.Tensor], shapes: tuple) -> _Traced:
        """What a forward of the module in its current modes at the `shapes` of `args` returns and meets,
        from one eager forward that leaves no trace (once per modes and shapes: torch's own checks, e.g. a
        training-mode BatchNorm's of one value per channel, run for each)."""
        key = (self._modes(), shapes)
        found = self._gf_traced.get(key)
        if found is None:
            module = self._gf_source
            calls: list[RandomSite] = []
            counts: list[tuple[str, int]] = []
            with _untouched(module, self.training) as updated, torch.no_grad(), record_calls(module, calls), \
                    _record_counts(module, counts), recorded(named_tensors(module)) as dropped, \
                    stops.recorded() as detaches:
                out = module(*[x.detach() for x in args])
            if updated:
                what = "parameter" if updated[0] in dict(module.named_parameters()) else "buffer"
                raise DroppedOptionError(
                    f"{type(module).__name__} updates its {what} '{updated[0]}' in place in its forward: the ONNX "
                    "export gradflow.torch.compile traces drops in-place updates of module tensors (BatchNorm's "
                    "statistics aside), so the compiled module would neither update it nor compute with the "
                    "updated value",
                    f"update the {what} outside forward (after each step, under torch.no_grad()), or pass its "
                    "value in as an input")
            refuse(dropped, module)  # before anything is built: an option that changes the forward
            stops.refuse(detaches, module, training=False)  # a .data read: the forward itself differs
            leaves, spec = pytree.tree_flatten(out)
            if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
                raise InvalidArgumentError(
                    f"{type(module).__name__}'s forward returns {describe(out)}; gradflow.torch.compile needs "
                    "tensors (or tuples, lists, dicts of tensors)")
            found = self._gf_traced[key] = _Traced(spec, tuple(tuple(t.shape) for t in leaves), tuple(calls),
                                                   tuple(counts), tuple(detaches))
        return found

    def _sites(self, traced: _Traced) -> tuple[RandomSite, ...]:
        """The dropout sites of the eager forward `traced` that drop in the compiled module's modes."""
        with _mode(self._gf_source, self.training):
            return tuple(call for call, _ in dropping_calls(self._gf_source, traced.dropouts))

    def _call(self, modes: tuple[bool, ...], args: Sequence[torch.Tensor], shapes: tuple) -> _Call:
        """The export that serves a call with these modes and `args` (of `shapes`), with what its eager
        forward met: the batch program when the call's shapes are the example's but for another batch size
        and it serves them (`_Lowered.serves`), else the export for these shapes."""
        dtypes = tuple(x.dtype for x in args)
        key = (modes, dtypes, shapes)
        found = self._gf_calls.get(key)
        if found is not None:
            return found
        traced = self._traced(args, shapes)
        sites = self._sites(traced)
        size = None
        if (self._gf_options.dynamic and any(self._gf_batch) and self._gf_given is None
                and (modes, dtypes) not in self._gf_fixed):
            size = batching.batch_of(shapes, self._gf_example, self._gf_batch)
        if size is not None:
            # proven (or not) at the first call of these modes, the example's in `compile`: no later export
            lowered = self._batch_export(modes, dtypes, args, traced, sites, size)
            # the example's shapes, which most calls have, get a program of their own: fixed sizes let
            # DaCe and the optimizer specialise (measured 3-22% faster, benchmarks/results/batch_program.md)
            if shapes != self._gf_example and lowered is not None and lowered.serves(traced, sites, size):
                found = self._gf_calls[key] = _Call(lowered, traced, sites, size)
                return found
        found = self._gf_calls[key] = _Call(self._export(modes, args, shapes, traced), traced, sites, None)
        return found

    def _batch_export(self, modes: tuple[bool, ...], dtypes: tuple, args: Sequence[torch.Tensor], traced: _Traced,
                      sites: Sequence[RandomSite], size: int) -> _Lowered | None:
        """The export with a symbolic batch for these modes and dtypes (traced at `args`, of batch `size`),
        or None (with a `BatchSpecializationWarning` saying why) when `gradflow.torch.batch` does not find
        that it serves every batch size."""
        key = (modes, dtypes, "batch")
        found = self._gf_exports.get(key)
        if found is None:
            try:
                found = self._gf_exports[key] = self._export_batch(args, traced, sites, size)
            except _PerBatch as exc:
                self._gf_fixed[(modes, dtypes)] = str(exc)
                warnings.warn(f"gradflow.torch.compile builds one program per batch size for "
                              f"{type(self._gf_source).__name__}: {exc}", batching.BatchSpecializationWarning,
                              stacklevel=5)
        return found

    def _export_batch(self, args: Sequence[torch.Tensor], traced: _Traced, sites: Sequence[RandomSite],
                      size: int) -> _Lowered:
        import gradflow.onnx

        flags = self._gf_batch
        bigger = batching.grown(args, flags)
        try:
            traced1 = self._traced(bigger, _shapes(bigger))
        except Exception as exc:  # the module's own forward: whatever it raises, this size is not served
            raise _PerBatch(f"its forward at batch {size + 1} raised {type(exc).__name__}: {exc}") from exc
        sites1 = self._sites(traced1)
        if [c.module for c in sites1] != [c.module for c in sites]:
            raise _PerBatch(f"its forward drops values at other sites at batch {size + 1} than at {size}")
        cols = batching.mask_cols([int(np.prod(c.shape)) for c in sites], [int(np.prod(c.shape)) for c in sites1],
                                  size)
        if cols is None:
            raise _PerBatch("a dropout mask's size grows with the batch otherwise than by rows")
        exported = self._export_module(args, traced, batch=flags, mask_cols=cols)
        if exported.conversions:
            raise _PerBatch(f"its trace turns a traced value into a Python value ({exported.conversions[0]}), "
                            "which fixes it to one batch size; use tensor sizes as they are (x.size(0), not "
                            "int(x.size(0)) or range(x.size(0)))")
        try:
            exported1 = self._export_module(bigger, traced1, batch=flags, mask_cols=cols)
        except ExportError as exc:
            raise _PerBatch(f"its export at batch {size + 1} failed ({exc})") from exc
        if (batching.structure(exported.model, exported.tensors)
                != batching.structure(exported1.model, exported.tensors)):
            raise _PerBatch(f"its trace at batch {size + 1} is another graph than at batch {size}")
        try:
            lowered = _Lowered(self._gf_source, exported, gradflow.onnx.load(exported.model), traced.spec)
        except GradflowError as exc:
            raise _PerBatch(f"its lowering with a symbolic batch failed ({type(exc).__name__}: {exc})") from exc
        if len(lowered.symbols) != 1:
            raise _PerBatch(f"its lowered program has the size symbols {lowered.symbols}, not one batch")
        return lowered

    def _export_module(self, args: Sequence[torch.Tensor], traced: _Traced, **batch: Any) -> Exported:
        source = self._gf_source
        with _untouched(source, self.training):
            return export_module(source, [x.detach() for x in args], traced.shapes, traced.dropouts, **batch)

    def _export(self, modes: tuple[bool, ...], args: Sequence[torch.Tensor], shapes: tuple,
                traced: _Traced) -> _Lowered:
        """The export for these modes and the input `shapes` exactly (or the ONNX model given)."""
        key = (modes, tuple(x.dtype for x in args), shapes)
        found = self._gf_exports.get(key)
        if found is not None:
            return found
        import gradflow.onnx

        source = self._gf_source
        if self._gf_given is not None:
            if self._gf_exports:
                raise ExportError(
                    f"the ONNX model given to gradflow.torch.compile serves the train/eval modes, dtype and input "
                    f"shapes {type(source).__name__} had when compiled; it is now called with others",
                    "compile without onnx_model= to let gradflow export the module once per mode and shapes")
            exported = adopt_model(self._gf_given, source, len(args), traced.shapes)
        else:
            exported = self._export_module(args, traced)
        found = self._gf_exports[key] = _Lowered(source, exported, gradflow.onnx.load(exported.model), traced.spec)
        return found

    def _program(self, args: Sequence[torch.Tensor]) -> tuple[_Program, _Call]:
        call = self._call(self._modes(), args, _shapes(args))
        needs = call.lowered.needs_grad(args)
        if needs is not None:
            stops.refuse(call.traced.detaches + call.lowered.exported.hooks, self._gf_source, training=True,
                         stops_exported=self._gf_given is None)
            stops.refuse_backward_hooks(self._gf_source)
        key = (id(call.lowered), needs)
        program = self._gf_programs.get(key)
        if program is None:
            program = self._gf_programs[key] = _Program(self._gf_source, call.lowered, needs, self._gf_options)
        return program, call

    # -- calling -----------------------------------------------------------------------------------------
    def forward(self, *args: Any) -> Any:
        self._check_inputs(args)
        # as torch accepts them: a transposed, sliced or broadcast (stride 0) input is copied once into the
        # dense layout the program reads; torch's `contiguous` passes the gradient back to the caller's tensor
        args = tuple(x.contiguous() for x in args)
        program, call = self._program(args)
        return pytree.tree_unflatten(program(args, call.traced, call.sites, call.size), call.traced.spec)

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
    output tensors (what the export must return), the dropout sites it met, and the values per channel of
    each BatchNorm call (module name, count; in call order)."""

    spec: Any
    shapes: tuple[tuple[int, ...], ...]
    dropouts: tuple[RandomSite, ...]
    counts: tuple[tuple[str, int], ...] = ()
    #: what the model's code did that stops or replaces torch's gradient (`gradflow.torch.stops.recorded`)
    detaches: tuple[str, ...] = ()

    def counts_for(self, modules: Sequence[str]) -> list[int]:
        """The values per channel of the BatchNorm calls of `modules` (a module per call, in call order)."""
        left = list(self.counts)
        out = []
        for name in modules:
            k = next(k for k, (m, _) in enumerate(left) if m == name)
            out.append(left.pop(k)[1])
        return out


@attrs.frozen
class _Call:
    """What serves a call: the export, the call's eager forward, its dropout sites that drop (in order),
    and its batch size when the export is the batch program."""

    lowered: _Lowered
    traced: _Traced
    sites: tuple[RandomSite, ...]
    size: int | None


class _PerBatch(Exception):
    """The module's trace cannot serve every batch size (the message says why)."""


@contextlib.contextmanager
def _mode(module: torch.nn.Module, training: bool):
    """The root of `module` in mode `training` while the block runs."""
    saved, module.training = module.training, training
    try:
        yield
    finally:
        module.training = saved


@contextlib.contextmanager
def _record_counts(module: torch.nn.Module, counts: list[tuple[str, int]]):
    """While the block runs, append (name, values per channel) for every BatchNorm module call."""
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, name=name: counts.append((name, args[0].numel() // args[0].shape[1])))
        for name, m in module.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


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

    `example_inputs`: a tensor or tuple of tensors `module` is called with (exported and lowered here; its
    shapes get a program of their own). Every other batch size runs one program whose first input dimension
    is symbolic, exported here too, where the trace is found not to depend on the batch size
    (`gradflow.torch.batch`; else a `BatchSpecializationWarning` says why, and each batch size builds a
    program of its own, once); calls with other shapes build one program each.
    Options: `dynamic` (False: one program per input shapes), `dispatcher` ('ctypes' or 'cpp', see
    `gradflow.torch.function`), `optimize` (as for
    `gradflow.vjp`), `forwarding` (a `gradflow.Forwarding`: what the backward keeps, e.g. a byte budget,
    planned for each call's sizes), `onnx_model` (a path, bytes or `onnx.ModelProto` exported from this
    module, used instead of exporting; it serves the modes and shapes the module has now, and must hold the module's
    tensors as initializers: `LostParameterError` otherwise). The module is exported with
    `torch.onnx.export(dynamo=False)` (a trace: Python control flow is fixed by the example inputs) once per
    combination of train/eval modes and dtype (and input shapes, where the batch program does not serve),
    lazily; see docs/torch.md for what is shared, updated and rejected.
    """
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"module must be a torch.nn.Module, got {describe(module)}")
    return CompiledModule(module, _as_inputs(example_inputs), CompileOptions.of(options))
