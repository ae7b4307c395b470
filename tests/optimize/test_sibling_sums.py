"""`merge_element_sums`: two maps that each write every element of a gradient buffer once (an outer
product's adjoint, then another's sum) become one map writing each element once. The gradients stay
those of the unoptimized route (here, and on every corpus program in test_two_routes.py)."""

from __future__ import annotations

import dace
import numpy as np

import gradflow
from gradflow.core.passes import Pipeline
from gradflow.optimize.dead_stores import DropDeadStores
from gradflow.optimize.overwrite_zeroed_products import OverwriteZeroedProducts
from gradflow.optimize.sibling_sums import MergeElementSums, _pairs
from gradflow.runtime.compile import compile_sdfg

M, N = 7, 5


@dace.program
def two_products(A: dace.float64[M, N], x: dace.float64[N], r: dace.float64[M], S: dace.float64[1]):
    # grad_A = outer(g_q, x) + outer(r, g_s): the second product's operand order is transposed
    q = A @ x
    s = r @ A
    S[0] = np.sum(np.sin(q)) + np.sum(s * s)


@dace.program
def product_and_square(A: dace.float64[M, N], x: dace.float64[N], S: dace.float64[1]):
    # the second contribution reads A twice (A * A): two sums per element, not one -- no merge
    q = A @ x
    S[0] = np.sum(np.sin(q)) + np.sum(A * A)


_STEPS = (OverwriteZeroedProducts(), DropDeadStores())


def _maps_writing(sdfg: dace.SDFG, name: str) -> int:
    return sum(1 for state in sdfg.states() for e in state.edges()
               if isinstance(e.src, dace.nodes.MapExit) and isinstance(e.dst, dace.nodes.AccessNode)
               and e.dst.data == name)


def _grads(sdfg: dace.SDFG, inputs: dict) -> dict:
    grads = {"grad_A": np.full((M, N), np.nan)}  # whatever the buffer held before
    compile_sdfg(sdfg)(**inputs, S=np.zeros(1), **grads)
    return grads


def test_two_outer_products_into_one_buffer_become_one_map() -> None:
    prepared = gradflow.grad(two_products, wrt="A", of="S", optimize=Pipeline(_STEPS))
    merged = gradflow.grad(two_products, wrt="A", of="S", optimize=Pipeline((*_STEPS, MergeElementSums())))
    assert sum(len(_pairs(s)) for s in prepared.all_sdfgs_recursive()) == 1
    assert _maps_writing(prepared, "grad_A") == 2 and _maps_writing(merged, "grad_A") == 1
    rng = np.random.default_rng(4)
    inputs = {"A": rng.standard_normal((M, N)), "x": rng.standard_normal(N), "r": rng.standard_normal(M)}
    want, got = _grads(prepared, inputs), _grads(merged, inputs)
    assert np.isfinite(got["grad_A"]).all()
    np.testing.assert_allclose(got["grad_A"], want["grad_A"], rtol=1e-13)
    A, x, r = inputs["A"], inputs["x"], inputs["r"]
    expected = np.outer(np.cos(A @ x), x) + np.outer(r, 2 * (r @ A))
    np.testing.assert_allclose(got["grad_A"], expected, rtol=1e-12)


def test_a_map_adding_twice_into_an_element_is_not_merged() -> None:
    prepared = gradflow.grad(product_and_square, wrt="A", of="S", optimize=Pipeline(_STEPS))
    assert sum(len(_pairs(s)) for s in prepared.all_sdfgs_recursive()) == 0
