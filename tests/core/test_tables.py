"""Malformed declarative tables fail at load time with the file and the entry named."""

from __future__ import annotations

import pytest

from gradflow.core.elementwise import load_elementwise
from gradflow.core.errors import RuleTableError

GOOD = '[sq]\nargs = ["x"]\nformula = "x**2"\n'


@pytest.mark.parametrize(
    "text, problem",
    [
        ('[bad]\nformula = "x"\n', "missing field"),
        ('[bad]\nargs = ["x"]\nformula = "x"\nflavour = 1\n', "unknown field"),
        ('[bad]\nargs = ["x"]\nformula = "y + x"\n', "unknown name"),
        ('[bad]\nargs = ["x"]\nformula = "frobnicate(x)"\n', "unknown function"),
        ('[bad]\nargs = ["x"]\nformula = "x"\ndomain = { x = [2.0, 1.0] }\n', "low < high"),
        ('[bad]\nargs = ["1x"]\nformula = "x"\n', "identifiers"),
        (GOOD + '[bad]\nargs = ["x"]\nformula = "x"\nspellings = ["sq"]\n[sq2]\nargs = ["x"]\nformula = "x"\nspellings = ["sq"]\n',
         "already belongs"),
        ("[bad\n", "cannot read"),
    ],
)
def test_malformed_entries(tmp_path, text: str, problem: str) -> None:
    path = tmp_path / "elementwise.toml"
    path.write_text(text)
    with pytest.raises(RuleTableError, match=problem) as info:
        load_elementwise(path)
    assert str(path) in str(info.value)


def test_good_table_loads_into_frozen_records(tmp_path) -> None:
    path = tmp_path / "elementwise.toml"
    path.write_text(GOOD)
    table = load_elementwise(path)
    entry = table["sq"]
    assert entry.args == ("x",) and str(entry.expr) == "x**2"
    with pytest.raises(AttributeError):
        entry.formula = "x"  # frozen


def test_formulas_evaluate_to_what_sympys_parser_builds() -> None:
    """The table evaluates its checked formula trees directly; the result must be SymPy's own parse."""
    import sympy

    from gradflow.core.elementwise import FORMULA_NAMESPACE, _parse_formula, elementwise_table

    for entry in elementwise_table():
        names = {**FORMULA_NAMESPACE, **{a: sympy.Symbol(a, real=True) for a in entry.args}}
        for text in (entry.formula, *entry.kinks):
            expected = sympy.parse_expr(text, local_dict=names, evaluate=True)
            assert sympy.srepr(_parse_formula(text, entry.args)) == sympy.srepr(expected), (entry.name, text)
    assert _parse_formula("x / 2 + 1 / 3", ("x",)) == sympy.Symbol("x", real=True) / 2 + sympy.Rational(1, 3)
