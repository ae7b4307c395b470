"""Every entry of rules/elementwise.toml, verified end to end: adding an entry adds its tests.

The check (`gradflow.verify.elementwise.check`, the one `gradflow verify` runs) compiles one program per
entry and compares its gradient with torch.autograd (1e-9) and with central finite differences of the
formula; hypothesis draws the points inside the entry's domain.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gradflow.core.elementwise import ElementwiseEntry, elementwise_table
from gradflow.core.symbolic import parse_tasklet
from gradflow.verify import elementwise
from gradflow.verify.compare import CheckFailure

ENTRIES = list(elementwise_table())
N = elementwise.N


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_entry_gradient(entry: ElementwiseEntry, data) -> None:
    points = [np.array(data.draw(st.lists(st.floats(*entry.domain[a], allow_nan=False), min_size=N, max_size=N),
                                 label=a)) for a in entry.args]
    w = np.array(data.draw(st.lists(st.floats(-2, 2), min_size=N, max_size=N), label="W"))
    assert elementwise.check(entry.name, points, w) <= 1e-9


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


def test_a_wrong_reference_is_caught(monkeypatch) -> None:
    """The check can fail: with the torch reference of `sin` replaced by `cos`, the entry disagrees."""
    table = elementwise_table()
    wrong = attrs.evolve(table["sin"], torch="torch.cos(x)")
    patched = attrs.evolve(table, entries={**table.entries, "sin": wrong})
    monkeypatch.setattr(elementwise, "elementwise_table", lambda: patched)
    points, w = elementwise.random_points(wrong, np.random.default_rng(1))
    with pytest.raises(CheckFailure, match="sin"):
        elementwise.check("sin", points, w)
