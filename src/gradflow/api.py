"""The public functional API: `grad`, `vjp`, `value_and_grad`.

Each call validates its arguments against the program, runs the AD pipeline on an immutable copy, and
raises a typed `GradflowError` at this edge if anything failed. The argument is never modified.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs

from gradflow.analysis.activity import is_float
from gradflow.autodiff.engine import OVERFLOW
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.passes import Reverse, SplitVJP, ad_pipeline, infer_of
from gradflow.core.checks import ERROR_FLAG, SITES, raise_for_flag
from gradflow.core.errors import InvalidArgumentError, LoopBoundError, UnknownArrayError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline, unwrap_or_raise


def _names(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    names = tuple(value)
    if not names or not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(f"{what} must be an array name or a non-empty sequence of names, got {value!r}")
    return names


def _check(graph: Graph, wrt: tuple[str, ...], of: tuple[str, ...], prefix: str, scalar_of: bool) -> None:
    arrays = graph.sdfg.arrays
    public = [n for n, d in arrays.items() if not d.transient]
    for name in wrt:
        if name not in arrays:
            raise UnknownArrayError.build("wrt", name, public)
        desc = arrays[name]
        if desc.transient:
            raise InvalidArgumentError(f"wrt names '{name}', a transient of the SDFG; differentiate with respect to arguments")
        if not is_float(desc):
            raise InvalidArgumentError(
                f"wrt names '{name}' of type {desc.dtype.as_numpy_dtype()}; only floating-point arrays have gradients",
                "integer arrays are treated as constants",
            )
    for name in of:
        if name not in arrays:
            raise UnknownArrayError.build("of", name, public)
        desc = arrays[name]
        if not is_float(desc):
            raise InvalidArgumentError(f"of names '{name}' of type {desc.dtype.as_numpy_dtype()}; it must be floating-point")
        if scalar_of and desc.total_size != 1:
            raise InvalidArgumentError(
                f"of names '{name}' with {desc.total_size} elements; grad differentiates a one-element array",
                "use gradflow.vjp for a non-scalar output (it takes a cotangent)",
            )
        if name in wrt and not scalar_of:
            raise InvalidArgumentError(
                f"'{name}' is both in wrt and of; vjp names the gradient and the cotangent '{prefix + name}'",
                "use grad for a one-element array updated in place, or copy the output to a new array",
            )
    for name in list(wrt) + (list(of) if not scalar_of else []):
        if prefix + name in arrays:
            raise InvalidArgumentError(
                f"the gradient array name '{prefix + name}' is already taken by an array of the SDFG",
                "pass another prefix=, e.g. prefix='d_'",
            )


def _prepare(program: Any, wrt, of, prefix: str, scalar_of: bool) -> tuple[Graph, tuple[str, ...], tuple[str, ...]]:
    graph = Graph.of(program)
    wrt_names = _names(wrt, "wrt")
    of_names = _names(of, "of") if of is not None else (infer_of(graph.sdfg),)
    _check(graph, wrt_names, of_names, prefix, scalar_of)
    return graph, wrt_names, of_names


def grad(program: Any, wrt: str | Sequence[str], of: str | None = None, *, prefix: str = "grad_",
         pipeline: Pipeline | None = None, forwarding: Forwarding | None = None):
    """A new SDFG computing what `program` computes plus `grad_<x>` = d(of)/d(x) for each x in `wrt`.

    `program` is a `dace.SDFG` or `@dace.program` and is not modified. `of` names a one-element array
    (inferred when the program writes exactly one). `pipeline` replaces the default AD pipeline (e.g.
    `gradflow.ad_pipeline()` edited by step name or with other rule tables); its `reverse` step gets
    `wrt`/`of`/`prefix`/`forwarding` from this call where it leaves them unset, and a step that says
    otherwise is an error. `forwarding` chooses how values reach the backward sweep (default `STORE_ALL`;
    `RECOMPUTE_ALL`, `recompute(...)`); with while-loop bounds the SDFG has one more output,
    `gradflow_overflow` (see `gradflow.Forwarding`).
    """
    return _grad_graph(program, wrt, of, prefix, pipeline, forwarding).to_sdfg()


def _grad_graph(program, wrt, of, prefix: str, pipeline: Pipeline | None, forwarding: Forwarding | None) -> Graph:
    graph, wrt_names, of_names = _prepare(program, wrt, of, prefix, scalar_of=True)
    want = Reverse(wrt_names, of_names, "grad", prefix, forwarding if forwarding is not None else STORE_ALL)
    pipe = ad_pipeline(want) if pipeline is None else bind_pipeline(pipeline, want, forwarding is not None)
    return unwrap_or_raise(pipe(graph))


def bind_pipeline(pipeline: Any, want: Reverse, forwarding_given: bool) -> Pipeline:
    """`pipeline` with its one `reverse` step completed from `want` (the call's wrt/of/prefix/forwarding);
    an `InvalidArgumentError` when it has none, several, or one that disagrees with the call."""
    if not isinstance(pipeline, Pipeline):
        raise InvalidArgumentError(f"pipeline must be a gradflow.Pipeline, got {type(pipeline).__name__}",
                                   "e.g. gradflow.ad_pipeline() or Pipeline.named(...)")
    found = [(k, s) for k, s in enumerate(pipeline.steps) if isinstance(s, Reverse)]
    nested = [s for s in pipeline.walk() if isinstance(s, Reverse)]
    if len(found) != 1 or len(nested) != 1:
        raise InvalidArgumentError(
            f"the pipeline has {len(nested)} 'reverse' steps ({', '.join(pipeline.names())}); grad needs exactly "
            "one, at its top level", "start from gradflow.ad_pipeline() and edit it")
    k, step = found[0]
    changes: dict[str, Any] = {}
    checks = (("wrt", want.wrt), ("of", want.of), ("mode", "grad"), ("prefix", want.prefix))
    for field, value in checks + ((("forwarding", want.forwarding),) if forwarding_given else ()):
        mine = getattr(step, field)
        default = attrs.fields_dict(Reverse)[field].default
        if mine is None or (field in ("prefix", "forwarding") and mine == default):
            changes[field] = value
        elif mine != value and not (field in ("wrt", "of") and set(mine) == set(value)):
            raise InvalidArgumentError(
                f"the pipeline's reverse step has {field}={mine!r}, but grad was called with {field}={value!r}",
                "leave the field unset in the pipeline's Reverse (grad fills it in) or call grad with the same value")
    bound = attrs.evolve(step, **changes) if changes else step
    return Pipeline(pipeline.steps[:k] + (bound,) + pipeline.steps[k + 1:], pipeline.hook, pipeline.assumes)


def check_loop_bounds(arrays: Any, interface: Any) -> None:
    """Raise `LoopBoundError` when a run of a differentiated program stopped a while loop at its bound."""
    flag = arrays.get(OVERFLOW) if interface is not None and interface.bounded_loops else None
    if flag is None:
        return
    number = int(flag.reshape(-1)[0])
    if number:
        label, bound = interface.bounded_loops[number - 1]
        raise LoopBoundError(
            f"while loop '{label}' ran more than its bound of {bound} iterations; the gradients of this call are "
            "invalid",
            f"raise the bound: forwarding=gradflow.Forwarding(loop_bounds={{'{label}': <larger>}})",
        )


def vjp(program: Any, wrt: str | Sequence[str], of: str | Sequence[str], *, prefix: str = "grad_",
        forwarding: Forwarding = STORE_ALL) -> VJPResult:
    """Separate forward and backward SDFGs for a vector-Jacobian product (see `VJPResult`)."""
    graph, wrt_names, of_names = _prepare(program, wrt, of, prefix, scalar_of=False)
    pipe = ad_pipeline(Reverse(wrt_names, of_names, "vjp", prefix, forwarding)) + SplitVJP()
    result = unwrap_or_raise(pipe(graph))
    sites = result.meta.get(SITES)
    return attrs.evolve(result.meta["vjp"], index_sites=tuple(sites)) if sites else result.meta["vjp"]


def value_and_grad(program: Any, wrt: str | Sequence[str], of: str | None = None, *,
                   forwarding: Forwarding = STORE_ALL) -> Callable[..., tuple]:
    """A callable `f(*arrays, **arrays) -> (value, grads)` in the style of `jax.value_and_grad`.

    Arguments follow the program's argument order (or are passed by name); arrays the program writes but
    the caller omits are allocated. `grads` is one array when `wrt` is a name, else a dict by name. numpy
    arrays in, numpy out; torch tensors in, torch tensors out. Compiles once per graph (fingerprint cache).
    """
    from gradflow.runtime.invoke import Invoker

    result = _grad_graph(program, wrt, of, "grad_", None, forwarding)
    interface = result.meta.get("ad")
    graph = Graph.adopt(result.to_sdfg())
    wrt_names = _names(wrt, "wrt")
    of_name = of if of is not None else infer_of(graph.sdfg)
    invoker = Invoker(graph)

    def call(*args: Any, **kwargs: Any):
        arrays, as_torch = invoker(*args, **kwargs)
        check_loop_bounds(arrays, interface)
        raise_for_flag(arrays.get(ERROR_FLAG), result.meta.get(SITES, ()))
        value = arrays[of_name].reshape(-1)[0].item()
        grads = {x: arrays["grad_" + x] for x in wrt_names}
        if as_torch:
            import torch

            grads = {k: torch.as_tensor(v) for k, v in grads.items()}  # zero-copy; tensors as they are
        return value, (grads[wrt] if isinstance(wrt, str) else grads)

    return call

