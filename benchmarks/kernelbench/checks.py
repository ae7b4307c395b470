"""Correctness checks that gate the timings: a peer that computes something else, or a fast wrong answer,
is never reported as a result.

- Each JAX kernel against the corpus's torch reference at the case's test size (value and gradients,
  float64, relative error at most `TEST_RTOL`): a JAX version that disagrees is excluded for that kernel.
- At the benchmark size, gradflow's forward value and its forward+backward value and gradients, and the
  JAX value and gradients, against eager torch on the same inputs (`BENCH_RTOL`; float32 kernels
  `BENCH_RTOL_F32`).

Errors are norm-wise: max |got - ref| / max |ref| over the array, so elements near zero do not dominate.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

TEST_RTOL = 1e-8
BENCH_RTOL = 1e-6
BENCH_RTOL_F32 = 1e-3


def rel_err(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


def worst(value, grads: Mapping[str, np.ndarray] | None, ref_value, ref_grads: Mapping[str, np.ndarray] | None
          ) -> tuple[float, str]:
    """The largest relative error over the value and the gradients, and what it was of."""
    errs = [(rel_err(value, ref_value), "value")]
    if grads is not None:
        errs += [(rel_err(grads[k], ref_grads[k]), f"d/d{k}") for k in ref_grads]
    return max(errs)


def torch_reference(fn, arrays: Mapping[str, np.ndarray], wrt, node_limit: int = 0):
    """Eager autograd of a torch reference, in the arrays' dtype: (value, gradients by name, (wall, CPU)
    seconds of the call, number of nodes of its autograd graph counted up to `node_limit + 1`). The graph is
    counted after the call, so the call's time is a clean eager sample."""
    import time

    import torch

    from benchmarks.kernelbench.sides import torch_tensors

    tensors, leaves = torch_tensors(arrays, wrt)
    start, cpu = time.perf_counter(), time.process_time()
    out = fn(**tensors).reshape(())
    grads = torch.autograd.grad(out, leaves, allow_unused=True, retain_graph=True)
    took = (time.perf_counter() - start, time.process_time() - cpu)
    nodes = _graph_size(out.grad_fn, node_limit + 1)
    return (float(out), {w: (np.zeros(arrays[w].shape) if g is None else g.detach().numpy().copy())
                         for w, g in zip(wrt, grads)}, took, nodes)


def _graph_size(root, limit: int) -> int:
    seen, stack = set(), [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    return len(seen)


def jax_at_test_size(case, kernel) -> tuple[float, str]:
    """The JAX kernel against the corpus's torch reference on the case's own test inputs (float64)."""
    import jax

    from benchmarks.kernelbench.sides import jax_calls

    inputs = {k: np.asarray(v, dtype=np.float64) for k, v in case.inputs(0).items()}
    ref_value, ref_grads, _, _ = torch_reference(case.torch_fn, inputs, case.wrt)
    _, both = jax_calls(kernel, inputs, case.wrt, kernel.statics(dict(case.symbols), inputs))
    value, grads = both()
    jax.clear_caches()
    return worst(float(value), {k: np.asarray(g) for k, g in grads.items()}, ref_value, ref_grads)
