"""JAX versions of the benchmark kernels (the JAX jit peer of `benchmarks/kernels.py`).

Each kernel is written for JAX as a JAX user would write the same algorithm, not as a call to a library
routine that replaces it (no `solve_triangular` for trisolv, no `cholesky` for cholesky):
- statements on slices become the same `jnp` expressions, writes become functional `.at[...]` updates;
- loops whose iterations are independent become array operations (the triangular nest, the rows of a
  dace.map, syrk's rows, convolutions as `lax.conv_general_dilated`);
- inner loops that only reduce (`acc -= L[i, j] * x[j]`) become dot products or sums, masked to the loop's
  range where the range depends on an outer loop variable (shapes must be static under `jit`);
- loops that carry a dependence become `lax.fori_loop` (whole-array carries) or `lax.scan` (a carry plus
  per-iteration slices), with static trip counts so that reverse mode applies; an inner loop whose trip
  count depends on the outer variable runs to the static bound under `lax.cond`;
- a `while` loop on data becomes a fixed number of masked iterations (`x = where(cond(x), step(x), x)`),
  the number being the largest trip count of the given data (`statics`), so every element stops exactly
  where the `while` loop stops.

A kernel is `fn(**arrays, **statics)` returning the scalar `of` (as the corpus's torch references do, it
ignores arrays it does not read); `statics(symbols, inputs)` gives the static keyword values (sizes that
are not array extents, iteration bounds).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax

jax.config.update("jax_enable_x64", True)


def _symbols_only(symbols: Mapping[str, int], inputs: Mapping[str, Any]) -> dict[str, int]:
    return dict(symbols)


@dataclasses.dataclass(frozen=True)
class JaxKernel:
    """A JAX kernel and how to get its static arguments from the benchmark's symbols and inputs."""

    fn: Callable[..., Any]
    statics: Callable[[Mapping[str, int], Mapping[str, Any]], dict] = _symbols_only


def kernels() -> dict[str, JaxKernel]:
    """Every JAX kernel by corpus case name (`lp_*`, `nb_*`, and `mlp`)."""
    from benchmarks.peers import jax_dl, jax_loops, jax_npbench

    return {**jax_loops.KERNELS, **jax_npbench.KERNELS, **jax_dl.KERNELS}
