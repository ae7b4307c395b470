"""The routes by which a gradient reaches a user, run on numpy data: the combined `grad` SDFG, the split
`vjp` pair (forward, then backward on what the forward saved), `gradflow.value_and_grad` (a byte budget
planned at the call, for the call's sizes), and a `gradflow.torch.function` of the
program (either dispatcher: `torch`, `torch_cpp`) called on tensors and differentiated by `torch.autograd`. Checks that must hold on every route
(the fuzzer's, the soundness tests') call these, so each route is exercised the way its users exercise it.
"""

from __future__ import annotations

from typing import Callable, Mapping

import dace
import numpy as np

from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.spec import check_loop_bounds
from gradflow.core.graph import Graph
from gradflow.runtime.invoke import Invoker

#: the routes `gradient` takes
ROUTES = ("grad", "vjp", "value_and_grad", "torch", "torch_cpp")


def _copies(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


def _used(symbols: Mapping[str, int], sdfg: dace.SDFG, given: Mapping) -> dict[str, int]:
    """The symbols among `symbols` that `sdfg` takes (and that are not passed as arguments already)."""
    taken = set(map(str, sdfg.free_symbols)) | set(sdfg.symbols)
    return {k: v for k, v in symbols.items() if k in taken and k not in given}


def run_grad(graph: Graph, arrays: Mapping[str, np.ndarray], symbols: Mapping[str, int],
             grads: Mapping[str, str], invoker: Invoker | None = None
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run a `grad` SDFG (through `invoker`, one of `graph` kept by the caller, if given) on copies of
    `arrays`: (every array afterwards, the gradients by `wrt` name)."""
    given = _copies(arrays)
    out, _ = (invoker or Invoker(graph))(**given, **_used(symbols, graph.sdfg, given))
    # a run that broke a loop limit of its build gives no gradient (as `value_and_grad` refuses it)
    check_loop_bounds(out, graph.meta["ad"].bounded_loops if "ad" in graph.meta else ())
    return out, {x: np.array(out[g]) for x, g in grads.items()}


def run_vjp(result: VJPResult, arrays: Mapping[str, np.ndarray], symbols: Mapping[str, int],
            cotangents: Mapping[str, np.ndarray], invokers: tuple[Invoker, Invoker] | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run the forward SDFG of a `vjp` on copies of `arrays` (its saved values allocated), then the backward
    on what it forwarded and `cotangents` (by output name): (every forward array, the gradients by name).
    `invokers`, the forward's and the backward's, are kept by a caller that runs the pair again."""
    forward, backward = invokers or (Invoker(Graph.adopt(result.forward)), Invoker(Graph.adopt(result.backward)))
    taken = {k: v for k, v in _copies(arrays).items() if k in result.forward.arrays
             and not result.forward.arrays[k].transient}
    for name in result.saved:  # what the forward saves for the backward, allocated by the caller
        desc = result.forward.arrays[name]
        shape = tuple(int(dace.symbolic.evaluate(d, {dace.symbol(k): v for k, v in symbols.items()}))
                      for d in desc.shape)
        taken[name] = np.zeros(shape, dtype=desc.dtype.as_numpy_dtype())
    after, _ = forward(**taken, **_used(symbols, result.forward, taken))
    check_loop_bounds(after, result.bounded_loops)
    given = {name: after[name] if name in after else arrays[name] for name in result.forwarded}  # scalars as given
    given.update({result.cotangents[o]: np.array(c, copy=True) for o, c in cotangents.items()})
    out, _ = backward(**given, **_used(symbols, result.backward, given))
    return after, {x: np.array(out[g]) for x, g in result.grads.items()}


def gradient(program, wrt: tuple[str, ...], of: str, arrays: Mapping[str, np.ndarray],
             symbols: Mapping[str, int], *, route: str = "grad", forwarding: Forwarding = STORE_ALL,
             optimize: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Differentiate `program` (d `of` / d `wrt`) by `route` and run it on `arrays`: (every array after the
    forward computation, the gradients by `wrt` name)."""
    return gradient_function(program, wrt, of, symbols, route=route, forwarding=forwarding,
                             optimize=optimize)(arrays)


def gradient_function(program, wrt: tuple[str, ...], of: str, symbols: Mapping[str, int], *,
                      route: str = "grad", forwarding: Forwarding = STORE_ALL, optimize: bool = True
                      ) -> Callable[[Mapping[str, np.ndarray]], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """`gradient` differentiated and bound once: a function of the arrays (at the same `symbols`) that a
    check calls again on other data (nudged, stepped along a direction) without running the pipeline and
    looking its build up each time."""
    from gradflow.api import grad_graph, vjp

    if route == "grad":
        graph = grad_graph(program, list(wrt), of, "grad_", None, forwarding, optimize)
        invoker = Invoker(graph)
        return lambda arrays: run_grad(graph, arrays, symbols, graph.meta["ad"].grads, invoker)
    if route == "vjp":
        result = vjp(program, list(wrt), of, forwarding=forwarding, optimize=optimize)
        invokers = (Invoker(Graph.adopt(result.forward)), Invoker(Graph.adopt(result.backward)))

        def run(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            seed = np.ones_like(np.asarray(arrays[of], dtype=np.float64))
            return run_vjp(result, arrays, symbols, {of: seed}, invokers)
        return run
    if route == "value_and_grad":
        from gradflow.api import value_and_grad

        from gradflow.core.graph import as_sdfg

        function, sdfg = value_and_grad(program, list(wrt), of, forwarding=forwarding, optimize=optimize), as_sdfg(program)

        def called(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            given = _copies(arrays)  # written in place, as a user's arrays are
            _, grads = function(**given, **_used(symbols, sdfg, given))
            return given, {x: np.array(g) for x, g in grads.items()}
        return called
    if route in ("torch", "torch_cpp"):
        return _torch_route(program, wrt, of, symbols, forwarding, "cpp" if route == "torch_cpp" else "ctypes")
    raise ValueError(f"unknown route {route!r}; routes: {ROUTES}")


def _torch_route(program, wrt: tuple[str, ...], of: str, symbols: Mapping[str, int], forwarding: Forwarding,
                 dispatcher: str = "ctypes"
                 ) -> Callable[[Mapping[str, np.ndarray]], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """`gradient_function` through `gradflow.torch.function` (`dispatcher`, optimized, `forwarding` as
    given: a budget is planned at the call): every other argument an input, `of` its output, which the
    function allocates, so `of` starts at 0 (zeroed) or at whatever the program writes first. Returns `of`
    and every array input as the caller sees them after the call (a torch function leaves its inputs as they
    were, whatever the program writes), and the gradients `torch.autograd.grad` finds (zero for an input it
    does not reach)."""
    import torch

    import gradflow.torch
    from gradflow.core.graph import as_sdfg

    sdfg = as_sdfg(program)
    names = [n for n in sdfg.arg_names if n != of]
    taken = set(map(str, sdfg.free_symbols)) | set(sdfg.symbols)
    function = gradflow.torch.function(program, inputs=names, outputs=[of], wrt=list(wrt), forwarding=forwarding,
                                       dispatcher=dispatcher,
                                       symbols={k: v for k, v in symbols.items() if k in taken and k not in names})

    def run(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        given = {n: torch.tensor(np.array(arrays[n], copy=True), requires_grad=n in wrt)
                 if isinstance(arrays[n], np.ndarray) else arrays[n] for n in names}
        out = function(*(given[n] for n in names))
        found = (torch.autograd.grad(out.sum(), [given[x] for x in wrt], allow_unused=True) if out.requires_grad
                 else [None] * len(wrt))  # `of` reached by none of them
        grads = {x: np.zeros(given[x].shape) if g is None else g.numpy() for x, g in zip(wrt, found)}
        seen = {n: t.detach().numpy() for n, t in given.items() if isinstance(t, torch.Tensor)}
        return {**seen, of: out.detach().numpy()}, grads
    return run
