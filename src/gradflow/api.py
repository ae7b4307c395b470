"""The public functional API: `grad`, `vjp`, `value_and_grad`.

Each call validates its arguments against the program, runs the AD pipeline on an immutable copy, and
raises a typed `GradflowError` at this edge if anything failed. The argument is never modified.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from gradflow.analysis.activity import is_float
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.passes import Reverse, SplitVJP, ad_pipeline, infer_of
from gradflow.core.errors import InvalidArgumentError, UnknownArrayError
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
        if name in wrt:
            raise InvalidArgumentError(f"'{name}' is both in wrt and of")
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
         pipeline: Pipeline | None = None):
    """A new SDFG computing what `program` computes plus `grad_<x>` = d(of)/d(x) for each x in `wrt`.

    `program` is a `dace.SDFG` or `@dace.program` and is not modified. `of` names a one-element array
    (inferred when the program writes exactly one). `pipeline` replaces the default AD pipeline (it must
    end with a `Reverse` pass, e.g. `gradflow.autodiff.ad_pipeline(...)` plus custom steps).
    """
    graph, wrt_names, of_names = _prepare(program, wrt, of, prefix, scalar_of=True)
    pipe = pipeline or ad_pipeline(Reverse(wrt_names, of_names, "grad", prefix))
    result = unwrap_or_raise(pipe(graph))
    return result.to_sdfg()


def vjp(program: Any, wrt: str | Sequence[str], of: str | Sequence[str], *, prefix: str = "grad_") -> VJPResult:
    """Separate forward and backward SDFGs for a vector-Jacobian product (see `VJPResult`)."""
    graph, wrt_names, of_names = _prepare(program, wrt, of, prefix, scalar_of=False)
    pipe = ad_pipeline(Reverse(wrt_names, of_names, "vjp", prefix)) + SplitVJP()
    result = unwrap_or_raise(pipe(graph))
    return result.meta["vjp"]


def value_and_grad(program: Any, wrt: str | Sequence[str], of: str | None = None) -> Callable[..., tuple]:
    """A callable `f(*arrays, **arrays) -> (value, grads)` in the style of `jax.value_and_grad`.

    Arguments follow the program's argument order (or are passed by name); arrays the program writes but
    the caller omits are allocated. `grads` is one array when `wrt` is a name, else a dict by name. numpy
    arrays in, numpy out; torch tensors in, torch tensors out. Compiles once per graph (fingerprint cache).
    """
    from gradflow.runtime.invoke import Invoker

    sdfg = grad(program, wrt, of)
    graph = Graph.adopt(sdfg)
    wrt_names = _names(wrt, "wrt")
    of_name = of if of is not None else infer_of(graph.sdfg)
    invoker = Invoker(graph)

    def call(*args: Any, **kwargs: Any):
        arrays, as_torch = invoker(*args, **kwargs)
        value = arrays[of_name].reshape(-1)[0].item()
        grads = {x: arrays["grad_" + x] for x in wrt_names}
        if as_torch:
            import torch

            grads = {k: torch.from_numpy(v) for k, v in grads.items()}
        return value, (grads[wrt] if isinstance(wrt, str) else grads)

    return call

