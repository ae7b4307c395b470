"""Programs the reliability tests run, importable by the subprocesses they start (`python -m`-free: the
child scripts put the repository root on `sys.path` and import this module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import dace
import numpy as np

N = dace.symbol("N")
D = dace.symbol("D")
f64 = dace.float64


def _example(name: str):
    """A module of `examples/` (scripts, not a package), loaded from its file."""
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gradflow_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The README's logistic-regression loss (maps, exp/log, reductions), the demo's own program: its gradient
#: SDFG used to hash differently in every process.
logistic = _example("logistic_regression").logistic_loss


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
