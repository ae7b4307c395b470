"""Dense Jacobians of small vector functions: `jacfwd` (one tangent sweep per input element) and `jacrev`
(one forward sweep, then one backward sweep per output element), as `torch.func.jacfwd`/`jacrev` and
`jax.jacfwd`/`jacrev` build them. Which is cheaper depends on the shape: `jacfwd` for fewer inputs than
outputs, `jacrev` for the opposite.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gradflow.api import vjp
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.core.errors import ArgumentError, InvalidArgumentError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.forward import ValueAndJVP, value_and_jvp


def _one(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} takes one array name here, got {value!r}", f"e.g. {what}='x'")
    return value


def _as_numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def _returned(jacobian: np.ndarray, as_torch: bool) -> Any:
    if as_torch:
        import torch

        return torch.as_tensor(jacobian)
    return jacobian


def _copies(given: dict) -> dict:
    return {k: (v.clone() if hasattr(v, "clone") else np.array(v, copy=True)) if hasattr(v, "shape") else v
            for k, v in given.items()}


def jacfwd(program: Any, wrt: str, of: str, *, optimize: bool | Pipeline = True) -> Callable[..., Any]:
    """A callable `f(*arrays, **arrays) -> J`, the Jacobian of the output `of` with respect to the array
    `wrt` (shape `of.shape + wrt.shape`), one tangent sweep per element of `wrt`. The caller's arrays are
    not written."""
    wrt, of = _one(wrt, "wrt"), _one(of, "of")
    tangent = value_and_jvp(program, wrt, of, optimize=optimize)
    assert isinstance(tangent, ValueAndJVP)  # (value_and_jvp is typed as the callable it returns)

    def f(*args: Any, **kwargs: Any) -> Any:
        given, symbols, as_torch = tangent.invoker.bind(args, kwargs)
        if wrt not in given:
            raise ArgumentError(f"argument '{wrt}' is missing")
        x = _as_numpy(given[wrt])
        columns = []
        for k in range(max(x.size, 1)):  # an empty `wrt` still takes one sweep, for the output's shape
            direction = np.zeros(x.size, dtype=x.dtype)
            if x.size:
                direction[k] = 1.0
            _, tangents = tangent(**_copies(given), **symbols, **{f"tan_{wrt}": direction.reshape(x.shape)})
            columns.append(_as_numpy(tangents[of]).reshape(-1))
        out_shape = _as_numpy(tangents[of]).shape
        if not x.size:  # the Jacobian with respect to nothing: no columns
            return _returned(np.zeros(out_shape + x.shape, dtype=columns[0].dtype), as_torch)
        return _returned(np.stack(columns, axis=-1).reshape(out_shape + x.shape), as_torch)

    return f


def jacrev(program: Any, wrt: str, of: str, *, forwarding: Forwarding = STORE_ALL,
           optimize: bool | Pipeline = True) -> Callable[..., Any]:
    """A callable `f(*arrays, **arrays) -> J`, the Jacobian of the output `of` with respect to the array
    `wrt` (shape `of.shape + wrt.shape`): the split `vjp`'s forward sweep once, its backward sweep once per
    element of `of` (on what the forward saved). The caller's arrays are not written."""
    from gradflow.runtime.invoke import Invoker

    wrt, of = _one(wrt, "wrt"), _one(of, "of")
    result = vjp(program, wrt, [of], prefix=None, forwarding=forwarding, optimize=optimize)
    forward = Invoker(Graph.adopt(result.forward))
    backward = Invoker(Graph.adopt(result.backward))

    def f(*args: Any, **kwargs: Any) -> Any:
        given, symbols, as_torch = forward.bind(args, kwargs)
        if wrt not in given:
            raise ArgumentError(f"argument '{wrt}' is missing")
        given = {k: np.array(_as_numpy(v), copy=True) if hasattr(v, "shape") else v for k, v in given.items()}
        values = forward.symbol_values(given, symbols)
        # what the forward saves for the backward: the caller's to allocate
        given.update(forward.zeros({n for n in result.saved if n not in given}, values))
        after, _ = forward(**given, **symbols)
        out = _as_numpy(after[of])
        taken = set(backward.runner.plan.names)
        forwarded = {n: after[n] if n in after else given[n] for n in result.forwarded}
        extents = {k: v for k, v in values.items() if k in taken and k not in forwarded}
        rows = []
        for k in range(out.size):
            seed = np.zeros(out.size, dtype=out.dtype)
            seed[k] = 1.0
            grads, _ = backward(**forwarded, **extents, **{result.cotangents[of]: seed.reshape(out.shape)})
            rows.append(_as_numpy(grads[result.grads[wrt]]).reshape(-1))
        x = _as_numpy(given[wrt])
        if not rows:  # the Jacobian of no outputs: no rows
            return _returned(np.zeros(out.shape + x.shape, dtype=out.dtype), as_torch)
        return _returned(np.stack(rows).reshape(out.shape + x.shape), as_torch)

    return f
