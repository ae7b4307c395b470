"""Tangent terms with steps (`min`, `max`, `abs`, branches) as forward mode writes them (`dual.selected`):
the same values as one folded choice, 0 where a step's factor is 0 even when the rest is not finite, and
code that grows with the term (a second-order term of many products of one `min` derivative used to fold
into a choice of every combination of pieces and ran for minutes: `gradflow fuzz --seed 14642`, program 28)."""

from __future__ import annotations

import cmath
import itertools

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from gradflow.autodiff.tangent.dual import selected
from gradflow.core.symbolic import derivative

a, b, t = sympy.symbols("a b t", real=True)


def _min_chain_term(products: int) -> sympy.Expr:
    """A term as the tangent of a `min`'s gradient has it (`hvp`): a sum of products, each with the
    gradient's choice (a ternary of its code, read as a nested Piecewise), the derivative of the `min` met
    again (a Heaviside step) and a factor of its own, one of them infinite at a = 0."""
    d = a - b
    choice = sympy.Piecewise((1, d < 0), (sympy.Piecewise((sympy.Rational(1, 2), sympy.Eq(d, 0)), (0, True)), True))
    step = sympy.Heaviside(-d)
    own = [sympy.tanh(sympy.Min(a, b)) ** k / (k + sympy.sqrt(sympy.Abs(a))) for k in range(1, products)]
    return t * choice * step / sympy.sqrt(sympy.Abs(a)) + sum(t * choice * step * f for f in own)


def test_the_choice_has_the_folded_terms_values() -> None:
    term = _min_chain_term(2)
    folded = sympy.piecewise_fold(term.replace(lambda e: isinstance(e, sympy.Heaviside),
                                               lambda e: sympy.Piecewise((0, e.args[0] < 0), (sympy.Rational(1, 2),
                                                                         sympy.Eq(e.args[0], 0)), (1, True))))
    mine = selected(term)
    for x, y in itertools.product((-0.7, 0.0, 0.4), (-0.3, 0.0, 0.4)):  # ties, and a = 0 where a's
        # own factor is infinite
        point = {a: sympy.Float(x), b: sympy.Float(y), t: sympy.Float(1.3)}
        want, got = complex(folded.subs(point)), complex(mine.subs(point))
        if cmath.isfinite(want):  # a tie at a = 0 is infinite in both
            assert abs(got - want) <= 1e-12 * max(1.0, abs(want)), (x, y, got, want)
        else:
            assert not cmath.isfinite(got), (x, y, got, want)


def test_a_step_that_is_off_makes_its_product_zero_where_the_rest_is_not_finite() -> None:
    # the tangent of relu(a) times a factor infinite at a = -1, where relu's step is off
    term = derivative(sympy.Max(a, 0), a) * t / (a + 1)
    assert selected(term).subs({a: -1, t: 1}) == 0
    assert selected(term).subs({a: 1, t: 1}) == sympy.Rational(1, 2)


def test_the_code_grows_with_the_term() -> None:
    # folding the pieces of all 24 products into one choice took about six times longer per product (20 s
    # at six products) and does not finish here
    term = _min_chain_term(24)
    assert len(sympy.Add.make_args(term)) >= 24
    mine = selected(term)
    assert sympy.count_ops(mine) <= 2 * sympy.count_ops(term) + 50


_FACTORS = (
    lambda: sympy.Piecewise((1, a < b), (sympy.Piecewise((sympy.Rational(1, 2), sympy.Eq(a, b)), (0, True)), True)),
    lambda: sympy.Heaviside(a),
    lambda: sympy.Heaviside(b - a, 0),
    lambda: sympy.Piecewise((2 * a, a > 0), (0, True)) ** 2,
    lambda: 1 / (a + 1),
    lambda: sympy.sqrt(sympy.Abs(b)),
    lambda: sympy.tanh(sympy.Min(a, b)),
    lambda: sympy.exp(sympy.Piecewise((a, b > 0), (b, True))),
    lambda: a - 2 * b,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, len(_FACTORS) - 1), min_size=1, max_size=3), min_size=1, max_size=3))
def test_random_terms_have_the_folded_terms_values(products: list[list[int]]) -> None:
    term = sum((t * sympy.Mul(*[_FACTORS[k]() for k in product]) for product in products), sympy.Integer(0))
    folded = sympy.piecewise_fold(term.replace(lambda e: isinstance(e, sympy.Heaviside),
                                               lambda e: sympy.Piecewise((0, e.args[0] < 0), (
                                                   e.args[1] if len(e.args) > 1 else sympy.Rational(1, 2),
                                                   sympy.Eq(e.args[0], 0)), (1, True))))
    mine = selected(term)
    for x, y in itertools.product((-1.0, -0.5, 0.0, 0.75), (-0.5, 0.0, 0.75)):
        point = {a: sympy.Float(x), b: sympy.Float(y), t: sympy.Float(0.7)}
        want, got = complex(folded.subs(point)), complex(mine.subs(point))
        if cmath.isfinite(want):
            assert abs(got - want) <= 1e-12 * max(1.0, abs(want)), (products, x, y, got, want)
        else:
            assert not cmath.isfinite(got), (products, x, y, got, want)
