"""`simplify_index_arithmetic`: a division or remainder in a memlet index that the map's ranges decide
becomes its affine value; everywhere else the index stays as it was."""

from __future__ import annotations

import itertools

import dace
import numpy as np
import sympy
from dace import symbolic
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import Graph
from gradflow.optimize import OPTIMIZE, SimplifyIndexArithmetic
from gradflow.optimize.index_arithmetic import divides, simplify


def _c_div(a: int, b: int) -> int:
    """C's `/` on integers: the quotient rounded towards zero (DaCe prints `int_floor` as it)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _evaluate(expr, values: dict) -> int:
    """`expr` at `values` with the meaning the generated C++ gives it."""
    if isinstance(expr, symbolic.int_floor):
        a, b = (_evaluate(x, values) for x in expr.args)
        return _c_div(a, b)
    if isinstance(expr, symbolic.CMod):
        a, b = (_evaluate(x, values) for x in expr.args)
        return a - b * _c_div(a, b)
    if isinstance(expr, sympy.Mod):
        a, b = (_evaluate(x, values) for x in expr.args)
        return a % b
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return values[str(expr)]
    args = [_evaluate(x, values) for x in expr.args]
    if expr.is_Add:
        return sum(args)
    if expr.is_Mul:
        return int(np.prod(args))
    if expr.is_Pow:  # SymPy's own evaluation writes some remainders so (`Mod(3*p, 15) % 2`)
        return args[0] ** args[1]
    raise AssertionError(f"unexpected {expr!r}")


_P = [symbolic.symbol(f"p{k}") for k in range(3)]
_OPS = {"floor": symbolic.int_floor, "cmod": symbolic.CMod, "mod": sympy.Mod}


@settings(max_examples=400, deadline=None)
@given(coeffs=st.lists(st.integers(-40, 40), min_size=3, max_size=3), constant=st.integers(-100, 100),
       divisor=st.integers(1, 64), op=st.sampled_from(sorted(_OPS)),
       ranges=st.lists(st.tuples(st.integers(-3, 3), st.integers(1, 5)), min_size=3, max_size=3),
       outer=st.sampled_from([None, "floor", "cmod"]), outer_divisor=st.integers(1, 8))
def test_the_simplified_index_equals_the_original_at_every_point(coeffs, constant, divisor, op, ranges, outer,
                                                                 outer_divisor):
    expr = _OPS[op](sum(c * p for c, p in zip(coeffs, _P)) + constant, divisor)
    if outer is not None:
        expr = _OPS[outer](expr, outer_divisor)
    params = {f"p{k}": (lo, lo + n - 1) for k, (lo, n) in enumerate(ranges)}
    got = simplify(expr, params)
    for point in itertools.product(*(range(lo, hi + 1) for lo, hi in params.values())):
        values = {f"p{k}": v for k, v in enumerate(point)}
        assert _evaluate(got, values) == _evaluate(expr, values), (expr, got, values)


def test_indices_built_to_be_decidable_are_decided_and_equal():
    """Indices of the shape reshapes produce (coefficients `c*q + r`, a small remainder part): most are
    rewritten, and every rewritten one equals the original at every point."""
    rng = np.random.default_rng(11)
    rewritten = 0
    for _ in range(300):
        divisor = int(rng.integers(2, 33))
        coeffs = [divisor * int(rng.integers(0, 4)) + int(rng.integers(0, 3)) for _ in _P]
        expr = _OPS[str(rng.choice(sorted(_OPS)))](
            sum(c * p for c, p in zip(coeffs, _P)) + divisor * int(rng.integers(0, 5)) + int(rng.integers(0, 3)),
            divisor)
        params = {f"p{k}": (0, int(n)) for k, n in enumerate(rng.integers(0, 4, 3))}
        got = simplify(expr, params)
        rewritten += got != expr
        for point in itertools.product(*(range(lo, hi + 1) for lo, hi in params.values())):
            values = {f"p{k}": v for k, v in enumerate(point)}
            assert _evaluate(got, values) == _evaluate(expr, values), (expr, got, values)
    assert rewritten >= 100, rewritten


def test_a_head_split_index_becomes_affine():
    """The composed reshape and transpose of an attention layer: `flat = 128*p0 + 32*p1 + 2048*p2 + p3`."""
    p0, p1, p2, p3 = (symbolic.symbol(f"p{k}") for k in range(4))
    flat = 128 * p0 + 32 * p1 + 2048 * p2 + p3
    params = {"p0": (0, 15), "p1": (0, 3), "p2": (0, 63), "p3": (0, 31)}
    assert simplify(symbolic.int_floor(flat, 2048), params) == p2
    assert simplify(symbolic.CMod(symbolic.int_floor(flat, 128), 16), params) == p0
    assert simplify(symbolic.CMod(flat, 128) + 128, params) == 32 * p1 + p3 + 128
    # p1 over 0..63 crosses the divisor: nothing decides (p1*32 + p3) // 128, which stays
    wide = {**params, "p1": (0, 63)}
    assert simplify(symbolic.int_floor(flat, 128), wide) == symbolic.int_floor(flat, 128)
    # C's `/` of a value that may be negative is left: it rounds towards zero, not down
    assert simplify(symbolic.int_floor(p3 - 32, 32), params) == symbolic.int_floor(p3 - 32, 32)


@dace.program
def regroup(x: dace.float64[6, 4], w: dace.float64[2, 3, 4], S: dace.float64[1]):
    y = np.zeros((2, 3, 4), dtype=np.float64)
    for i, j, k in dace.map[0:2, 0:3, 0:4]:
        y[i, j, k] = x[(12 * i + 4 * j + k) // 4, (12 * i + 4 * j + k) % 4] * 2.0
    S[0] = np.sum(y * w)


def divided_indices(g: Graph) -> int:
    """Memlets of `g` whose indices divide (the contract's measure)."""
    return sum(divides(e.data) for sdfg in g.sdfg.all_sdfgs_recursive() for state in sdfg.states()
               for e in state.edges())


def test_a_decided_division_leaves_the_program_and_its_gradient_as_they_were():
    graph = Graph.of(regroup.to_sdfg())
    assert divided_indices(graph) > 0
    out = SimplifyIndexArithmetic()(graph).unwrap()
    assert divided_indices(out) == 0 and divided_indices(graph) > 0
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(6, 4)), rng.normal(size=(2, 3, 4))
    want_value = np.sum(2.0 * x.reshape(2, 3, 4) * w)
    S = np.zeros(1)
    out.sdfg(x=x.copy(), w=w, S=S)
    np.testing.assert_allclose(S[0], want_value, rtol=1e-12)
    value, grads = gradflow.value_and_grad(graph, wrt=["x"], of="S", optimize=OPTIMIZE)(x=x.copy(), w=w)
    np.testing.assert_allclose(np.asarray(value).reshape(-1)[0], want_value, rtol=1e-12)
    np.testing.assert_allclose(grads["x"], 2.0 * w.reshape(6, 4), rtol=1e-12)


def test_an_undecided_division_stays():
    @dace.program
    def shifted(x: dace.float64[24], y: dace.float64[4, 6]):
        for i, j in dace.map[0:4, 0:6]:
            y[i, j] = x[(6 * i + j + 3) % 24]

    graph = Graph.of(shifted.to_sdfg())
    assert divided_indices(graph) > 0
    assert SimplifyIndexArithmetic()(graph).unwrap() is graph
