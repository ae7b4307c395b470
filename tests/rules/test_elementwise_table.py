"""Every entry of rules/elementwise.toml, verified end to end; adding an entry adds its tests.

Per entry, one SDFG computes S = sum_i W[i] * f(X0[i], X1[i], ...) with the function written as tasklet
code (the entry's formula printed by gradflow's printer, as the ONNX lowering writes it); gradflow.grad
differentiates it and it is compiled once. Hypothesis then draws data inside the entry's domain (away
from its kinks) and compares grad_Xj with
- torch.autograd on the entry's `torch` expression, to 1e-9 relative (float64), and
- central finite differences of the entry's SymPy formula (step 1e-6: truncation error ~1e-12 and
  rounding error ~1e-10 relative, so a 1e-6 tolerance cannot hide a wrong derivative, which is off by O(1)).
"""

from __future__ import annotations

import functools
import math

import dace
import numpy as np
import pytest
import sympy
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.elementwise import ElementwiseEntry, elementwise_table
from gradflow.core.graph import Graph
from gradflow.core.symbolic import parse_tasklet, print_code
from gradflow.runtime.compile import compile_sdfg

N = 6
ENTRIES = list(elementwise_table())


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
def compiled(name: str):
    entry = elementwise_table()[name]
    sdfg = gradflow.grad(entry_sdfg(entry), wrt=[f"X{j}" for j in range(len(entry.args))], of="S")
    return compile_sdfg(Graph.adopt(sdfg))


MODULES = ["numpy", {"erf": np.vectorize(math.erf)}]


def draw_points(entry: ElementwiseEntry, data) -> tuple[list[np.ndarray], np.ndarray]:
    """Arguments drawn from the entry's domain, and the mask of elements away from its kinks."""
    points = [
        np.array(data.draw(st.lists(st.floats(*entry.domain[a], allow_nan=False), min_size=N, max_size=N), label=a))
        for a in entry.args
    ]
    keep = np.ones(N, dtype=bool)
    for kink in entry.kink_exprs():
        keep &= np.abs(np.broadcast_to(sympy.lambdify(entry.symbols, kink, MODULES)(*points), (N,))) > 1e-2
    return points, keep


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_entry_gradient(entry: ElementwiseEntry, data) -> None:
    points, keep = draw_points(entry, data)
    w = np.array(data.draw(st.lists(st.floats(-2, 2), min_size=N, max_size=N), label="W"))
    arrays = {f"X{j}": p.copy() for j, p in enumerate(points)}
    arrays.update(W=w.copy(), S=np.zeros(1))
    arrays.update({f"grad_X{j}": np.full(N, np.nan) for j in range(len(points))})
    compiled(entry.name)(**arrays)

    tensors = [torch.tensor(p, requires_grad=True) for p in points]
    namespace = {"torch": torch, **dict(zip(entry.args, tensors))}
    value = torch.sum(torch.tensor(w) * eval(entry.torch, namespace))  # noqa: S307 (table data)
    value.backward()
    f = sympy.lambdify(entry.symbols, entry.expr, MODULES)
    np.testing.assert_allclose(arrays["S"][0], value.item(), rtol=1e-9, atol=1e-12)
    for j, t in enumerate(tensors):
        got = arrays[f"grad_X{j}"][keep]  # at a kink the derivative is a convention, not a limit
        np.testing.assert_allclose(got, t.grad.numpy()[keep], rtol=1e-9, atol=1e-12, err_msg=f"d/d{entry.args[j]} vs torch")
        h = 1e-6
        up = [p.copy() for p in points]
        down = [p.copy() for p in points]
        up[j] += h
        down[j] -= h
        fd = w * (np.asarray(f(*up), dtype=float) - np.asarray(f(*down), dtype=float)) / (2 * h)
        np.testing.assert_allclose(got, fd[keep], rtol=1e-6, atol=1e-6, err_msg=f"d/d{entry.args[j]} vs finite differences")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.spellings], ids=lambda e: e.name)
def test_spellings_mean_the_formula(entry: ElementwiseEntry) -> None:
    """Every spelling a tasklet may use parses to the entry's formula."""
    args = ", ".join(entry.args)
    for spelling in entry.spellings:
        parsed = parse_tasklet(f"out = {spelling}({args})", entry.args, ["out"])["out"]
        assert sympy.simplify(parsed - entry.expr) == 0, spelling


def test_required_functions_present() -> None:
    required = {"add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "sinh",
                "cosh", "asin", "acos", "atan", "abs", "sign", "min", "max", "erf", "sigmoid", "log1p", "expm1"}
    assert required <= {e.name for e in ENTRIES}
