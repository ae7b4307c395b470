"""Forward mode and second order: `jvp`, `value_and_jvp`, `hvp`, `grad_and_hvp`, `hessian`.

`jvp` builds the tangent program (`autodiff/tangent/`): the program's outputs plus `tan_<out>`, the
directional derivative of each `of` output along the input tangents `tan_<x>`. `hvp` is forward over
reverse: the tangent program of the gradient program (optimized by `BEFORE_TANGENT` only), so the
Hessian-vector product costs about one gradient and one tangent sweep of it, and needs no new rules.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import dace
import numpy as np

from gradflow.analysis.writes import written
from gradflow.api import _check, _names, _run, grad_graph, optimized
from gradflow.autodiff.forwarding import Forwarding
from gradflow.autodiff.spec import check_loop_bounds
from gradflow.autodiff.tangent.passes import Tangent, jvp_pipeline, written_arguments
from gradflow.core.checks import ERROR_FLAG, SITES, raise_for_flag
from gradflow.core.errors import ArgumentError, InvalidArgumentError
from gradflow.core.graph import Graph
from gradflow.core.names import check_identifiers
from gradflow.core.passes import Pipeline
from gradflow.optimize.dead_stores import DropDeadStores
from gradflow.optimize.overwrite_zeroed_products import OverwriteZeroedProducts


def jvp_graph(program: Any, wrt: str | Sequence[str], of: str | Sequence[str] | None = None, *,
              prefix: str = "tan_", optimize: bool | Pipeline = True) -> Graph:
    """`jvp` as a frozen `Graph`; `meta["tangent"]` (`TangentInterface`) names the tangent arguments."""
    wrt_names = _names(wrt, "wrt")
    graph = Graph.of(program)
    check_identifiers(graph.sdfg)
    of_names = _names(of, "of") if of is not None else written_arguments(graph.sdfg)
    if not of_names:
        raise InvalidArgumentError("the program writes no floating-point argument: nothing has a tangent",
                                   "pass of='<name>'")
    _check(graph, wrt_names, of_names, prefix, scalar_of=False, both=True)
    result = _run(jvp_pipeline(Tangent(wrt_names, of_names, prefix)), graph)
    return optimized(result, optimize)


def jvp(program: Any, wrt: str | Sequence[str], of: str | Sequence[str] | None = None, *, prefix: str = "tan_",
        optimize: bool | Pipeline = True) -> dace.SDFG:
    """A new SDFG computing what `program` computes plus, for each `of` output (default: every float
    argument it writes), `tan_<out>`: its directional derivative along the tangents `tan_<x>` of the `wrt`
    inputs, which it takes as arguments. An array both in `wrt` and `of` (updated in place) has one
    tangent argument, read as the input's tangent and overwritten with the output's."""
    return jvp_graph(program, wrt, of, prefix=prefix, optimize=optimize).to_sdfg()


class _Call:
    """A tangent (or Hessian-vector) program bound for calls: tangents passed as `tan_<x>` keywords."""

    def __init__(self, graph: Graph, wrt: tuple[str, ...], limits: tuple = ()) -> None:
        from gradflow.runtime.invoke import Invoker

        self.interface = graph.meta["tangent"]
        #: the loop limits of the gradient program a Hessian-vector program is the tangent of (`LoopLimit`):
        #: a run that broke one is refused, as `value_and_grad` refuses it
        self.limits = limits
        self.invoker = Invoker(Graph.adopt(graph.to_sdfg()))
        self.wrt = wrt
        self.sites = tuple(graph.meta.get(SITES, ()))
        self.overwritten = written(graph.sdfg)

    @property
    def arguments(self) -> frozenset[str]:
        """The names the program takes (arrays, scalars and symbols); compiles it on first use."""
        return frozenset(self.invoker.runner.plan.names)

    def __call__(self, args: tuple, kwargs: dict) -> dict:
        names = self.interface.arguments()
        given = dict(kwargs)
        for x in self.wrt:
            key = names[x]
            if key not in given:
                raise ArgumentError(f"the tangent of '{x}' is missing", f"pass it as the keyword {key}=...")
            if key in self.overwritten:  # the program updates x in place: the caller's tangent stays as it was
                value = given[key]
                given[key] = value.clone() if hasattr(value, "clone") else np.array(value, copy=True)
        arrays, as_torch = self.invoker(*args, **given)
        raise_for_flag(arrays.get(ERROR_FLAG), self.sites)
        check_loop_bounds(arrays, self.limits)
        if as_torch:
            import torch

            arrays = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
        return arrays


def _value(array: Any) -> Any:
    return array.reshape(-1)[0].item() if array.size == 1 else array


def value_and_jvp(program: Any, wrt: str | Sequence[str], of: str | Sequence[str] | None = None, *,
                  optimize: bool | Pipeline = True) -> Callable[..., tuple]:
    """A callable `f(*arrays, tan_<x>=..., **arrays) -> (value, {out: tangent})`, called like
    `value_and_grad`'s function with each input tangent as the keyword `tan_<x>`. `value` is the output
    (a float for a one-element array) when `of` is one name, else a dict by name."""
    graph = jvp_graph(program, wrt, of, optimize=optimize)
    return ValueAndJVP(_Call(graph, _names(wrt, "wrt")), of)


class ValueAndJVP:
    """The function `value_and_jvp` returns."""

    def __init__(self, call: _Call, of: Any) -> None:
        self._call, self._single = call, isinstance(of, str)
        self.outputs = call.interface.spec.of

    @property
    def arguments(self) -> frozenset[str]:
        """The names the program takes (arrays, scalars and symbols); compiles it on first use."""
        return self._call.arguments

    @property
    def invoker(self) -> Any:
        """The tangent program's `Invoker` (binds arguments by the program's order)."""
        return self._call.invoker

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        arrays = self._call(args, kwargs)
        names = self._call.interface.arguments()
        tangents = {o: arrays[names[o]] for o in self.outputs}
        values = {o: _value(arrays[o]) for o in self.outputs}
        return (values[self.outputs[0]] if self._single else values), tangents


#: what the gradient program goes through before its tangent is taken: rewrites of the reverse sweep's own
#: pattern (zero a buffer, then add into all of it once) that the tangent program, where each buffer's
#: zeroing and adds also carry its tangent's, no longer shows (k-means' Hessian-vector program zeroed four
#: n x k buffers per call). The other optimizations run on the tangent program.
BEFORE_TANGENT = Pipeline((OverwriteZeroedProducts(), DropDeadStores()))


def hvp(program: Any, wrt: str | Sequence[str], of: str | None = None, *, forwarding: Forwarding | None = None,
        optimize: bool | Pipeline = True) -> Callable[..., dict]:
    """A callable `f(*arrays, tan_<x>=..., **arrays) -> {x: H v}`: the product of the Hessian of the
    one-element output `of` with the direction `v` given as the tangents `tan_<x>` of the `wrt` inputs.
    Forward over reverse: the tangent program of the gradient program (`grad_<x>`, built under
    `forwarding`)."""
    wrt_names = _names(wrt, "wrt")
    gradient = grad_graph(program, wrt_names, of, None, forwarding=forwarding, optimize=BEFORE_TANGENT)
    grads = gradient.meta["ad"].grads
    graph = jvp_graph(gradient, wrt_names, [grads[x] for x in wrt_names], optimize=optimize)
    return HVP(_Call(graph, wrt_names, gradient.meta["ad"].bounded_loops), {x: grads[x] for x in wrt_names})


def grad_and_hvp(program: Any, wrt: str | Sequence[str], of: str | None = None, *,
                 forwarding: Forwarding | None = None, optimize: bool | Pipeline = True) -> Callable[..., tuple]:
    """`hvp`'s program, called as `f(*arrays, tan_<x>=..., **arrays) -> ({x: gradient}, {x: H v})`. The
    gradient is what the Hessian-vector program computes on its way (the primal of its tangent sweep, as
    `jax.jvp(jax.grad(f), ...)` returns it): a Newton step needs both and pays for one program, not a
    `value_and_grad` call besides."""
    product = hvp(program, wrt, of, forwarding=forwarding, optimize=optimize)
    assert isinstance(product, HVP)  # (hvp is typed as the callable it returns)
    return GradAndHVP(product._call, product._grads)


class HVP:
    """The function `hvp` returns: `{x: H v}` from the inputs and the direction's `tan_<x>` keywords."""

    def __init__(self, call: _Call, grads: dict[str, str]) -> None:
        self._call, self._grads = call, grads

    @property
    def arguments(self) -> frozenset[str]:
        """The names the program takes (arrays, scalars and symbols); compiles it on first use."""
        return self._call.arguments

    @property
    def invoker(self) -> Any:
        """The Hessian-vector program's `Invoker` (binds arguments by the program's order)."""
        return self._call.invoker

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        arrays = self._call(args, kwargs)
        names = self._call.interface.arguments()
        return {x: arrays[names[g]] for x, g in self._grads.items()}


class GradAndHVP(HVP):
    """The function `grad_and_hvp` returns: `({x: gradient}, {x: H v})`."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:  # type: ignore[override]
        arrays = self._call(args, kwargs)
        names = self._call.interface.arguments()
        return ({x: arrays[g] for x, g in self._grads.items()},
                {x: arrays[names[g]] for x, g in self._grads.items()})


def hessian(program: Any, wrt: str, of: str | None = None, *, optimize: bool | Pipeline = True) -> Callable[..., Any]:
    """A callable `f(*arrays, **arrays) -> H`, the dense Hessian of the one-element output `of` with respect
    to the array `wrt` (shape `x.shape + x.shape`), one Hessian-vector product per element of `x`: for
    small inputs."""
    if not isinstance(wrt, str):
        raise InvalidArgumentError("hessian takes one wrt array name", "e.g. hessian(program, wrt='x')")
    product = hvp(program, wrt, of, optimize=optimize)
    assert isinstance(product, HVP)  # (hvp is typed as the callable it returns)

    def f(*args: Any, **kwargs: Any) -> Any:
        # bound by the Hessian-vector program's own argument order (the program is not parsed again)
        arrays, symbols, _ = product.invoker.bind(args, kwargs)
        given = {**arrays, **symbols}
        if wrt not in given:
            raise ArgumentError(f"argument '{wrt}' is missing")
        x = given[wrt]
        torch_in = hasattr(x, "detach")
        base = x.detach().cpu().numpy() if torch_in else np.asarray(x)
        rows = []
        for k in range(base.size):
            direction = np.zeros(base.size, dtype=base.dtype)
            direction[k] = 1.0
            call = {n: (v.clone() if hasattr(v, "clone") else np.array(v, copy=True)) if hasattr(v, "shape") else v
                    for n, v in given.items()}
            rows.append(np.asarray(product(**call, **{f"tan_{wrt}": direction.reshape(base.shape)})[wrt]).reshape(-1))
        h = np.stack(rows).reshape(base.shape + base.shape)
        if torch_in:
            import torch

            return torch.as_tensor(h)
        return h

    return f
