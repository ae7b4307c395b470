"""Programs the reliability tests run, importable by the subprocesses they start (`python -m`-free: the
child scripts put the repository root on `sys.path` and import this module)."""

from __future__ import annotations

import dace
import numpy as np

N = dace.symbol("N")
D = dace.symbol("D")
f64 = dace.float64


@dace.program
def logistic(X: f64[N, D], y: f64[N], w: f64[D], b: f64[1], loss: f64[1]):
    """The README's logistic-regression loss: maps, exp/log, reductions (its gradient SDFG used to hash
    differently in every process)."""
    z = np.ndarray([N], dtype=np.float64)
    z[:] = 0
    for i, j in dace.map[0:N, 0:D]:
        z[i] += X[i, j] * w[j]
    p = 1.0 / (1.0 + np.exp(-(z + b[0])))
    loss[0] = -np.sum(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)) / N + 0.01 * np.sum(w * w)


def logistic_inputs(seed: int = 0, n: int = 12, d: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((n, d)), "y": (rng.random(n) > 0.5).astype(np.float64),
            "w": rng.standard_normal(d), "b": rng.standard_normal(1)}


@dace.program
def energy(X: f64[N], W: f64[N], S: f64[1]):
    """S = sum(tanh(X) * W): X and W are only read, S is overwritten."""
    S[0] = np.sum(np.tanh(X) * W)


@dace.program
def accumulate(X: f64[N], S: f64[1]):
    """S += sum(X * X): S is read before it is written."""
    for i in dace.map[0:N]:
        S[0] += X[i] * X[i]


def scaled_copy(name: str, factor: float) -> dace.SDFG:
    """A tiny SDFG, Y = factor * X, whose build is cheap; `factor` makes its cache key unique."""
    sdfg = dace.SDFG(name)
    sdfg.add_array("X", [N], dace.float64)
    sdfg.add_array("Y", [N], dace.float64)
    state = sdfg.add_state("main")
    state.add_mapped_tasklet("scale", {"i": "0:N"}, {"x": dace.Memlet("X[i]")}, f"y = {factor!r} * x",
                             {"y": dace.Memlet("Y[i]")}, external_edges=True)
    return sdfg
