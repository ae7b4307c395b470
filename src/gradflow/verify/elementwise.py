"""Checks of the elementwise table (`rules/elementwise.toml`): every entry, end to end.

Per entry, one SDFG computes S = sum_i W[i] * f(X0[i], X1[i], ...) with the function written as tasklet
code (the entry's formula printed by gradflow's printer, as the ONNX lowering writes it); `gradflow.grad`
differentiates it and it is compiled once. A check takes points inside the entry's domain and compares
grad_Xj with
- `torch.autograd` on the entry's `torch` expression, to 1e-9 relative (float64), and
- central finite differences of the entry's SymPy formula (step 1e-6: truncation error ~1e-12 and
  rounding error ~1e-10 relative, so a 1e-6 tolerance cannot hide a wrong derivative, which is off by O(1)).
Points within 1e-2 of a kink are left out of the comparison (their weight is 0): there the derivative is a
convention, and at a jump the value is one too.
"""

from __future__ import annotations

import functools
import math

import dace
import numpy as np
import sympy
import torch

from gradflow.api import grad
from gradflow.core.elementwise import ElementwiseEntry, elementwise_table
from gradflow.core.graph import Graph
from gradflow.core.symbolic import print_code
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.compare import agree

N = 6
MODULES = ["numpy", {"erf": np.vectorize(math.erf)}]
KINK_DISTANCE = 1e-2


def entry_sdfg(entry: ElementwiseEntry) -> dace.SDFG:
    sdfg = dace.SDFG(f"elementwise_{entry.name}")
    names = [f"X{j}" for j in range(len(entry.args))]
    for name in names + ["W"]:
        sdfg.add_array(name, [N], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    state = sdfg.add_state()
    conns = {a: f"__{a}" for a in entry.args}
    body = print_code(entry.apply(*[sympy.Symbol(conns[a], real=True) for a in entry.args]))
    inputs = {conns[a]: dace.Memlet(f"{n}[i]") for a, n in zip(entry.args, names)}
    inputs["__w"] = dace.Memlet("W[i]")
    state.add_mapped_tasklet(
        "f", {"i": f"0:{N}"}, inputs, f"__s = __w * ({body})",
        {"__s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True,
    )
    return sdfg


@functools.cache
def _compiled(name: str):
    entry = elementwise_table()[name]
    sdfg = grad(entry_sdfg(entry), wrt=[f"X{j}" for j in range(len(entry.args))], of="S")
    return compile_sdfg(Graph.adopt(sdfg))


def away_from_kinks(entry: ElementwiseEntry, points: list[np.ndarray]) -> np.ndarray:
    keep = np.ones(N, dtype=bool)
    for kink in entry.kink_exprs():
        keep &= np.abs(np.broadcast_to(sympy.lambdify(entry.symbols, kink, MODULES)(*points), (N,))) > KINK_DISTANCE
    return keep


def random_points(entry: ElementwiseEntry, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """Arguments drawn uniformly inside the entry's domain, and weights, for checks not driven by hypothesis."""
    points = [rng.uniform(*entry.domain[a], size=N) for a in entry.args]
    return points, rng.uniform(-2, 2, size=N)


def check(name: str, points: list[np.ndarray], w: np.ndarray) -> float:
    """The worst relative error of entry `name`'s value and gradients at `points` (weights `w`) against
    torch and finite differences; `CheckFailure` naming the argument and the reference otherwise."""
    entry = elementwise_table()[name]
    keep = away_from_kinks(entry, points)
    # a point at a kink weighs nothing: there the derivative is a convention, and at a jump (remainder's
    # at x = 0, where x / y underflows) so is the value
    w = np.where(keep, np.asarray(w, dtype=np.float64), 0.0)
    arrays = {f"X{j}": np.array(p, dtype=np.float64) for j, p in enumerate(points)}
    arrays.update(W=np.array(w, dtype=np.float64), S=np.zeros(1))
    arrays.update({f"grad_X{j}": np.full(N, np.nan) for j in range(len(points))})
    _compiled(name)(**arrays)

    tensors = [torch.tensor(np.array(p, dtype=np.float64), requires_grad=True) for p in points]
    namespace = {"torch": torch, **dict(zip(entry.args, tensors))}
    value = torch.sum(torch.tensor(w) * eval(entry.torch, namespace))  # noqa: S307 - the table's own data
    value.backward()
    f = sympy.lambdify(entry.symbols, entry.expr, MODULES)
    worst = agree(arrays["S"][0], value.item(), rtol=1e-9, atol=1e-12, what=f"{name}: value vs torch")
    h = 1e-6
    for j, t in enumerate(tensors):
        got = arrays[f"grad_X{j}"][keep]
        worst = max(worst, agree(got, t.grad.numpy()[keep], rtol=1e-9, atol=1e-12,
                                 what=f"{name}: d/d{entry.args[j]} vs torch"))
        up = [np.array(p, dtype=np.float64) for p in points]
        down = [np.array(p, dtype=np.float64) for p in points]
        up[j] += h
        down[j] -= h
        fd = np.asarray(w) * (np.asarray(f(*up), dtype=float) - np.asarray(f(*down), dtype=float)) / (2 * h)
        agree(got, fd[keep], rtol=1e-6, atol=1e-6, what=f"{name}: d/d{entry.args[j]} vs finite differences")
    return worst


def names() -> tuple[str, ...]:
    return tuple(e.name for e in elementwise_table())
