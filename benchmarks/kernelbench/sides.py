"""The four sides of the comparison, each as two prebuilt zero-argument calls (forward, forward+backward):
gradflow's compiled SDFGs, eager torch, `torch.compile` and JAX jit.

Every side gets the same input values; each call reuses its own buffers (gradflow updates its arrays in
place like the program does; torch and JAX are functional and allocate their results).
"""

from __future__ import annotations

import contextlib
import functools
import signal
from typing import Any, Callable, Mapping

import numpy as np

from benchmarks.kernelbench import inputs as dom

OVERFLOW = "gradflow_overflow"
#: Trip-count bound for while loops whose values the tape stores (the corpus's own bound).
LOOP_BOUNDS = {"*": 64}


# ------------------------------------------------------------------------------------------------ gradflow


def gradflow_forward(sdfg):
    from gradflow.optimize import optimized

    return optimized(sdfg)


def gradflow_fwdbwd(sdfg, wrt, of):
    from gradflow.api import grad_graph
    from gradflow.autodiff.forwarding import STORE_ALL

    return grad_graph(sdfg, list(wrt), of, forwarding=STORE_ALL.with_loop_bounds(**LOOP_BOUNDS))


def extra_arrays(graph, given: Mapping[str, np.ndarray], symbols: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Zero-filled arrays for the arguments of `graph` beyond `given` (gradients, the overflow flag)."""
    return {name: np.zeros(shape, dtype) for name, (shape, dtype) in dom.shapes_of(graph.sdfg, symbols).items()
            if name not in given}


class GradflowCall:
    """A compiled graph bound to one set of arrays: `__call__` is one call of `__program_<name>` through
    `gradflow.runtime.calling.Kernel` with the argument vector built once (no per-call validation)."""

    def __init__(self, runner, arrays: Mapping[str, np.ndarray], symbols: Mapping[str, int]) -> None:
        from gradflow.runtime.plan import ARRAY, SCALAR
        from gradflow.runtime.validate import data_pointer

        plan = runner.plan
        fixed = {s: int(symbols[s]) for s in plan.symbols if s in symbols}
        runner(**arrays, **fixed)  # validated once (this also runs the program once)
        values = runner.symbols_for(arrays, fixed)
        self.handle = runner.kernel.handle_for(values)
        self.kernel = runner.kernel
        self.arrays = arrays
        self.args = [data_pointer(arrays[a.name]) if a.kind == ARRAY
                     else arrays[a.name].item() if a.kind == SCALAR else values[a.name] for a in plan.args]

    def __call__(self) -> None:
        self.kernel(self.handle, *self.args)


def runner_for(graph):
    from gradflow.runtime.calling import Runner

    return Runner(graph)


# ------------------------------------------------------------------------------------------------ torch


def torch_tensors(arrays: Mapping[str, np.ndarray], wrt) -> tuple[dict, list]:
    import torch

    tensors = {k: torch.from_numpy(np.array(v, copy=True)).requires_grad_(k in wrt) for k, v in arrays.items()}
    return tensors, [tensors[w] for w in wrt]


def torch_calls(fn: Callable, tensors: dict, leaves: list) -> tuple[Callable, Callable]:
    """(forward under `no_grad`, forward + `torch.autograd.grad` with respect to the leaves)."""
    import torch

    def forward():
        with torch.no_grad():
            return fn(**tensors)

    def both():
        out = fn(**tensors).reshape(())
        return out, torch.autograd.grad(out, leaves, allow_unused=True)

    return forward, both


class Deadline(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise `Deadline` in the main thread after `seconds` (a compile that does not finish in time)."""

    def expire(signum, frame):
        raise Deadline(f"did not finish within {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -------------------------------------------------------------------------------------------------- JAX


def jax_calls(kernel, arrays: Mapping[str, np.ndarray], wrt, statics: Mapping[str, Any]):
    """(jit of the forward, jit of `value_and_grad` with respect to `wrt`), each with its device arrays
    bound; a call blocks until its result is ready and returns it (value, or value and gradients by name)."""
    import jax

    fn = functools.partial(kernel.fn, **statics)
    moved = {k: jax.device_put(v) for k, v in arrays.items()}
    diff = {k: moved[k] for k in wrt}
    rest = {k: v for k, v in moved.items() if k not in wrt}
    fwd = jax.jit(lambda a: fn(**a))
    both = jax.jit(jax.value_and_grad(lambda d, r: fn(**d, **r)))
    return (lambda: jax.block_until_ready(fwd(moved))), (lambda: jax.block_until_ready(both(diff, rest)))
