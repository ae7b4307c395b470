"""Every rule of every table is exercised by a verified check; a table key without one fails the suite.

- elementwise and ONNX tables: the generated tests are parametrised by the table's keys (checked here so
  that an empty selection cannot pass silently);
- reverse, library and control tables: a rule counts as tested when a program whose gradient the suite
  checks against torch (dataflow and loop corpora, library cases) applied it, as reported by
  `ADInterface.rules_used` of its differentiation.
- tangent tables (`tangent`, `tangent_library`): a rule counts as tested when the forward-mode build of a
  program or library case whose tangent the suite checks against torch applied it
  (`TangentInterface.rules_used`).
The report logic itself (`gradflow.verify.rows`) marks a rule without checks `untested`.
"""

from __future__ import annotations

import pytest

from gradflow import verify
from gradflow.verify import elementwise, library, onnx_ops, programs


@pytest.fixture(scope="module")
def used() -> set[tuple[str, str]]:
    pairs = set()
    for name in [c.name for c in programs.cases()]:
        pairs |= set(verify._tagged(programs.rules_used(name)))
    for name in library.names():
        pairs |= set(verify._tagged(library.rules_used(name)))
    return pairs


@pytest.mark.parametrize("table", ["reverse", "library", "control"])
def test_every_autodiff_rule_is_used_by_a_verified_program(table: str, used) -> None:
    untested = [rule for rule in verify.rule_names(table) if (table, rule) not in used]
    assert not untested, f"rules of table '{table}' no verified program exercises: {untested}"


def test_every_elementwise_entry_and_onnx_op_has_checks() -> None:
    items = verify.items(("elementwise", "onnx"), quick=True)
    assert {i.name for i in items if i.kind == "elementwise"} == set(elementwise.names())
    assert {onnx_ops.op_of(i.name) for i in items if i.kind == "onnx"} == set(onnx_ops.ops())


def test_a_rule_without_checks_is_reported_untested() -> None:
    results = [verify.Result(verify.Item("elementwise", "exp"), (("elementwise", "exp"),), True, 0.0)]
    rows = {r.rule: r for r in verify.rows(results, ("elementwise",))}
    assert rows["exp"].status == verify.PASS
    assert rows["log"].status == verify.UNTESTED
    failed = [verify.Result(verify.Item("elementwise", "exp"), (("elementwise", "exp"),), False, None, "boom")]
    assert {r.rule: r for r in verify.rows(failed, ("elementwise",))}["exp"].status == verify.FAIL


def test_every_tangent_rule_is_used_by_a_verified_program() -> None:
    from gradflow.verify import tangents

    used = set()
    for case in programs.cases():
        if case.name not in tangents.REFUSED:
            used |= set(tangents.rules_used(case))
    for name in library.names():
        used |= set(tangents.library_rules_used(name))
    untested = [rule for rule in verify.rule_names("tangent") if rule not in used]
    assert not untested, f"tangent rules no verified program exercises: {untested}"
