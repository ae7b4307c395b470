"""Inputs of a corpus case at any size, drawn from the value domains of the case's own generator.

The corpus generators (`case.make_inputs`) draw at fixed test sizes. Here shapes come from the program's
argument descriptors evaluated at the benchmark's symbols, and each array gets a *domain*: a function
`(rng, shape) -> array`. The default domain of an array is what the case's generator gives it at test size
when that is plain: zeros when the test value is all zeros (outputs, `S`), standard normal draws otherwise.
Kernels whose generators draw from other domains, or build structured matrices, state theirs in `specs.py`
with the functions below, scaled so that matrices stay well-conditioned at large sizes (a diagonally
dominant matrix of size 6 is not one of size 500 unless its off-diagonal part shrinks with the size).
"""

from __future__ import annotations

from typing import Callable, Mapping

import dace
import numpy as np

Domain = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def normal(rng, shape):
    return rng.normal(size=shape)


def zeros(rng, shape):
    return np.zeros(shape, dtype=np.float64)


def uniform(lo: float, hi: float) -> Domain:
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def signed_uniform(lo: float, hi: float) -> Domain:
    """Magnitudes in [lo, hi), random signs: both branches of a sign test, away from 0."""
    return lambda rng, shape: rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], size=shape)


def spd(rng, shape):
    """Symmetric positive definite with eigenvalues in about [1, 5] (cholesky)."""
    n = shape[0]
    b = rng.normal(size=(n, n))
    return b @ b.T / n + np.eye(n)


def dominant(rng, shape):
    """3 I plus a normal matrix of spectral norm about 1: every leading block is well-conditioned, so LU
    without pivoting is stable (the corpus's `normal * 0.5 + 3 I`, off-diagonal scaled by 1/sqrt(n))."""
    n = shape[0]
    return rng.normal(size=(n, n)) * (0.5 / np.sqrt(n)) + np.diag(np.full(n, 3.0))


def lower_triangular(rng, shape):
    """Diagonal in [1.5, 2.5], strictly lower part of spectral norm about 0.5 (trisolv): the forward
    substitution neither grows nor cancels (the corpus's `tril(normal * 0.3)` scaled by 1/sqrt(n))."""
    n = shape[0]
    return np.tril(rng.normal(size=(n, n)) * (0.3 / np.sqrt(n)), -1) + np.diag(rng.uniform(1.5, 2.5, n))


def autocorrelation(rng, shape):
    """r[k] = sum_m w_m rho_m^(k+1): a mix of AR(1) autocorrelations with total weight 0.3, so |r| <= 0.3 (the
    corpus's domain) and the Toeplitz system durbin solves stays positive definite at any size (random
    uniform r of length 1000 gives a singular system and a diverging recursion)."""
    (n,) = shape
    rho = rng.uniform(-0.9, 0.9, 4)
    w = rng.uniform(0.0, 1.0, 4)
    w *= 0.3 / w.sum()
    k = np.arange(1, n + 1)[:, None]
    return (w * rho ** k).sum(axis=1)


def fan_in(rng, shape):
    """Normal scaled by 1/sqrt(fan-in) (the LeNet weights)."""
    return rng.normal(size=shape) / np.sqrt(np.prod(shape[:-1]))


def shapes_of(program, symbols: Mapping[str, int]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every non-transient array of the program with its shape at `symbols` and its dtype."""
    sdfg = program.to_sdfg(simplify=False) if hasattr(program, "to_sdfg") else program
    out = {}
    for name, desc in sdfg.arrays.items():
        if desc.transient:
            continue
        shape = tuple(int(dace.symbolic.evaluate(dace.symbolic.pystr_to_symbolic(str(s)), symbols))
                      for s in desc.shape)
        out[name] = (shape, np.dtype(desc.dtype.as_numpy_dtype()))
    return out


def default_domains(test_inputs: Mapping[str, np.ndarray]) -> dict[str, Domain]:
    return {k: zeros if not np.any(v) else normal for k, v in test_inputs.items()}


def build(names_shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], domains: Mapping[str, Domain],
          rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Arrays drawn in the order of `domains` (the case's argument order), cast to the program's dtypes."""
    return {name: np.ascontiguousarray(domains[name](rng, names_shapes[name][0]), dtype=names_shapes[name][1])
            for name in domains}
