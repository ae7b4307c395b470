"""The tasklet reader (`core/symbolic.read_tasklet`): statements, branches, indexed accesses, typed errors."""

from __future__ import annotations

import pytest
import sympy

from gradflow.core.symbolic import (Element, UnsupportedCode, assignments_code, derivative, parse_tasklet, read_tasklet,
                                    unassigned)

x, y, c = (sympy.Symbol(n, real=True) for n in ("x", "y", "c"))


def _value(expr: sympy.Expr, **values: float) -> float:
    return float(expr.subs({sympy.Symbol(k, real=True): v for k, v in values.items()}))


def test_if_elif_else_is_piecewise_in_program_order() -> None:
    code = "t = x * y\nt = t + 1.0\nif x > 0.5:\n    p = t * x\nelif x > -0.5:\n    p = sin(t)\nelse:\n    p = t - y"
    p = parse_tasklet(code, ["x", "y"], ["p"])["p"]
    for xv, yv in ((1.0, 2.0), (0.0, 2.0), (-1.0, 2.0)):
        t = xv * yv + 1.0
        expected = t * xv if xv > 0.5 else (sympy.sin(t) if xv > -0.5 else t - yv)
        assert _value(p, x=xv, y=yv) == pytest.approx(float(expected), rel=1e-15)


def test_ternary_and_truth_value_of_a_number() -> None:
    out = parse_tasklet("o = x if c else y\nif x:\n    q = 1.0\nelse:\n    q = 2.0", ["x", "y", "c"], ["o", "q"])
    assert _value(out["o"], x=3.0, y=4.0, c=0.0) == 4.0
    assert _value(out["o"], x=3.0, y=4.0, c=2.0) == 3.0
    assert _value(out["q"], x=0.0) == 2.0 and _value(out["q"], x=-1.0) == 1.0


def test_bare_expressions_are_dead_code() -> None:
    out = parse_tasklet("log(3.0)\nsin(x) + 1\n'a docstring'\npass\no = x", ["x"], ["o"])
    assert out == {"o": x}


def test_a_call_for_its_effect_names_the_tasklet_and_statement() -> None:
    with pytest.raises(UnsupportedCode, match=r"tasklet 'cb'.*numpy_median\(__a, __o\).*Python callbacks"):
        read_tasklet("numpy_median(__a, __o)", ["__a"], ["__o"], "tasklet 'cb'")


def test_an_output_assigned_on_one_path_keeps_a_marker() -> None:
    meaning = read_tasklet("if c:\n    o = 1.0", ["c"], ["o"])
    (taken, test), (other, _) = meaning.outputs["o"].args
    assert (float(taken), test, other) == (1.0, sympy.Ne(c, 0), unassigned("o"))
    with pytest.raises(UnsupportedCode, match="not assigned on every path"):
        parse_tasklet("if c:\n    o = 1.0", ["c"], ["o"])


def test_reading_a_name_where_it_may_be_unassigned_is_an_error() -> None:
    with pytest.raises(UnsupportedCode, match=r"'t' in the statement 'o = t \* 2'.*not assigned"):
        read_tasklet("if x > 0:\n    t = x\no = t * 2", ["x"], ["o"], "tasklet 'T'")


def test_indexed_reads_and_writes() -> None:
    meaning = read_tasklet("o = a[j] * a[j] + a[j + 1]\nw[j] = o", ["a", "j"], ["o", "w"])
    j = sympy.Symbol("j", real=True)
    assert set(meaning.reads.values()) == {Element("a", (j,)), Element("a", (j + 1,))}
    (write,) = meaning.writes
    assert write.element == Element("w", (j,)) and write.condition == sympy.true
    by_element = {e: s for s, e in meaning.reads.items()}
    assert meaning.outputs["o"] == by_element[Element("a", (j,))] ** 2 + by_element[Element("a", (j + 1,))]


@pytest.mark.parametrize("code, why", [
    ("for i in range(3):\n    o = x", "For statements"),
    ("o = p = x", "chained assignment"),
    ("x = 1.0\no = x", "assigns the input connector 'x'"),
    ("o[0] += x", "augmented assignment through an index"),
    ("o = x[0:2]", "a slice"),
])
def test_unsupported_statements_are_named(code: str, why: str) -> None:
    with pytest.raises(UnsupportedCode, match=why):
        read_tasklet(code, ["x"], ["o", "p"], "tasklet 'T'")


def test_a_flag_set_in_a_branch_can_be_tested_again() -> None:
    """The index checks the ONNX lowering generates: `ok` cleared in a branch, then tested (issue 14)."""
    code = "ok = True\nif ok and (x < 0 or x >= 4):\n    ok = False\no = (y * 2.0) if ok else 0"
    o = parse_tasklet(code, ["x", "y"], ["o"])["o"]
    assert [_value(o, x=xv, y=3.0) for xv in (-1.0, 0.0, 3.0, 4.0)] == [0.0, 6.0, 6.0, 0.0]
    assert float(sympy.diff(o, y).subs({x: 1.0})) == 2.0


def test_a_truth_value_in_arithmetic_is_one_or_zero() -> None:
    out = parse_tasklet("o = (a == b) * g + (a > b)", ["a", "b", "g"], ["o"])["o"]
    a, b, g = sympy.symbols("a b g", real=True)
    assert out.subs({a: 2, b: 2, g: 5}) == 5
    assert out.subs({a: 3, b: 2, g: 5}) == 1
    assert out.subs({a: 1, b: 2, g: 5}) == 0


def test_a_float_declaration_assigns_nothing_and_an_integer_one_is_refused() -> None:
    code = "t: dace.float64\nif a > 0:\n    t = 2.0 * a\nelse:\n    t = a\no = t"
    out = parse_tasklet(code, ["a"], ["o"])["o"]
    a = sympy.Symbol("a", real=True)
    assert float(out.subs(a, 3)) == 6.0 and float(out.subs(a, -3)) == -3.0
    with pytest.raises(UnsupportedCode, match="AnnAssign"):
        parse_tasklet("t: dace.int64\no = a", ["a"], ["o"])


@pytest.mark.parametrize("kind", [sympy.Min, sympy.Max])
@pytest.mark.parametrize("values", [
    (1.0, 2.0, 3.0),  # no tie: all to the extremum
    (2.0, 1.0, 1.0),  # a two-way tie of three arguments
    (1.0, 1.0, 1.0),  # a three-way tie
])
def test_a_min_or_max_of_three_splits_its_derivative_among_ties(kind, values) -> None:
    # SymPy's own derivative gives 1/2 to every tie, so a three-way tie passed on 3/2: fuzz seed 16567
    a, b, c = sympy.symbols("a b c", real=True)
    expr = kind(a, kind(b, c))  # SymPy flattens it to one three-argument node, as a fused tasklet's
    at = dict(zip((a, b, c), values)) if kind is sympy.Min else dict(zip((a, b, c), (-v for v in values)))
    got = [float(derivative(expr, x).subs(at)) for x in (a, b, c)]
    extremum = kind(*at.values())
    tied = [x for x in (a, b, c) if at[x] == extremum]
    assert got == [1 / len(tied) if x in tied else 0.0 for x in (a, b, c)]


def test_a_conversion_to_a_connectors_type_is_read_by_that_type() -> None:
    """`decltype(conn)(v)`, which DaCe's frontend writes into `np.arange`'s tasklet: the value for a float
    connector, truncated for an integer one (derivative 0); untyped, only a constant converts."""
    import dace

    code = "o = decltype(o)(x) * 2.0 + decltype(o)(1)"
    as_float = parse_tasklet(code, {"x": dace.float64}, {"o": dace.float64})["o"]
    assert _value(as_float, x=1.75) == 4.5
    assert float(derivative(as_float, x)) == 2.0
    as_int = parse_tasklet(code, {"x": dace.float64}, {"o": dace.int64})["o"]
    assert _value(as_int, x=1.75) == 3.0 and _value(as_int, x=-1.75) == -1.0  # toward zero, as C converts
    assert _value(derivative(as_int, x), x=1.75) == 0
    constant = parse_tasklet("o = decltype(o)(0) + i * decltype(o)(1)", ["i"], ["o"])["o"]
    assert _value(constant, i=3.0) == 3.0
    with pytest.raises(UnsupportedCode, match="conversion to the type of 'o', which is not known"):
        parse_tasklet(code, ["x"], ["o"])
    with pytest.raises(UnsupportedCode, match="a call of a call's result"):
        parse_tasklet("o = f(x)(x)", ["x"], ["o"])


def test_a_call_on_sdfg_symbols_only_is_kept_as_written() -> None:
    """DaCe writes `ceiling((N / 2))` (the length of `x[:N - 2:2]`) into the divisor of `np.mean`. Outside
    the table, it was refused (fuzz seed 21565, programs 33 and 37); it is constant in the inputs and is
    printed back unchanged: SymPy's `N / 2` would print as `0.5 * N`, whose C++ `ceiling` (DaCe's, an
    integer overload only) is another function."""
    code = "__out = __inp / ((M - 1) * (ceiling((N / 2)) - 1))"
    out = read_tasklet(code, ["__inp"], ["__out"], constants=["N", "M"]).outputs["__out"]
    inp, g = sympy.Symbol("__inp", real=True), sympy.Symbol("g", real=True)
    step = out.diff(inp)
    assert step.free_symbols == {sympy.Symbol("N"), sympy.Symbol("M")}
    assert assignments_code([("o", g * step)]) == "o = (g / ((M + -1) * (ceiling(N / 2) + -1)))"
    for refused in ("__out = ceiling(__inp)", "t = N\nt = __inp\n__out = ceiling(t)", "__out = __inp * f()",
                    "__out = __inp * rand(N)"):  # not one of DaCe's pure integer helpers
        with pytest.raises(UnsupportedCode, match="not in rules/elementwise.toml"):
            read_tasklet(refused, ["__inp"], ["__out"], constants=["N"])
