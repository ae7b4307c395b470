"""Pipelines compose passes, stop at the first failure, report to a hook; rule tables pick by priority."""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
import pytest
from dace import subsets
from returns.result import Failure, Success

from gradflow.core.errors import GradflowError, InvalidArgumentError, PassError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, Pipeline
from gradflow.core.rule_table import Rule, RuleTable


@attrs.frozen
class AddArray(Pass):
    array: str
    name: ClassVar[str] = "test_add_array"

    def run(self, graph: Graph):
        sdfg = graph.editable()
        sdfg.add_array(self.array, [2], dace.float64)
        return Success(Graph.adopt(sdfg))


@attrs.frozen
class Explode(Pass):
    name: ClassVar[str] = "test_explode"

    def run(self, graph: Graph):
        raise KeyError("deep inside")


@attrs.frozen
class UnionOfRows(Pass):
    """Records DaCe's union of the rows {i} and {1}, as DaCe's propagation forms it inside a pass."""

    found: list
    name: ClassVar[str] = "test_union_of_rows"
    checks_output: ClassVar[bool] = False

    def run(self, graph: Graph):
        i = dace.symbol("i")
        self.found.append(subsets.union(subsets.Range([(i, i, 1)]), subsets.Range([(1, 1, 1)])))
        return Success(graph)


def empty() -> Graph:
    return Graph.of(dace.SDFG("empty"))


def test_pipeline_runs_in_order_and_calls_hook() -> None:
    seen = []
    pipe = Pipeline((AddArray("A"), AddArray("B")), hook=lambda name, g: seen.append((name, sorted(g.sdfg.arrays))))
    out = pipe(empty()).unwrap()
    assert sorted(out.sdfg.arrays) == ["A", "B"]
    assert seen == [("test_add_array", ["A"]), ("test_add_array", ["A", "B"])]


def test_pipeline_stops_at_failure_with_a_typed_value() -> None:
    result = (Pipeline((AddArray("A"),)) + Explode() + AddArray("B"))(empty())
    assert isinstance(result, Failure)
    err = result.failure()
    assert isinstance(err, PassError) and "test_explode" in str(err) and "deep inside" in str(err)


def test_named_pipeline_rejects_unknown_names() -> None:
    with pytest.raises(InvalidArgumentError, match="no_such_pass"):
        Pipeline.named("split_operations", "no_such_pass")
    assert Pipeline.named("split_operations", "collapse_maps").steps[0].name == "split_operations"


def test_rule_table_priority_predicate_and_override() -> None:
    table = RuleTable("t", (Rule("k", "low", "low", 0), Rule("k", "high", "high", 5, lambda x: x > 0)))
    assert table.lookup("k", 1).fn == "high"
    assert table.lookup("k", -1).fn == "low"
    assert table.lookup("other", 1) is None
    overridden = table + RuleTable("t", (Rule("k", "user", "user", 5),))
    assert overridden.lookup("k", 1).fn == "user"  # same priority: the later registration wins
    assert len(table) == 2  # tables are values: + did not change the original


def test_errors_are_exceptions_and_values() -> None:
    err = InvalidArgumentError("bad thing", "do this")
    assert isinstance(err, GradflowError) and "hint: do this" in str(err)


@attrs.frozen
class MakeCycle(Pass):
    """Returns a graph whose one state has a dataflow cycle (which DaCe's validation would not report)."""

    name: ClassVar[str] = "test_make_cycle"

    def run(self, graph: Graph):
        sdfg = graph.editable()
        sdfg.add_array("A", [2], dace.float64)
        state = sdfg.add_state("loopy")
        a, t = state.add_access("A"), state.add_tasklet("t", {"i"}, {"o"}, "o = i")
        state.add_edge(a, None, t, "i", dace.Memlet("A[0]"))
        state.add_edge(t, "o", a, None, dace.Memlet("A[1]"))
        return Success(Graph.adopt(sdfg))


def test_a_pass_returning_a_malformed_graph_fails_naming_the_pass() -> None:
    result = Pipeline((AddArray("B"), MakeCycle()))(empty())
    assert isinstance(result, Failure)
    message = str(result.failure())
    assert "pass 'test_make_cycle' returned an invalid graph" in message and "dataflow cycle" in message


@attrs.frozen(eq=False)
class RecordEdited(Pass):
    """Adds an array and records which SDFG object it was given to edit."""

    array: str
    edited: list
    name: ClassVar[str] = "test_record_edited"

    def run(self, graph: Graph):
        sdfg = graph.editable()
        self.edited.append(sdfg)
        sdfg.add_array(self.array, [2], dace.float64)
        return Success(Graph.adopt(sdfg))


def test_a_pipeline_hands_intermediates_on_without_copies_and_never_edits_its_input_or_output() -> None:
    edited: list = []
    source = empty()
    out = Pipeline((RecordEdited("A", edited), RecordEdited("B", edited), RecordEdited("C", edited)))(source).unwrap()
    assert not source.sdfg.arrays  # the input was copied once, by the first step
    assert edited[0] is not source.sdfg and edited[1] is edited[0] and edited[2] is edited[0]
    assert sorted(out.sdfg.arrays) == ["A", "B", "C"]
    again = Pipeline((RecordEdited("D", edited),))(out).unwrap()  # the output was not lent: it is copied
    assert sorted(out.sdfg.arrays) == ["A", "B", "C"] and sorted(again.sdfg.arrays) == ["A", "B", "C", "D"]


def test_a_step_editing_a_lent_graph_in_place_is_still_checked() -> None:
    result = Pipeline((RecordEdited("B", []), MakeCycle(), AddArray("C")))(empty())
    assert isinstance(result, Failure) and "pass 'test_make_cycle' returned an invalid graph" in str(result.failure())


def test_grad_copies_the_program_once(monkeypatch) -> None:
    import gradflow
    from gradflow.verify.corpus.dataflow import CASES_BY_NAME

    copies = []
    original = Graph.editable

    def counting(self):
        if not self._lender:
            copies.append(self)
        return original(self)

    monkeypatch.setattr(Graph, "editable", counting)
    case = CASES_BY_NAME["df_where"]
    sdfg = case.to_sdfg()
    before = Graph.of(sdfg).fingerprint
    gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of)
    assert copies == []  # Graph.of's copy is the only one; every pass edits what the previous one built
    assert Graph.of(sdfg).fingerprint == before


@pytest.mark.parametrize("value", [0, 1, 2, 7])
def test_a_pass_reasons_about_subsets_without_taking_symbols_as_positive(value: int) -> None:
    # By default DaCe's union of rows {i} and {1} is `1:i + 1`, which leaves out row 0 at i = 0
    found: list = []
    assert isinstance(UnionOfRows(found)(empty()), Success)
    (begin, end, _), = found[0].ranges
    low, high = (int(dace.symbolic.evaluate(x, {"i": value})) for x in (begin, end))
    assert low <= min(value, 1) and high >= max(value, 1)
