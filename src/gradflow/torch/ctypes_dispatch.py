"""The ctypes dispatcher: a `torch.autograd.Function` generated (as Python source) from a `FunctionPlan`.

Per plan, one `forward`/`backward` pair is generated with straight-line code: a cheap acceptance test of
the arguments (dtype identity, CPU, strided, contiguous, no lazy-negation view), a lookup of the signature
(the tuple of input shapes), the native call, and the autograd bookkeeping. Per signature, the argument
vectors are generated once: output/extra/gradient shapes and the symbol values are literals, the handles
are bound, and a call passes `data_ptr()`s straight to `__program_<name>` through ctypes (no copies).

Anything the fast test does not accept goes to `_Dispatcher.slow`, which either raises an `ArgumentError`
(from `gradflow.runtime.validate`) or, when the function was created with `convert=True`, converts the
input (dtype cast and/or contiguous copy; gradients are cast back to the input's dtype).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from dace.codegen.compiled_sdfg import CompiledSDFG

from gradflow.core.errors import ArgumentError, GradflowError
from gradflow.runtime.calling import Kernel
from gradflow.runtime.plan import ARRAY, SCALAR, SYMBOL, ArgSpec
from gradflow.runtime.validate import TORCH_DTYPES, check_array, check_symbol_range, infer_symbols
from gradflow.torch.plan import EXTRA, INPUT, OUTPUT, FunctionPlan

_MAX_SIGNATURES = 256
_ALLOC = {"_empty": torch.empty, "_zeros": torch.zeros, "_empty_like": torch.empty_like,
          "_zeros_like": torch.zeros_like, "_empty_strided": torch.empty_strided}


def _exec(source: str, env: dict, name: str) -> Callable:
    scope = dict(env)
    exec(compile(source, f"<gradflow generated {name}>", "exec"), scope)  # noqa: S102 - generated from a plan
    return scope[name]


class Signature:
    """Everything about one tuple of input shapes: symbol values, handles, and the generated calls."""

    def __init__(self, dispatcher: "_Dispatcher", symbols: dict[str, int]) -> None:
        plan = dispatcher.plan
        self.symbols = symbols
        fwd_handle = dispatcher.fwd.handle_for(symbols)
        bwd_handle = dispatcher.bwd.handle_for(symbols)
        self.forward = _exec(_forward_source(plan, symbols, dispatcher.fwd.stateful), {
            **_ALLOC, "_call": dispatcher.fwd.program,
            "_lock": dispatcher.fwd.lock, "_H": fwd_handle, **_dtype_env(plan)}, "forward")
        self.backward = _exec(_backward_source(plan, symbols, dispatcher.bwd.stateful), {
            **_ALLOC, "_call": dispatcher.bwd.program,
            "_lock": dispatcher.bwd.lock, "_H": bwd_handle, **_dtype_env(plan)}, "backward")


def _dtype_env(plan: FunctionPlan) -> dict:
    return {f"_D_{n}": t for n, t in TORCH_DTYPES.items()}


def _shape(spec: ArgSpec, symbols: dict[str, int]) -> str:
    return repr(tuple(d.evaluate(symbols) for d in spec.shape))


def _layout(spec: ArgSpec) -> tuple:
    return (spec.dtype, spec.shape, spec.default_strides())


def _alloc(spec: ArgSpec, symbols: dict[str, int], like: dict[tuple, str], zero: bool) -> str:
    """Allocation of a C-contiguous array: `empty_like` of a validated contiguous tensor of the same
    dtype and shape when there is one (cheaper than `empty(shape, dtype=...)`), else by shape."""
    source = like.get(_layout(spec)) if spec.default_strides() else None
    if source is not None:
        return f"{'_zeros_like' if zero else '_empty_like'}({source})"
    if not spec.default_strides():
        strides = repr(tuple(d.evaluate(symbols) for d in spec.strides))
        fill = ".zero_()" if zero else ""
        return f"_empty_strided({_shape(spec, symbols)}, {strides}, dtype=_D_{spec.dtype}){fill}"
    return f"{'_zeros' if zero else '_empty'}({_shape(spec, symbols)}, dtype=_D_{spec.dtype})"


def _call_lines(args: list[str], locked: bool) -> list[str]:
    if locked:
        return ["    with _lock:", f"        _call(_H, {', '.join(args)})"]
    return [f"    _call(_H, {', '.join(args)})"]


def _forward_source(plan: FunctionPlan, symbols: dict[str, int], locked: bool = True) -> str:
    """`forward(a0, a1, ...) -> (outputs, extras)`: allocate, call the forward SDFG."""
    args = [f"a{i}" for i in range(len(plan.inputs))]
    lines = [f"def forward({', '.join(args)}):"]
    local = {}
    for i, s in enumerate(plan.inputs):
        local[s.name] = f"a{i}.data_ptr()" if s.kind == ARRAY else f"a{i}"
    like = {_layout(s): f"a{i}" for i, s in reversed(list(enumerate(plan.inputs))) if s.kind == ARRAY}
    for prefix, specs in (("o", plan.outputs), ("e", plan.extras)):
        for i, s in enumerate(specs):
            lines.append(f"    {prefix}{i} = {_alloc(s, symbols, like, s.name in plan.zero_init)}")
            local[s.name] = f"{prefix}{i}.data_ptr()"
    call = [local[a.name] if a.kind != SYMBOL else repr(int(symbols[a.name])) for a in plan.forward.args]
    lines += _call_lines(call, locked)
    outs = "".join(f"o{i}, " for i in range(len(plan.outputs)))
    extras = "".join(f"e{i}, " for i in range(len(plan.extras)))
    lines.append(f"    return ({outs}), ({extras})")
    return "\n".join(lines) + "\n"


def _backward_source(plan: FunctionPlan, symbols: dict[str, int], locked: bool = True) -> str:
    """`backward(s0.., c0..) -> grads`: the forwarded values, the cotangents; returns the gradients."""
    params = [f"s{i}" for i in range(len(plan.forwarded))] + [f"c{i}" for i in range(len(plan.cotangents))]
    lines = [f"def backward({', '.join(params)}):"]
    local = {}
    like = {}
    for i, (_, name) in reversed(list(enumerate(plan.cotangents))):
        local[name] = f"c{i}.data_ptr()"
        like[_layout(plan.backward.arg(name))] = f"c{i}"
    for i, (name, _) in reversed(list(enumerate(plan.forwarded))):
        spec = plan.backward.arg(name)
        local[name] = f"s{i}.data_ptr()" if spec.kind == ARRAY else f"s{i}"
        if spec.kind == ARRAY:
            like[_layout(spec)] = f"s{i}"
    for i, spec in enumerate(plan.grad_specs):
        lines.append(f"    g{i} = {_alloc(spec, symbols, like, False)}")
        local[spec.name] = f"g{i}.data_ptr()"
    call = [local[a.name] if a.kind != SYMBOL else repr(int(symbols[a.name])) for a in plan.backward.args]
    lines += _call_lines(call, locked)
    lines.append(f"    return ({''.join(f'g{i}, ' for i in range(len(plan.grad_specs)))})")
    return "\n".join(lines) + "\n"


def _autograd_source(plan: FunctionPlan) -> str:
    """The `forward(ctx, ...)` / `backward(ctx, ...)` pair of the autograd.Function."""
    n = len(plan.inputs)
    args = [f"a{i}" for i in range(n)]
    arglist = ", ".join(args)
    tup = "".join(f"{a}, " for a in args)
    fast = []
    for i, s in enumerate(plan.inputs):
        if s.kind == ARRAY:
            fast.append(f"(type(a{i}) is _Tensor or isinstance(a{i}, _Tensor)) and a{i}.dtype is _D_{s.dtype} "
                        f"and a{i}.is_cpu and a{i}.layout is _strided and a{i}.is_contiguous() "
                        f"and not a{i}.is_neg()")
        else:
            fast.append(f"type(a{i}) in _NUMBERS")
    shapes = "".join(f"a{i}.shape, " for i, s in enumerate(plan.inputs) if s.kind == ARRAY)
    lines = [f"def forward(ctx, {arglist}):"]
    lines.append(f"    sig = _sigs.get(({shapes})) if ({' and '.join(fast) or 'True'}) else None")
    lines.append("    if sig is None:")
    lines.append(f"        sig, ({tup}), ctx.converted = _slow(({tup}))")
    lines.append(f"    outs, extras = sig.forward({arglist})")
    lines.append("    ctx.sig = sig")
    saved_tensors, saved_scalars = [], []
    for name, src in plan.forwarded:
        expr = {INPUT: f"a{src.index}", OUTPUT: f"outs[{src.index}]", EXTRA: f"extras[{src.index}]"}[src.role]
        (saved_scalars if plan.backward.arg(name).kind != ARRAY else saved_tensors).append(expr)
    lines.append(f"    ctx.save_for_backward({', '.join(saved_tensors)})")
    if saved_scalars:
        lines.append(f"    ctx.scalars = ({''.join(e + ', ' for e in saved_scalars)})")
    nondiff = [f"outs[{i}]" for i, d in enumerate(plan.differentiable) if not d]
    if nondiff:
        lines.append(f"    ctx.mark_non_differentiable({', '.join(nondiff)})")
    lines.append("    return outs[0]" if len(plan.outputs) == 1 else "    return outs")

    # backward: cotangents for every output arrive; only those the backward takes are passed
    gouts = [f"c{i}" for i in range(len(plan.outputs))]
    lines.append("")
    lines.append(f"def backward(ctx, {', '.join(gouts)}):")
    lines.append("    if _grad_enabled():")
    lines.append("        _no_double_backward()")
    lines.append(f"    saved = ctx.saved_tensors")
    ti = si = 0
    fwd_vals = []
    for name, _ in plan.forwarded:
        if plan.backward.arg(name).kind == ARRAY:
            fwd_vals.append(f"saved[{ti}]")
            ti += 1
        else:
            fwd_vals.append(f"ctx.scalars[{si}]")
            si += 1
    cots = []
    for k, (oi, _) in enumerate(plan.cotangents):
        dt = plan.outputs[oi].dtype
        lines.append(f"    if not (c{oi}.dtype is _D_{dt} and c{oi}.is_contiguous() and not c{oi}.is_neg()):")
        lines.append(f"        c{oi} = _cotangent(c{oi}, {oi})")
        cots.append(f"c{oi}")
    lines.append(f"    grads = ctx.sig.backward({', '.join(fwd_vals + cots)})")
    lines.append("    need = ctx.needs_input_grad")
    results = ["None"] * n
    for k, (ii, _) in enumerate(plan.grads):
        g = f"grads[{k}]" if plan.inputs[ii].kind == ARRAY else f"grads[{k}].reshape(())"
        results[ii] = f"({g} if need[{ii}] else None)"
    lines.append("    if ctx.converted is not None:")
    lines.append(f"        return _cast_back(ctx.converted, ({''.join(r + ', ' for r in results)}))")
    lines.append(f"    return {', '.join(results)}" + ("," if n == 1 else ""))
    return "\n".join(lines) + "\n"


class _Dispatcher:
    """Shared state of the generated functions: kernels, the signature cache, the slow path."""

    def __init__(self, plan: FunctionPlan, forward: CompiledSDFG, backward: CompiledSDFG, convert: bool) -> None:
        self.plan = plan
        self.convert = convert
        self.fwd = Kernel(forward, plan.forward)
        self.bwd = Kernel(backward, plan.backward)
        self.signatures: dict[tuple, Signature] = {}
        self._fixed = dict(plan.fixed_symbols)
        self._needed = plan.symbols

    def signature(self, shapes: tuple) -> Signature:
        """The signature for these input shapes; validates them (symbols consistent) on first sight."""
        sig = self.signatures.get(shapes)
        if sig is None:
            arrays = [s for s in self.plan.inputs if s.kind == ARRAY]
            symbols = infer_symbols(list(zip(arrays, shapes)), self._needed, self._fixed)
            check_symbol_range(symbols, (self.plan.forward, self.plan.backward))
            if len(self.signatures) >= _MAX_SIGNATURES:
                self.signatures.clear()
            sig = self.signatures[shapes] = Signature(self, symbols)
        return sig

    def slow(self, args: tuple) -> tuple[Signature, tuple, tuple | None]:
        """Full validation (and conversion when allowed) of the inputs; returns the signature."""
        plan = self.plan
        if len(args) != len(plan.inputs):
            raise ArgumentError(f"'{plan.name}' takes {len(plan.inputs)} inputs "
                                f"({', '.join(s.name for s in plan.inputs)}), got {len(args)}")
        out = list(args)
        converted = None
        for i, (spec, value) in enumerate(zip(plan.inputs, args)):
            if spec.kind == SCALAR:
                if isinstance(value, torch.Tensor):
                    if value.numel() != 1:
                        raise ArgumentError(f"argument '{spec.name}': expected a number (scalar input), "
                                            f"got a tensor of shape {tuple(value.shape)}")
                    out[i] = value.item()
                elif isinstance(value, (bool, int, float)):
                    out[i] = value
                else:
                    raise ArgumentError(f"argument '{spec.name}': expected a number, got {type(value).__name__}")
                continue
            if not isinstance(value, torch.Tensor):
                raise ArgumentError(f"argument '{spec.name}': expected a torch.Tensor, got {type(value).__name__}",
                                    "wrap it with torch.as_tensor(...)")
            if self.convert and value.layout is torch.strided and value.device.type == "cpu":
                want = TORCH_DTYPES[spec.dtype]
                if value.dtype is not want and value.dtype.is_floating_point == want.is_floating_point:
                    converted = converted or [None] * len(args)
                    converted[i] = value.dtype
                    value = value.to(want)
                if value.is_neg():
                    value = value.resolve_neg()
                out[i] = value
        arrays = [(s, v) for s, v in zip(plan.inputs, out) if s.kind == ARRAY]
        sig = self.signature(tuple(v.shape for _, v in arrays))
        for i, (spec, value) in enumerate(zip(plan.inputs, out)):
            if spec.kind != ARRAY:
                continue
            if self.convert and spec.default_strides() and not value.is_contiguous():
                value = out[i] = value.contiguous()
            check_array(spec, value, sig.symbols)
        return sig, tuple(out), (tuple(converted) if converted else None)

    def cotangent(self, value: torch.Tensor, index: int) -> torch.Tensor:
        """A cotangent torch handed us that is not a dense contiguous tensor of the output's dtype."""
        spec = self.plan.outputs[index]
        want = TORCH_DTYPES[spec.dtype]
        if value.layout is not torch.strided:
            value = value.to_dense()
        return value.resolve_neg().to(want).contiguous()


def _no_double_backward() -> None:
    raise GradflowError(
        "gradflow.torch functions are differentiable once: their backward cannot itself be differentiated "
        "(backward with create_graph=True)",
        "differentiate the backward program with gradflow.vjp instead of through torch",
    )


def make_autograd_function(
    plan: FunctionPlan, forward: CompiledSDFG, backward: CompiledSDFG, convert: bool = False
) -> type[torch.autograd.Function]:
    """A `torch.autograd.Function` subclass running the compiled forward/backward pair through ctypes."""
    dispatcher = _Dispatcher(plan, forward, backward, convert)
    source = _autograd_source(plan)
    env = {
        "_Tensor": torch.Tensor, "_strided": torch.strided, "_NUMBERS": (int, float, bool),
        "_sigs": dispatcher.signatures, "_grad_enabled": torch.is_grad_enabled,
        "_no_double_backward": _no_double_backward, "_slow": dispatcher.slow, "_cotangent": dispatcher.cotangent,
        "_cast_back": lambda converted, grads: tuple(
            g.to(dt) if (g is not None and dt is not None) else g for g, dt in zip(grads, converted)),
        **_dtype_env(plan),
    }
    fwd = _exec(source, env, "forward")
    bwd = _exec(source, env, "backward")
    cls = type(f"GradflowCtypes_{plan.name}", (torch.autograd.Function,), {
        "forward": staticmethod(fwd),
        "backward": staticmethod(bwd),
        "dispatcher": dispatcher,
        "source": source,
    })
    cls._backward_cls.converted = None  # default of ctx.converted (set only by converting calls)
    return cls
