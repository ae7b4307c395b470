"""The ctypes dispatcher: a `torch.autograd.Function` generated (as Python source) from a `FunctionPlan`.

Per plan, the Function's `forward`/`backward` are generated with straight-line code: a cheap acceptance
test of the arguments (dtype identity, CPU, strided, contiguous, no lazy-negation view; a non-tensor or a
sparse tensor raises inside the test and is caught), a lookup of the signature (the tuple of input shapes,
validated in full when first seen), and a jump to the signature's own generated `forward(ctx, ...)`.
Per signature, everything that depends on the shapes is generated once: output/extra/gradient shapes and
symbol values are literals, the state handles are bound, allocation is `empty_like` of an input of the same
layout where there is one, and the call passes `data_ptr()`s straight to `__program_<name>` through
ctypes (no copies, no DLPack). The forward stores the signature's backward in `ctx.bwd`.

Anything the fast test does not accept (and a wrong number of inputs) goes to
`_Dispatcher.slow_forward`, which either raises an `ArgumentError` (from `gradflow.runtime.validate`) or,
when the function was created with `convert=True`, converts the input (dtype cast and/or contiguous copy;
gradients are cast back to the input's dtype); a scalar input given as a tensor is read there too (its
gradient gets the tensor's shape).
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
_MISSING = object()  # default of the generated forward's parameters: fewer inputs than the plan's
_ALLOC = {"_empty": torch.empty, "_zeros": torch.zeros, "_empty_like": torch.empty_like,
          "_zeros_like": torch.zeros_like, "_empty_strided": torch.empty_strided, "_clone": torch.clone,
          "_contiguous": torch.contiguous_format}


def _exec(source: str, env: dict, name: str) -> Callable:
    scope = dict(env)
    exec(compile(source, f"<gradflow generated {name}>", "exec"), scope)  # noqa: S102 - generated from a plan
    return scope[name]


class Signature:
    """Everything about one tuple of input shapes: symbol values, handles, and the generated
    `forward(ctx, ...)` / `backward(ctx, ...)` of the autograd.Function for these shapes."""

    def __init__(self, dispatcher: "_Dispatcher", symbols: dict[str, int]) -> None:
        plan = dispatcher.plan
        self.symbols = symbols
        fwd_handle = dispatcher.fwd.handle_for(symbols)
        bwd_handle = dispatcher.bwd.handle_for(symbols)
        pool = _pooled(plan, symbols)  # one layout of the pool, which both functions must agree on
        self.backward = _exec(_backward_source(plan, symbols, dispatcher.bwd.stateful, pool), {
            **_ALLOC, "_call": dispatcher.bwd.program, "_cotangent": dispatcher.cotangent,
            "_lock": dispatcher.bwd.lock, "_H": bwd_handle, **_dtype_env(plan)}, "backward")
        self.forward = _exec(_forward_source(plan, symbols, dispatcher.fwd.stateful, pool), {
            **_ALLOC, "_call": dispatcher.fwd.program, "_BWD": self.backward,
            "_lock": dispatcher.fwd.lock, "_H": fwd_handle, **_dtype_env(plan)}, "forward")


def _dtype_env(plan: FunctionPlan) -> dict:
    return {"_U8": torch.uint8, **{f"_D_{n}": t for n, t in TORCH_DTYPES.items()}}


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


def _copy(var: str, spec: ArgSpec, symbols: dict[str, int]) -> str:
    """A private copy of a validated input with the descriptor's layout (copy-in of written inputs)."""
    if spec.default_strides():
        return f"_clone({var}, memory_format=_contiguous)"
    strides = repr(tuple(d.evaluate(symbols) for d in spec.strides))
    return f"_empty_strided({_shape(spec, symbols)}, {strides}, dtype=_D_{spec.dtype}).copy_({var})"


#: byte alignment of each extra in the pool (`_pooled`): a cache line, as torch aligns its allocations
_POOL_ALIGN = 64


def _pooled(plan: FunctionPlan, symbols: dict[str, int]) -> tuple[dict[int, int], int]:
    """(extra index -> byte offset, total bytes) of the extras allocated together in one buffer: those the
    backward reads as they are (forwarded arrays, C-contiguous, not zero-filled, not copied before the
    backward writes them). One `torch.empty` instead of one per extra (27 in an LSTM over 8 steps, about
    1 us each), and one saved tensor; the calls take pointers into it. Empty when fewer than two qualify."""
    names: dict[int, list[str]] = {}
    for name, src in plan.forwarded:
        if src.role == EXTRA:
            names.setdefault(src.index, []).append(name)
    offsets, total = {}, 0
    for i, spec in enumerate(plan.extras):
        taken = names.get(i)
        if (not taken or not spec.default_strides() or spec.name in plan.zero_init
                or any(n in plan.backward_copied or plan.backward.arg(n).kind != ARRAY for n in taken)):
            continue
        size = TORCH_DTYPES[spec.dtype].itemsize
        for d in spec.shape:
            size *= int(d.evaluate(symbols))
        offsets[i] = total
        total += -(-size // _POOL_ALIGN) * _POOL_ALIGN
    return (offsets, total) if len(offsets) > 1 else ({}, 0)


def _forward_source(plan: FunctionPlan, symbols: dict[str, int], locked: bool,
                    pool: tuple[dict[int, int], int]) -> str:
    """`forward(ctx, a0, a1, ...)` for one signature (inputs already accepted): copy-in of the written
    inputs, allocation, the forward SDFG's call, and the autograd bookkeeping (`ctx.bwd` is this
    signature's backward)."""
    args = [f"a{i}" for i in range(len(plan.inputs))]
    lines = [f"def forward(ctx, {', '.join(args)}):"]
    local = {}
    for i, s in enumerate(plan.inputs):
        local[s.name] = f"a{i}.data_ptr()" if s.kind == ARRAY else f"a{i}"
    value = {i: f"a{i}" for i in range(len(plan.inputs))}
    for i in plan.copied:  # the forward writes this input: it gets a private copy (copy-in)
        lines.append(f"    p{i} = {_copy(f'a{i}', plan.inputs[i], symbols)}")
        local[plan.inputs[i].name] = f"p{i}.data_ptr()"
        value[i] = f"p{i}"
    like = {_layout(s): value[i] for i, s in reversed(list(enumerate(plan.inputs))) if s.kind == ARRAY}
    pooled, total = pool
    if pooled:
        lines += [f"    pool = _empty(({total},), dtype=_U8)", "    q = pool.data_ptr()"]
    for prefix, specs in (("o", plan.outputs), ("e", plan.extras)):
        for i, s in enumerate(specs):
            if prefix == "e" and i in pooled:
                local[s.name] = f"(q + {pooled[i]})"
                continue
            lines.append(f"    {prefix}{i} = {_alloc(s, symbols, like, s.name in plan.zero_init)}")
            local[s.name] = f"{prefix}{i}.data_ptr()"
    call = [local[a.name] if a.kind != SYMBOL else repr(int(symbols[a.name])) for a in plan.forward.args]
    lines += _call_lines(call, locked)
    lines.append("    ctx.bwd = _BWD")
    saved_tensors, saved_scalars = [], []
    for name, src in plan.forwarded:
        if src.role == EXTRA and src.index in pooled:
            continue
        expr = value[src.index] if src.role == INPUT else f"{'o' if src.role == OUTPUT else 'e'}{src.index}"
        (saved_scalars if plan.backward.arg(name).kind != ARRAY else saved_tensors).append(expr)
    lines.append(f"    ctx.save_for_backward({', '.join(saved_tensors + (['pool'] if pooled else []))})")
    if saved_scalars:
        lines.append(f"    ctx.scalars = ({''.join(e + ', ' for e in saved_scalars)})")
    nondiff = [f"o{i}" for i, d in enumerate(plan.differentiable) if not d]
    if nondiff:
        lines.append(f"    ctx.mark_non_differentiable({', '.join(nondiff)})")
    outs = [f"o{i}" for i in range(len(plan.outputs))]
    lines.append(f"    return {outs[0]}" if len(outs) == 1 else f"    return {', '.join(outs)}")
    return "\n".join(lines) + "\n"


def _backward_source(plan: FunctionPlan, symbols: dict[str, int], locked: bool,
                     pool: tuple[dict[int, int], int]) -> str:
    """`backward(ctx, c0, c1, ...)` for one signature: the cotangents of every output arrive (those the
    backward SDFG takes are made dense and contiguous if needed); allocation of the gradients, the
    backward SDFG's call, and the gradients of the inputs that need them."""
    n = len(plan.inputs)
    lines = [f"def backward(ctx, {', '.join(f'c{i}' for i in range(len(plan.outputs)))}):"]
    pooled, _ = pool
    tensors = [name for name, src in plan.forwarded if plan.backward.arg(name).kind == ARRAY
               and not (src.role == EXTRA and src.index in pooled)]
    if tensors or pooled:
        names = "".join(f"s{i}, " for i in range(len(tensors))) + ("pool, " if pooled else "")
        lines.append(f"    {names}= ctx.saved_tensors")
    if pooled:
        lines.append("    q = pool.data_ptr()")
    local, like = {}, {}
    ti = si = 0
    for name, src in plan.forwarded:
        spec = plan.backward.arg(name)
        if src.role == EXTRA and src.index in pooled:
            local[name] = f"(q + {pooled[src.index]})"
        elif spec.kind == ARRAY:
            if name in plan.backward_copied:  # the backward writes it: never the saved tensor itself
                lines.append(f"    s{ti} = {_copy(f's{ti}', spec, symbols)}")
            local[name] = f"s{ti}.data_ptr()"
            like.setdefault(_layout(spec), f"s{ti}")
            ti += 1
        else:
            local[name] = f"ctx.scalars[{si}]"
            si += 1
    for oi, name in plan.cotangents:
        dt = plan.outputs[oi].dtype
        lines.append(f"    if not (c{oi}.dtype is _D_{dt} and c{oi}.is_contiguous() and not c{oi}.is_neg()):")
        lines.append(f"        c{oi} = _cotangent(c{oi}, {oi})")
        if name in plan.backward_copied:  # the backward writes it: never torch's cotangent itself
            lines.append(f"    c{oi} = {_copy(f'c{oi}', plan.backward.arg(name), symbols)}")
        local[name] = f"c{oi}.data_ptr()"
        like.setdefault(_layout(plan.backward.arg(name)), f"c{oi}")
    for i, spec in enumerate(plan.grad_specs):
        lines.append(f"    g{i} = {_alloc(spec, symbols, like, False)}")
        local[spec.name] = f"g{i}.data_ptr()"
    call = [local[a.name] if a.kind != SYMBOL else repr(int(symbols[a.name])) for a in plan.backward.args]
    lines += _call_lines(call, locked)
    results = ["None"] * n
    if plan.grads:
        lines.append("    need = ctx.needs_input_grad")
    for k, (ii, _) in enumerate(plan.grads):
        # a scalar input needs a gradient only when it was given as a tensor (through the slow path,
        # whose `finish` gives the gradient that tensor's shape)
        results[ii] = f"(g{k} if need[{ii}] else None)"
    lines.append(f"    return {', '.join(results)}" + ("," if n == 1 else ""))
    return "\n".join(lines) + "\n"


def _autograd_source(plan: FunctionPlan) -> str:
    """The `forward(ctx, ...)` / `backward(ctx, ...)` of the autograd.Function: an acceptance test of the
    inputs and a lookup of the signature, then the signature's generated code; anything else (and a wrong
    number of inputs) goes to the slow path."""
    n = len(plan.inputs)
    args = [f"a{i}" for i in range(n)]
    fast = []
    for i, s in enumerate(plan.inputs):
        if s.kind == ARRAY:
            # a sparse tensor raises in is_contiguous(), a non-tensor lacks the attributes: both are caught
            fast.append(f"a{i}.dtype is _D_{s.dtype} and a{i}.is_cpu and a{i}.layout is _strided "
                        f"and a{i}.is_contiguous() and not a{i}.is_neg()")
        else:
            fast.append(f"type(a{i}) in {'_FLOATS' if s.dtype.startswith('float') else '_INTS'}")
    shapes = "".join(f"a{i}.shape, " for i, s in enumerate(plan.inputs) if s.kind == ARRAY)
    params = ", ".join(f"{a}=_MISSING" for a in args)
    lines = [f"def forward(ctx, {params}{', ' if params else ''}*rest):"]
    lines.append("    try:")
    lines.append(f"        sig = _sigs.get(({shapes})) if ({' and '.join(fast) or 'True'}) else None")
    lines.append("    except _NOT_ACCEPTED:")
    lines.append("        sig = None")
    lines.append("    if sig is None or rest:")
    lines.append(f"        return _slow(ctx, ({''.join(f'{a}, ' for a in args)}) + rest)")
    lines.append(f"    return sig.forward(ctx, {', '.join(args)})")
    lines.append("")
    gouts = ", ".join(f"c{i}" for i in range(len(plan.outputs)))
    lines.append(f"def backward(ctx, {gouts}):")
    lines.append("    if _grad_enabled():")
    lines.append("        _no_double_backward()")
    lines.append(f"    return ctx.bwd(ctx, {gouts})")
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

    def slow_forward(self, ctx: Any, args: tuple) -> Any:
        """The forward of a call the acceptance test did not take: wrong number of inputs, an input to
        validate in full (and convert, when allowed), or a new signature."""
        args = tuple(a for a in args if a is not _MISSING)  # missing ones can only be trailing
        plan = self.plan
        if len(args) != len(plan.inputs):
            raise ArgumentError(f"'{plan.name}' takes {len(plan.inputs)} inputs "
                                f"({', '.join(s.name for s in plan.inputs)}), got {len(args)}")
        sig, args, extra = self.slow(args)
        out = sig.forward(ctx, *args)
        if extra is not None:
            ctx.extra, ctx.inner_bwd, ctx.bwd = extra, ctx.bwd, self.finishing_backward
        return out

    def finishing_backward(self, ctx: Any, *cotangents: Any) -> tuple:
        return self.finish(ctx.extra, ctx.inner_bwd(ctx, *cotangents))

    def slow(self, args: tuple) -> tuple[Signature, tuple, tuple | None]:
        """Full validation (and conversion when allowed) of the inputs; returns the signature, the inputs
        to pass, and what the backward must undo (`finish`): None, or (the dtype each converted input had,
        the shape of each scalar input given as a tensor)."""
        plan = self.plan
        if len(args) != len(plan.inputs):
            raise ArgumentError(f"'{plan.name}' takes {len(plan.inputs)} inputs "
                                f"({', '.join(s.name for s in plan.inputs)}), got {len(args)}")
        out = list(args)
        converted: list | None = None
        shapes: dict[int, tuple] = {}
        for i, (spec, value) in enumerate(zip(plan.inputs, args)):
            if spec.kind == SCALAR:
                out[i] = self._scalar(spec, value)
                if isinstance(value, torch.Tensor):
                    shapes[i] = tuple(value.shape)
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
        extra = (tuple(converted) if converted else None, shapes) if (converted or shapes) else None
        return sig, tuple(out), extra

    @staticmethod
    def _scalar(spec: ArgSpec, value: Any) -> Any:
        """The number passed for a scalar input: a Python number, or a one-element tensor's value."""
        if isinstance(value, torch.Tensor):
            if value.numel() != 1 or value.layout is not torch.strided or value.device.type != "cpu":
                raise ArgumentError(f"argument '{spec.name}': expected a number or a one-element CPU tensor "
                                    f"(scalar input), got a tensor of shape {tuple(value.shape)} on {value.device}")
            value = value.item()
        if spec.dtype.startswith("float"):
            ok = isinstance(value, (bool, int, float))
        else:
            ok = isinstance(value, (bool, int))
        if not ok:
            raise ArgumentError(f"argument '{spec.name}': expected a number for the {spec.dtype} scalar input, "
                                f"got {type(value).__name__}")
        return value

    @staticmethod
    def finish(extra: tuple, grads: tuple) -> tuple:
        """Gradients of the inputs the slow path changed: cast back to the dtype the caller gave, and
        shaped like the tensor given for a scalar input."""
        converted, shapes = extra
        out = list(grads)
        for i, shape in shapes.items():
            if out[i] is not None:
                out[i] = out[i].reshape(shape)
        if converted is not None:
            out = [g.to(dt) if (g is not None and dt is not None) else g for g, dt in zip(out, converted)]
        return tuple(out)

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
        "_strided": torch.strided, "_FLOATS": (float, int, bool), "_INTS": (int, bool), "_MISSING": _MISSING,
        "_NOT_ACCEPTED": (AttributeError, RuntimeError, TypeError),
        "_sigs": dispatcher.signatures, "_grad_enabled": torch.is_grad_enabled,
        "_no_double_backward": _no_double_backward, "_slow": dispatcher.slow_forward,
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
    return cls
