"""The public functional API: `grad`, `vjp`, `value_and_grad`.

Each call validates its arguments against the program, runs the AD pipeline on an immutable copy, and
raises a typed `GradflowError` at this edge if anything failed. The argument is never modified.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Sequence

import attrs
import dace

from gradflow.analysis.activity import is_float
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.passes import Reverse, SplitVJP, ad_pipeline, infer_of
from gradflow.autodiff.spec import ADInterface, check_loop_bounds
from gradflow.core.checks import ERROR_FLAG, SITES, raise_for_flag
from gradflow.core.dace_warnings import ignore_tape_pushes
from gradflow.core.errors import (
    ORIGINS,
    InvalidArgumentError,
    UnknownArrayError,
    describe,
    with_origins,
)
from gradflow.core.graph import Graph
from gradflow.core.names import check_identifiers, identifier_problem
from gradflow.core.passes import Pipeline, unwrap_or_raise

if TYPE_CHECKING:  # the runtime (and torch) load at the first call, not with `import gradflow`
    from gradflow.at_call import AtCall
    from gradflow.runtime.invoke import Invoker


def _names(value: Any, what: str) -> tuple[str, ...]:
    """`value` (one name, or an iterable of names) as a tuple of distinct names; else an
    `InvalidArgumentError` naming the argument `what`."""
    if isinstance(value, str):
        names: tuple = (value,)
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        names = tuple(value)
    else:
        names = ()
    if not names or not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(
            f"{what} must be an array name or a non-empty sequence of names, got {describe(value)}",
            f"e.g. {what}='X' or {what}=['X', 'W']")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"{what} names {', '.join(repr(n) for n in twice)} more than once")
    return names


def _check_options(prefix: Any, forwarding: Any) -> None:
    """The keyword options every entry point shares: typed errors naming the option."""
    if prefix is not None and not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a string, got {describe(prefix)}", "e.g. prefix='grad_'")
    check_forwarding(forwarding)


def check_forwarding(forwarding: Any) -> None:
    """`forwarding=` of any entry point: None or a `gradflow.Forwarding`, else an error naming the option."""
    if forwarding is not None and not isinstance(forwarding, Forwarding):
        raise InvalidArgumentError(
            f"forwarding must be a gradflow.Forwarding, got {describe(forwarding)}",
            "use gradflow.STORE_ALL, gradflow.RECOMPUTE_ALL or gradflow.recompute('A', ...)")


def _check(graph: Graph, wrt: tuple[str, ...], of: tuple[str, ...], prefix: str, scalar_of: bool,
           both: bool = False) -> None:
    """`both`: an array may be in `wrt` and `of` (forward mode: one tangent argument, in and out)."""
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
        if name in wrt and not scalar_of and not both:
            raise InvalidArgumentError(
                f"'{name}' is both in wrt and of; vjp names the gradient and the cotangent '{prefix + name}'",
                "use grad for a one-element array updated in place, or copy the output to a new array",
            )
    for name in dict.fromkeys(list(wrt) + (list(of) if not scalar_of else [])):
        if prefix + name in arrays:
            raise InvalidArgumentError(
                f"the gradient array name '{prefix + name}' is already taken by an array of the SDFG",
                "pass another prefix=, e.g. prefix='d_', or prefix=None for the first free one of grad_, grad2_, ...",
            )
        problem = identifier_problem(prefix + name)
        if problem is not None:
            raise InvalidArgumentError(
                f"prefix {prefix!r} makes the gradient array name {prefix + name!r}, which {problem}",
                "pass a prefix of letters, digits and underscores, e.g. prefix='d_'",
            )


def free_prefix(sdfg: dace.SDFG, names: Iterable[str]) -> str:
    """`grad_`, or `grad2_`, `grad3_`, ... when the program has arrays of those names already (it is a
    gradient program, differentiated again)."""
    k = 1
    while any(f"grad{k if k > 1 else ''}_{n}" in sdfg.arrays for n in names):
        k += 1
    return f"grad{k if k > 1 else ''}_"


def _prepare(program: Any, wrt, of, prefix: Any, forwarding: Any,
             scalar_of: bool) -> tuple[Graph, tuple[str, ...], tuple[str, ...], str]:
    """The parsed program, the checked names, and the prefix (`free_prefix` where `prefix` is None)."""
    ignore_tape_pushes()  # again: a test runner restores the warning filters its collection phase changed
    wrt_names = _names(wrt, "wrt")
    of_names = _names(of, "of") if of is not None else None
    _check_options(prefix, forwarding)
    graph = Graph.of(program)
    check_identifiers(graph.sdfg)
    of_names = of_names if of_names is not None else (infer_of(graph.sdfg),)
    if prefix is None:
        prefix = free_prefix(graph.sdfg, set(wrt_names) | (set() if scalar_of else set(of_names)))
    _check(graph, wrt_names, of_names, prefix, scalar_of)
    return graph, wrt_names, of_names, prefix


def grad(program: Any, wrt: str | Sequence[str], of: str | None = None, *, prefix: str | None = "grad_",
         pipeline: Pipeline | None = None, forwarding: Forwarding | None = None, optimize: bool | Pipeline = True):
    """A new SDFG computing what `program` computes plus `grad_<x>` = d(of)/d(x) for each x in `wrt`.

    `program` is a `dace.SDFG` or `@dace.program` and is not modified. `of` names a one-element array
    (inferred when the program writes exactly one). `pipeline` replaces the default AD pipeline (e.g.
    `gradflow.ad_pipeline()` edited by step name or with other rule tables); its `reverse` step gets
    `wrt`/`of`/`prefix`/`forwarding` from this call where it leaves them unset, and a step that says
    otherwise is an error. `forwarding` chooses how values reach the backward sweep (default `STORE_ALL`;
    `RECOMPUTE_ALL`, `recompute(...)`); with while-loop bounds, or loops checkpointed for the trip count
    at `sizes=`, the SDFG has one more output, `gradflow_overflow`: nonzero when a run broke such a limit,
    whose gradients are then invalid (see `gradflow.Forwarding`). `optimize` applies
    `gradflow.optimize.OPTIMIZE` to the result (True, the default), nothing (False) or the given pipeline.
    `prefix=None` takes the first of `grad_`, `grad2_`, ... that names no array yet (for the gradient of a gradient program; see
    "Second order" in the user guide).
    """
    graph = grad_graph(program, wrt, of, prefix, pipeline, forwarding, optimize)
    # The result is a value built for this call that no one else holds: hand its SDFG out without a copy,
    # unless (an edited pipeline that changed nothing) it is the caller's own.
    return graph.to_sdfg() if graph.sdfg is _sdfg_of(program) else graph.sdfg


def grad_graph(program, wrt, of, prefix: str | None = "grad_", pipeline: Pipeline | None = None,
               forwarding: Forwarding | None = None, optimize: bool | Pipeline = True) -> Graph:
    """`grad` as a frozen `Graph` whose `meta["ad"]` (`ADInterface`) says what was built: gradient names,
    what the tape stores, what is recomputed, which rules were applied."""
    graph, wrt_names, of_names, prefix = _prepare(program, wrt, of, prefix, forwarding, scalar_of=True)
    want = Reverse(wrt_names, of_names, "grad", prefix, forwarding if forwarding is not None else STORE_ALL)
    pipe = ad_pipeline(want) if pipeline is None else bind_pipeline(pipeline, want, forwarding is not None)
    # Values built for this call (the parsed or copied program, the differentiated graph) are lent to the
    # next pipeline, which may then edit them without another deep copy (`Graph._lend`).
    call = object()
    if graph.sdfg is not _sdfg_of(program):
        graph._lend(call)
    result = _run(pipe, graph)
    if result.sdfg is not _sdfg_of(program):
        result._lend(call)
    final = optimized(result, optimize)
    final._reclaim(call)
    return final


def _sdfg_of(program: Any) -> dace.SDFG | None:
    """The SDFG object the caller passed (a `dace.SDFG` or a `Graph`), None for a `@dace.program`."""
    if isinstance(program, Graph):
        return program.sdfg
    return program if isinstance(program, dace.SDFG) else None


def _run(pipe: Pipeline, graph: Graph) -> Graph:
    """The AD pipeline's result, or its error naming where generated code came from (an ONNX node)."""
    origins = graph.meta.get(ORIGINS)
    result = pipe(graph)
    return unwrap_or_raise(result.alt(lambda e: with_origins(e, origins)) if origins else result)


def optimization(optimize: bool | Pipeline) -> Pipeline | None:
    """The optimization pipeline `optimize=` asks for: the default one, none, or the one given."""
    from gradflow.optimize import OPTIMIZE

    if optimize is True:
        return OPTIMIZE
    if optimize is False or optimize is None:
        return None
    if isinstance(optimize, Pipeline):
        return optimize
    raise InvalidArgumentError(f"optimize must be True, False or a gradflow.Pipeline, got {optimize!r}")


def optimized(graph: Graph, optimize: bool | Pipeline) -> Graph:
    pipe = optimization(optimize)
    return graph if pipe is None else unwrap_or_raise(pipe(graph))


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


def vjp(program: Any, wrt: str | Sequence[str], of: str | Sequence[str], *, prefix: str | None = "grad_",
        forwarding: Forwarding = STORE_ALL, optimize: bool | Pipeline = True) -> VJPResult:
    """Separate forward and backward SDFGs for a vector-Jacobian product (see `VJPResult`); `optimize`
    as for `grad`, applied to each of them."""
    if of is None:
        raise InvalidArgumentError("vjp needs of= (the outputs whose cotangents it takes)", "e.g. of='Y'")
    graph, wrt_names, of_names, prefix = _prepare(program, wrt, of, prefix, forwarding, scalar_of=False)
    forwarding = forwarding if forwarding is not None else STORE_ALL
    pipe = ad_pipeline(Reverse(wrt_names, of_names, "vjp", prefix, forwarding)) + SplitVJP()
    graph = _run(pipe, graph)
    sites = graph.meta.get(SITES)
    result = attrs.evolve(graph.meta["vjp"], index_sites=tuple(sites)) if sites else graph.meta["vjp"]
    if optimization(optimize) is None:
        return result
    return attrs.evolve(result, forward=optimized(Graph.adopt(result.forward), optimize).to_sdfg(),
                        backward=optimized(Graph.adopt(result.backward), optimize).to_sdfg())


def value_and_grad(program: Any, wrt: str | Sequence[str], of: str | None = None, *,
                   forwarding: Forwarding = STORE_ALL, optimize: bool | Pipeline = True) -> Callable[..., tuple]:
    """A callable `f(*arrays, **arrays) -> (value, grads)` in the style of `jax.value_and_grad`.

    Arguments follow the program's argument order (or are passed by name); arrays the program writes but
    the caller omits are allocated. `grads` is one array when `wrt` is a name, else a dict by name. numpy
    arrays in, numpy out; torch tensors in, torch tensors out. Compiles once per graph (fingerprint cache).
    """
    from gradflow.at_call import AtCall, plans_at_call

    _check_options(None, forwarding)
    forwarding = forwarding if forwarding is not None else STORE_ALL
    # the gradients are returned by wrt name: their arrays take a free prefix (`free_prefix`), so the
    # gradient of a gradient program is one call too
    if not plans_at_call(forwarding):
        return _ValueAndGrad(wrt, built=_Built.of(grad_graph(program, wrt, of, None, None, forwarding, optimize)))
    graph, _, _, _ = _prepare(program, wrt, of, None, forwarding, scalar_of=True)  # errors before any call
    return _ValueAndGrad(wrt, at_call=AtCall(
        graph, forwarding, lambda policy: _Built.of(grad_graph(graph, wrt, of, None, None, policy, optimize))))


@attrs.frozen
class _Built:
    """A differentiated program ready to call: what it computes, its caller, its index checks."""

    interface: ADInterface
    invoker: Invoker
    sites: tuple

    @staticmethod
    def of(result: Graph) -> "_Built":
        from gradflow.runtime.invoke import Invoker

        return _Built(result.meta["ad"], Invoker(Graph.adopt(result.to_sdfg())), tuple(result.meta.get(SITES, ())))


class _ValueAndGrad:
    """The function `value_and_grad` returns: one build, or (a policy planned at the call) one per set of
    call values (`gradflow.at_call.AtCall`)."""

    def __init__(self, wrt: str | Sequence[str], built: _Built | None = None, at_call: AtCall | None = None) -> None:
        self._wrt, self._built, self._at_call = wrt, built, at_call

    @property
    def plans(self) -> dict:
        """The forwarding plans built so far by the call values they were made for (planned at the call)."""
        builds = self._at_call.builds if self._at_call is not None else {}
        return {k: b.interface.forwarding_plan for k, b in builds.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        built = self._built if self._at_call is None else self._at_call(args, kwargs)
        assert built is not None  # one of the two is given
        interface = built.interface  # the names grad_graph checked (and inferred) and the gradients' arrays
        arrays, as_torch = built.invoker(*args, **kwargs)
        if interface.bounded_loops:
            check_loop_bounds(arrays, interface.bounded_loops)
        if ERROR_FLAG in arrays:
            raise_for_flag(arrays[ERROR_FLAG], built.sites)
        value = arrays[interface.spec.of[0]].reshape(-1)[0].item()
        if isinstance(self._wrt, str) and not as_torch:
            return value, arrays[interface.grads[self._wrt]]
        grads = {x: arrays[g] for x, g in interface.grads.items()}
        if as_torch:
            import torch

            grads = {k: torch.as_tensor(v) for k, v in grads.items()}  # zero-copy; tensors as they are
        return value, (grads[self._wrt] if isinstance(self._wrt, str) else grads)
