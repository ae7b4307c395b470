"""`gradflow.torch.function`: a compiled forward/backward SDFG pair as a differentiable torch callable."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, Mapping, Sequence

import torch

from gradflow import api
from gradflow.at_call import AtCall, plans_at_call
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.spec import OVERFLOW, check_loop_bounds
from gradflow.core.checks import ERROR_FLAG, raise_for_flag
from gradflow.core.errors import ArgumentError, GradflowError, InvalidArgumentError, describe
from gradflow.core.graph import Graph, as_sdfg
from gradflow.core.names import check_identifiers
from gradflow.runtime.compile import compile_sdfg
from gradflow.runtime.plan import plan_for
from gradflow.torch import convolution
from gradflow.torch.plan import FunctionPlan, build_plan, default_inputs_outputs, differentiable_inputs

DISPATCHERS = ("ctypes", "cpp")
DEFAULT_DISPATCHER = "ctypes"

_functorch_active = torch._C._are_functorch_transforms_active


def _base_apply(cls: type[torch.autograd.Function]) -> Any:
    """`cls.apply` without the Python layer of `torch.autograd.Function.apply`, which only binds default
    arguments for a `setup_context` and routes functorch transforms (vmap, torch.func.grad, ...); gradflow
    functions define no `setup_context`, and `Function.__call__` refuses calls under functorch transforms."""
    return super(torch.autograd.Function, cls).apply


def _optional_names(value: Any, what: str) -> list[str] | None:
    """None, or `value` (a name or an iterable of names) as a list; else `InvalidArgumentError` naming `what`."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        names = list(value)
        if all(isinstance(n, str) for n in names):
            return names
    raise InvalidArgumentError(f"{what} must be None or a sequence of array names, got {describe(value)}",
                               f"e.g. {what}=['X', 'W']")


def _check_options(dispatcher: Any, convert: Any, symbols: Any) -> dict[str, int] | None:
    if not (isinstance(dispatcher, str) and dispatcher in DISPATCHERS):
        raise InvalidArgumentError(f"dispatcher must be one of {DISPATCHERS}, got {describe(dispatcher)}")
    if not isinstance(convert, bool):
        raise InvalidArgumentError(f"convert must be True or False, got {describe(convert)}")
    if symbols is None:
        return None
    if not isinstance(symbols, Mapping) or not all(
            isinstance(k, str) and isinstance(v, numbers.Integral) and not isinstance(v, bool)
            for k, v in symbols.items()):
        raise InvalidArgumentError("symbols must map symbol names to ints", "e.g. symbols={'N': 16}")
    return {k: int(v) for k, v in symbols.items()}


def _vjp_of(program: Any, inputs: Sequence[str] | None, outputs: Sequence[str] | None,
            wrt: Sequence[str] | None, forwarding: Forwarding = STORE_ALL) -> tuple[VJPResult, list[str], list[str]]:
    if isinstance(program, VJPResult):
        check_identifiers(program.forward)
        check_identifiers(program.backward)
        ins, outs = default_inputs_outputs(program.forward, outputs or program.of, program.saved)
        return program, list(inputs) if inputs is not None else ins, outs
    sdfg = as_sdfg(program)
    check_identifiers(sdfg)
    program = program if isinstance(program, Graph) else sdfg  # a Graph keeps its meta (e.g. index checks)
    ins, outs = default_inputs_outputs(sdfg, outputs)
    ins = list(inputs) if inputs is not None else ins
    if not outs:
        raise InvalidArgumentError(f"program '{sdfg.name}' returns nothing; name its outputs",
                                   "gradflow.torch.function(program, inputs=[...], outputs=[...])")
    chosen = list(wrt) if wrt is not None else differentiable_inputs(sdfg, ins)
    return api.vjp(program, wrt=chosen, of=outs, forwarding=forwarding), ins, outs


def bind_inputs(owner: str, names: Sequence[str], args: tuple, kwargs: Mapping[str, Any]) -> tuple:
    """The values of `names`, in order, from positional `args` then `kwargs`; `ArgumentError` for an
    unknown name, a name given twice, too many positional values, or a missing input."""
    if len(args) > len(names):
        raise ArgumentError(f"{owner} takes {len(names)} inputs ({', '.join(names)}), got {len(args)} by position")
    bound: dict[str, Any] = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names:
            raise ArgumentError(f"{owner} has no input '{name}'; its inputs: {', '.join(names)}")
        if name in bound:
            raise ArgumentError(f"input '{name}' of {owner} given both by position and by name")
        bound[name] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise ArgumentError(f"{owner} is missing input(s) {', '.join(missing)}")
    return tuple(bound[n] for n in names)


class Function:
    """A differentiable torch callable backed by a compiled forward/backward SDFG pair.

    Call it with tensors (and numbers for scalar inputs) in `inputs` order, or by name; it returns one
    tensor for one output, a tuple for several. `plan` is the one description both dispatchers are generated from.
    """

    def __init__(self, vjp: VJPResult, plan: FunctionPlan, dispatcher: str, convert: bool,
                 flags: Sequence[str] = ()) -> None:
        if dispatcher not in DISPATCHERS:
            raise InvalidArgumentError(f"unknown dispatcher '{dispatcher}'", f"choose one of {DISPATCHERS}")
        self.vjp = vjp
        self.plan = plan
        # the last outputs are the forward's flags (`ERROR_FLAG`: an index read from data out of range;
        # `OVERFLOW`: a loop limit broken), checked after every call, never returned
        self._flags = tuple(flags)
        self.dispatcher = dispatcher
        # before the programs run (their kernels look torch's convolution up at their first call)
        convolution.use_torch_convolutions(as_sdfg(vjp.forward), as_sdfg(vjp.backward))
        self.forward_compiled = compile_sdfg(vjp.forward)
        self.backward_compiled = compile_sdfg(vjp.backward)
        for compiled, expected in ((self.forward_compiled, plan.forward), (self.backward_compiled, plan.backward)):
            if plan_for(compiled.sdfg) != expected:  # compilation must not change the calling convention
                raise GradflowError(f"the compiled '{expected.sdfg_name}' has another signature than planned")
        if dispatcher == "ctypes":
            from gradflow.torch.ctypes_dispatch import make_autograd_function

            self.autograd_function = make_autograd_function(
                plan, self.forward_compiled, self.backward_compiled, convert)
            self._call = _base_apply(self.autograd_function)
        else:
            if convert:
                raise InvalidArgumentError("convert=True is only supported by the ctypes dispatcher")
            from gradflow.runtime.calling import is_stateful
            from gradflow.torch import cpp

            self.extension = cpp.build(plan, self.forward_compiled, self.backward_compiled,
                                       stateful=(is_stateful(self.forward_compiled.sdfg),
                                                 is_stateful(self.backward_compiled.sdfg)))
            self._call = self.extension.call  # the extension's CPython entry point

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.plan.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        names = tuple(s.name for s in self.plan.outputs)
        return names[:len(names) - len(self._flags)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # `_call`: the ctypes dispatcher's autograd.Function apply (its generated forward checks the number
        # of inputs) or the C++ extension's entry point (which checks it too). torch's C apply must not be
        # reached under a functorch transform (it fails an internal assertion), hence the check here.
        if _functorch_active():
            raise GradflowError(
                f"'{self.plan.name}' is called under a functorch transform (vmap, torch.func.grad, ...); "
                "gradflow.torch functions support plain autograd only",
                "call it outside the transform, or differentiate the program with gradflow.vjp")
        if kwargs:
            args = self.bind(args, kwargs)
        if not self._flags:
            return self._call(*args)
        results = self._call(*args)
        values, flags = results[:-len(self._flags)], dict(zip(self._flags, results[-len(self._flags):]))
        raise_for_flag(flags.get(ERROR_FLAG), self.vjp.index_sites)
        check_loop_bounds(flags, self.vjp.bounded_loops)
        return values[0] if len(values) == 1 else tuple(values)

    def bind(self, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
        """Inputs given by name (and the first ones by position) in `inputs` order."""
        return bind_inputs(f"'{self.plan.name}'", self.inputs, args, kwargs)

    def __repr__(self) -> str:
        return (f"gradflow.torch.Function({self.plan.name}: ({', '.join(self.inputs)}) -> "
                f"({', '.join(self.outputs)}), dispatcher={self.dispatcher!r})")


def function(
    program: Any,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    *,
    wrt: Sequence[str] | None = None,
    dispatcher: str = DEFAULT_DISPATCHER,
    convert: bool = False,
    symbols: Mapping[str, int] | None = None,
    forwarding: Forwarding | None = None,
) -> Function | PlannedFunction:
    """A torch callable (backed by a `torch.autograd.Function`) for a program.

    `program` is a `VJPResult`, a `dace.SDFG` or a `@dace.program` (then `gradflow.vjp` differentiates it
    with respect to `wrt`, by default every floating-point input). `inputs` are taken positionally in this
    order (default: the program's arguments that are not outputs); `outputs` are allocated by gradflow
    (default: the VJP's `of`, or the program's return values). Symbols are inferred from input shapes;
    `symbols` fixes those that cannot be. `dispatcher`: `"ctypes"` (Python fast path) or `"cpp"` (generated
    C++ torch extension). `convert=True` (ctypes only) casts inputs of another floating dtype and copies
    non-contiguous ones instead of raising `ArgumentError`; gradients come back in the input's dtype.
    `forwarding` (a program, not a `VJPResult`) is the policy `gradflow.vjp` differentiates it with; a byte
    budget or a checkpoint policy is planned at the call, for the call's sizes (a `PlannedFunction`).
    """
    inputs = _optional_names(inputs, "inputs")
    outputs = _optional_names(outputs, "outputs")
    wrt = _optional_names(wrt, "wrt")
    fixed = _check_options(dispatcher, convert, symbols)
    api.check_forwarding(forwarding)
    if forwarding is not None and isinstance(program, VJPResult):
        raise InvalidArgumentError("forwarding= is for a program gradflow differentiates; this VJPResult already "
                                   "has its forwarding plan",
                                   "pass the program instead, or build the VJPResult with "
                                   "gradflow.vjp(..., forwarding=)")
    if forwarding is not None and plans_at_call(forwarding):
        ins = list(inputs) if inputs is not None else default_inputs_outputs(as_sdfg(program), outputs)[0]

        def build(policy: Forwarding) -> Function:
            return _function(program, inputs, outputs, wrt, dispatcher, convert, fixed, policy)

        return PlannedFunction(AtCall(Graph.of(program), forwarding, build, order=ins, fixed=fixed), ins)
    return _function(program, inputs, outputs, wrt, dispatcher, convert, fixed, forwarding or STORE_ALL)


def _function(program: Any, inputs: Sequence[str] | None, outputs: Sequence[str] | None,
              wrt: Sequence[str] | None, dispatcher: str, convert: bool, fixed: dict[str, int] | None,
              forwarding: Forwarding) -> Function:
    vjp, ins, outs = _vjp_of(program, inputs, outputs, wrt, forwarding)
    # a program that checks indices read from data, or loop limits (a while loop's bound, a checkpoint
    # schedule's trip count), reports through a flag array: an extra output, checked after every call
    flags = [f for f in (ERROR_FLAG, OVERFLOW) if f in vjp.forward.arrays and f not in outs
             and (inputs is None or f not in ins) and (f != OVERFLOW or vjp.bounded_loops)]
    ins, outs = [n for n in ins if n not in flags], [*outs, *flags]
    plan = build_plan(vjp, ins, outs, fixed)
    return Function(vjp, plan, dispatcher, convert, flags)


class PlannedFunction:
    """`gradflow.torch.function` under a policy planned at the call (a byte budget, checkpointing): one
    `Function` per set of call values (sizes, fixed symbols), built at the first call that has them."""

    def __init__(self, builds: AtCall, inputs: Sequence[str]) -> None:
        self._builds = builds
        self._inputs = tuple(inputs)

    @property
    def inputs(self) -> tuple[str, ...]:
        return self._inputs

    @property
    def plans(self) -> dict:
        """The forwarding plans built so far, by the call values they were made for."""
        return {k: f.vjp.forwarding_plan for k, f in self._builds.builds.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._builds(args, kwargs)(*args, **kwargs)

    def __repr__(self) -> str:
        return (f"gradflow.torch.PlannedFunction(({', '.join(self._inputs)}), "
                f"{self._builds.forwarding.name}, {len(self._builds.builds)} plan(s))")
