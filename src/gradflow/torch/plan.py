"""The function plan: one frozen description of a forward/backward pair as a torch function.

`FunctionPlan` says, for a `VJPResult` and the user's choice of `inputs`/`outputs`: the positional inputs
(arrays or scalars), the outputs gradflow allocates, the extra forward outputs kept for the backward
(`VJPResult.saved`), which values are saved for the backward and where each comes from, which backward
argument receives each cotangent and which one holds each gradient, the symbols and how each is inferred,
and the two `CallPlan`s (argument order and types of the compiled forward and backward).

Both dispatchers are generated from this record: the Python/ctypes path (`gradflow.torch.function`) and
the C++ torch extension (`gradflow.torch.cpp`). Nothing about the calling convention is decided elsewhere.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import attrs
import dace

from gradflow.analysis.writes import overwritten_before_read, written
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.spec import OVERFLOW
from gradflow.core.errors import InvalidArgumentError, UnknownArrayError
from gradflow.runtime.plan import ARRAY, SYMBOL, ArgSpec, CallPlan, plan_for

INPUT, OUTPUT, EXTRA = "input", "output", "extra"

_FLOAT = ("float64", "float32", "float16")


@attrs.frozen
class Source:
    """Where a value the backward takes comes from: an input, an output or an extra forward output."""

    role: str  # INPUT, OUTPUT or EXTRA
    index: int


@attrs.frozen
class FunctionPlan:
    name: str
    inputs: tuple[ArgSpec, ...]  # positional order; kind ARRAY or SCALAR
    outputs: tuple[ArgSpec, ...]  # allocated by gradflow, returned in this order
    extras: tuple[ArgSpec, ...]  # extra forward outputs (VJPResult.saved not among inputs/outputs)
    #: for each output: True when it is differentiable (in `of`); the others are marked non-differentiable
    differentiable: tuple[bool, ...]
    #: forward outputs/extras not certainly overwritten in full before being read (including `+=`
    #: accumulations and partial writes): allocated zero-filled rather than empty
    zero_init: frozenset[str]
    forwarded: tuple[tuple[str, Source], ...]  # (backward argument, where its value comes from)
    cotangents: tuple[tuple[int, str], ...]  # (output index, backward argument)
    grads: tuple[tuple[int, str], ...]  # (input index, backward argument) for each input in wrt
    grad_specs: tuple[ArgSpec, ...]  # the backward's gradient arrays, same order as `grads`
    #: symbol -> (input index, axis) that fixes its value; or a fixed value given by the user
    symbol_sources: tuple[tuple[str, int, int], ...]
    fixed_symbols: tuple[tuple[str, int], ...]
    forward: CallPlan
    backward: CallPlan
    #: inputs (indices) the forward program writes: the dispatchers pass a private copy of the value
    #: (copy-in; the caller's tensor is never modified) and save that copy for the backward
    copied: tuple[int, ...] = ()
    #: backward arguments (forwarded values, cotangents) the backward program writes: copied before the
    #: backward call, so that neither saved tensors nor torch's cotangents are modified
    backward_copied: frozenset[str] = frozenset()

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(s for s, _, _ in self.symbol_sources) + tuple(s for s, _ in self.fixed_symbols)

    @property
    def wrt(self) -> tuple[str, ...]:
        return tuple(self.inputs[i].name for i, _ in self.grads)

    def input_index(self, name: str) -> int:
        return [a.name for a in self.inputs].index(name)


def default_inputs_outputs(forward: dace.SDFG, of: Sequence[str] | None, saved: Sequence[str] = ()) -> tuple[list, list]:
    """Inputs: the program's arguments in their declared order that are not outputs; outputs: `of`, else the
    DaCe return values (`__return*`)."""
    outputs = list(of) if of else sorted(n for n, d in forward.arrays.items()
                                         if not d.transient and n.startswith("__return"))
    names = list(forward.arg_names) or sorted(n for n, d in forward.arrays.items() if not d.transient)
    inputs = [n for n in names if n not in outputs and n not in saved and not n.startswith("__return")]
    return inputs, outputs


def differentiable_inputs(forward: dace.SDFG, inputs: Sequence[str]) -> list[str]:
    return [n for n in inputs if n in forward.arrays and str(forward.arrays[n].dtype.as_numpy_dtype()) in _FLOAT]


def _same_layout(fwd: ArgSpec, bwd: ArgSpec, what: str) -> None:
    """The backward's descriptor of a value must match the forward's: same kind, dtype, shape, strides."""
    if (fwd.kind, fwd.dtype, fwd.shape, fwd.strides) != (bwd.kind, bwd.dtype, bwd.shape, bwd.strides):
        def show(a: ArgSpec) -> str:
            return f"{a.kind} {a.dtype}[{', '.join(d.py for d in a.shape)}]"
        raise InvalidArgumentError(f"{what}: the backward SDFG declares {show(bwd)}, the forward {show(fwd)}")


def build_plan(
    vjp: VJPResult,
    inputs: Sequence[str],
    outputs: Sequence[str],
    fixed_symbols: Mapping[str, int] | None = None,
    name: str | None = None,
) -> FunctionPlan:
    """Check the VJP against the user's inputs/outputs and describe the torch function. Raises
    `InvalidArgumentError` naming the array at fault."""
    fwd_plan, bwd_plan = plan_for(vjp.forward), plan_for(vjp.backward)
    fixed = dict(fixed_symbols or {})
    extras = [n for n in vjp.saved if n not in inputs and n not in outputs]
    _check_arguments(fwd_plan, inputs, outputs, extras)
    writes = written(vjp.forward)
    copied = tuple(i for i, n in enumerate(inputs) if n in writes and fwd_plan.arg(n).kind == ARRAY)
    in_specs = tuple(fwd_plan.arg(n) for n in inputs)
    out_specs = tuple(fwd_plan.arg(n) for n in outputs)
    extra_specs = tuple(fwd_plan.arg(n) for n in extras)
    differentiable = tuple(n in vjp.of and s.dtype in _FLOAT for n, s in zip(outputs, out_specs))
    forwarded, cotangents, grads = _backward_arguments(vjp, bwd_plan, inputs, outputs, extras)
    grad_specs = tuple(bwd_plan.arg(g) for _, g in grads)
    _check_layouts(bwd_plan, inputs, outputs, {INPUT: in_specs, OUTPUT: out_specs, EXTRA: extra_specs},
                   forwarded, cotangents, grads, grad_specs)
    needed = [s for s in fwd_plan.symbols] + [s for s in bwd_plan.symbols if s not in fwd_plan.symbols]
    return FunctionPlan(
        name=name or vjp.forward.name,
        inputs=in_specs,
        outputs=out_specs,
        extras=extra_specs,
        differentiable=differentiable,
        zero_init=frozenset(n for n in list(outputs) + extras if not overwritten_before_read(vjp.forward, n)),
        forwarded=tuple(forwarded),
        cotangents=cotangents,
        grads=grads,
        grad_specs=grad_specs,
        symbol_sources=_symbol_sources(needed, fixed, in_specs),
        fixed_symbols=tuple(sorted((k, int(v)) for k, v in fixed.items() if k in needed)),
        forward=fwd_plan,
        backward=bwd_plan,
        copied=copied,
        backward_copied=frozenset(
            n for n in written(vjp.backward)
            if n in dict(forwarded) or n in {c for _, c in cotangents}),
    )


def _check_arguments(fwd_plan: CallPlan, inputs: Sequence[str], outputs: Sequence[str], extras: list[str]) -> None:
    """Every argument of the forward is exactly one of: an input, an output (an array), a saved extra."""
    fwd_names = set(fwd_plan.names)
    for n in list(inputs) + list(outputs):
        if n not in fwd_names or fwd_plan.arg(n).kind == SYMBOL:
            raise UnknownArrayError.build("the function's inputs/outputs", n,
                                          [a.name for a in fwd_plan.args if a.kind != SYMBOL])
    if len(set(inputs)) != len(inputs) or len(set(outputs)) != len(outputs) or set(inputs) & set(outputs):
        raise InvalidArgumentError(f"inputs {list(inputs)} and outputs {list(outputs)} must be distinct names")
    for n in outputs:
        if fwd_plan.arg(n).kind != ARRAY:
            raise InvalidArgumentError(f"output '{n}' is a scalar; outputs must be arrays",
                                       "write the result to a one-element array")
    for n in extras:
        if n not in fwd_names or fwd_plan.arg(n).kind != ARRAY:
            raise InvalidArgumentError(f"saved value '{n}' is not an array argument of the forward SDFG")
    if OVERFLOW in fwd_names and OVERFLOW not in inputs and OVERFLOW not in outputs:
        raise InvalidArgumentError(
            f"the forward reports broken loop limits through '{OVERFLOW}' (loops checkpointed for the trip "
            "counts at sizes=, or while loops stopped at a user bound), and its VJPResult lists no "
            "bounded_loops to check that flag against",
            "pass the VJPResult gradflow.vjp returned, or the program itself with forwarding=")
    for a in fwd_plan.args:
        if a.kind != SYMBOL and a.name not in inputs and a.name not in outputs and a.name not in extras:
            raise InvalidArgumentError(
                f"argument '{a.name}' of the forward SDFG is neither an input nor an output of the function",
                f"list it in inputs= or outputs= (inputs: {list(inputs)}, outputs: {list(outputs)})",
            )


def _backward_arguments(vjp: VJPResult, bwd_plan: CallPlan, inputs: Sequence[str], outputs: Sequence[str],
                        extras: list[str]) -> tuple[list, tuple, tuple]:
    """The backward's arguments: forwarded values (and where each comes from), cotangents (by output
    index), gradients (by input index); nothing else."""
    sources = {}
    for i, n in enumerate(inputs):
        sources[n] = Source(INPUT, i)
    for i, n in enumerate(outputs):
        sources[n] = Source(OUTPUT, i)
    for i, n in enumerate(extras):
        sources[n] = Source(EXTRA, i)
    cot_names = {vjp.cotangents[o]: o for o in vjp.of}
    grad_names = {vjp.grads[x]: x for x in vjp.wrt}
    forwarded = []
    bwd_names = set(bwd_plan.names)
    for n in vjp.forwarded:
        if n not in sources:
            raise InvalidArgumentError(f"forwarded value '{n}' is not an input, output or saved value of the forward")
        if n in bwd_names:
            forwarded.append((n, sources[n]))
    for a in bwd_plan.args:
        if a.kind == SYMBOL or a.name in cot_names or a.name in grad_names:
            continue
        if a.name not in dict(forwarded):
            raise InvalidArgumentError(
                f"argument '{a.name}' of the backward SDFG is neither forwarded, a cotangent nor a gradient")
    for o in vjp.of:
        if o not in outputs:
            raise InvalidArgumentError(f"the VJP differentiates '{o}', which is not among outputs {list(outputs)}")
    cotangents = tuple((list(outputs).index(o), vjp.cotangents[o]) for o in vjp.of
                       if vjp.cotangents[o] in bwd_names)
    for x in vjp.wrt:
        if x not in inputs:
            raise InvalidArgumentError(f"the VJP differentiates with respect to '{x}', which is not an input")
        if vjp.grads[x] not in bwd_names or bwd_plan.arg(vjp.grads[x]).kind != ARRAY:
            raise InvalidArgumentError(f"gradient '{vjp.grads[x]}' of '{x}' is not an array of the backward SDFG")
    grads = tuple(sorted((list(inputs).index(x), vjp.grads[x]) for x in vjp.wrt))
    return forwarded, cotangents, grads


def _check_layouts(bwd_plan: CallPlan, inputs: Sequence[str], outputs: Sequence[str],
                   by_role: dict[str, tuple[ArgSpec, ...]], forwarded: list, cotangents: tuple, grads: tuple,
                   grad_specs: tuple[ArgSpec, ...]) -> None:
    """The backward declares every value it shares with the forward as the forward does."""
    in_specs, out_specs = by_role[INPUT], by_role[OUTPUT]
    for n, src in forwarded:
        _same_layout(by_role[src.role][src.index], bwd_plan.arg(n), f"forwarded value '{n}'")
    for i, c in cotangents:
        _same_layout(out_specs[i], bwd_plan.arg(c), f"cotangent '{c}' of output '{outputs[i]}'")
    for (i, g), spec in zip(grads, grad_specs):
        if in_specs[i].kind == ARRAY:
            _same_layout(in_specs[i], spec, f"gradient '{g}' of input '{inputs[i]}'")
        elif spec.dtype != in_specs[i].dtype or len(spec.shape) != 1 or spec.shape[0].const != 1:
            raise InvalidArgumentError(f"gradient '{g}' of scalar input '{inputs[i]}' must be a one-element "
                                       f"{in_specs[i].dtype} array")


def _symbol_sources(needed: list[str], fixed: Mapping[str, int],
                    in_specs: tuple[ArgSpec, ...]) -> tuple[tuple[str, int, int], ...]:
    """Every symbol the two programs take that the user did not fix: (symbol, input index, axis) of a
    dimension of an input whose extent it is."""
    symbol_sources = []
    for s in needed:
        if s in fixed:
            continue
        where = next(((i, ax) for i, spec in enumerate(in_specs) if spec.kind == ARRAY
                      for ax, d in enumerate(spec.shape) if d.symbol == s), None)
        if where is None:
            raise InvalidArgumentError(
                f"symbol '{s}' is not the extent of any dimension of the inputs, so it cannot be inferred",
                f"give its value: symbols={{'{s}': ...}}",
            )
        symbol_sources.append((s, *where))
    return tuple(symbol_sources)
