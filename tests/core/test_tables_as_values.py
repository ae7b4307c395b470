"""Rule tables are values held by passes: two passes with different tables coexist in one process, nothing
is registered globally, control flow is dispatched through its table, and pipelines are edited by name."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import attrs
import numpy as np
import pytest
from returns.result import Failure

import gradflow
from gradflow.autodiff.normalize import NORMALIZE
from gradflow.autodiff.passes import Reverse, SplitVJP, ad_pipeline
from gradflow.autodiff.rules import (
    default_control_rules, default_library_rules, default_reverse_rules, reverse_rule,
)
from gradflow.core.errors import InvalidArgumentError, NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.core.rule_table import MARK, Rule, RuleTable, collect
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.corpus import loops
from gradflow.verify.corpus.case import run_compiled, torch_grads


class Refuse:
    """A reverse rule that refuses every tasklet group (a user's stricter policy)."""

    def needs(self, site, ctx):
        return frozenset()

    def reverse(self, site, ctx):
        raise NotDifferentiableError(f"refused by the user's rule: {site.op.label}")


def _normalized(name: str) -> Graph:
    return NORMALIZE(Graph.of(loops.CASES_BY_NAME[name].to_sdfg())).unwrap()


def test_two_reverse_passes_with_different_tables_in_one_process() -> None:
    graph = _normalized("lp_softmax")
    strict_table = default_reverse_rules() + Rule("tasklet", Refuse(), "Refuse", priority=100)
    strict = Reverse(("X", "W"), ("S",), reverse_rules=strict_table)
    default = Reverse(("X", "W"), ("S",))
    refused = strict(graph)
    assert isinstance(refused, Failure) and "refused by the user's rule" in str(refused.failure())
    assert "ElementwiseReverse[tasklet]" in default(graph).unwrap().meta["ad"].rules_used
    assert isinstance(strict(graph), Failure)  # the default pass running in between changed nothing
    assert strict == Reverse(("X", "W"), ("S",), reverse_rules=strict_table) and strict != default


def test_swapping_a_control_rule_changes_the_graph_not_the_gradient() -> None:
    """Without `CountedLoop`, counted loops are reversed by `RecordedLoop` (trip counts on the tape): a
    different graph for the same, still exact, gradient — the two routes of the control table agree."""
    case = loops.CASES_BY_NAME["lp_triangular"]
    recorded_only = ad_pipeline().with_rules(control=default_control_rules().without("CountedLoop"))
    by_default = gradflow.api.grad_graph(case.to_sdfg(), list(case.wrt), case.of)
    by_recording = gradflow.api.grad_graph(case.to_sdfg(), list(case.wrt), case.of, pipeline=recorded_only)
    assert "CountedLoop" in by_default.meta["ad"].rules_used
    assert "CountedLoop" not in by_recording.meta["ad"].rules_used
    assert "<trip count>" in by_recording.meta["ad"].stores.values()
    assert "<trip count>" not in by_default.meta["ad"].stores.values()
    inputs = case.inputs(3)
    expected = torch_grads(case, inputs)
    for graph in (by_default, by_recording):
        arrays = run_compiled(case, compile_sdfg(graph),
                              {**inputs, **{f"grad_{x}": np.zeros_like(inputs[x]) for x in case.wrt}})
        for x in case.wrt:
            np.testing.assert_allclose(arrays[f"grad_{x}"], expected[x], rtol=1e-9, atol=1e-12)


def test_no_module_holds_a_rule_registry() -> None:
    """Rules exist only as marks on their functions/classes and in table values built from explicit module
    lists: no module-level container of rules that passes could consult or users could mutate."""
    package = Path(gradflow.__file__).parent
    offenders = []
    for info in pkgutil.walk_packages([str(package)], "gradflow."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, set)) else ()
            if any(isinstance(v, Rule) for v in items):
                offenders.append(f"{info.name}.{name}")
            if isinstance(value, RuleTable):
                offenders.append(f"{info.name}.{name}")
    assert not offenders, offenders


def test_built_in_tables_are_collected_from_marks() -> None:
    @reverse_rule("tasklet", priority=3)
    class Mine:
        def needs(self, site, ctx):
            return frozenset()

    assert [r.name for r in getattr(Mine, MARK)] == ["Mine"]
    assert "Mine" not in [r.name for r in default_reverse_rules()]  # marking registered nothing
    module = type(pkgutil)("holder")
    module.Mine = Mine
    assert [r.name for r in collect("reverse", [module])] == ["Mine"]
    assert {r.name for r in default_library_rules()} >= {"ProductReverse[MatMul]", "ReduceReverse"}


def test_engine_dispatches_without_isinstance() -> None:
    source = Path(gradflow.autodiff.engine.__file__).read_text()
    assert "isinstance" not in source


def test_pipelines_are_edited_by_name() -> None:
    pipe = ad_pipeline(Reverse(("X",), ("S",)))
    assert pipe.names() == ("set_aside_internal_names", "count_arguments_to_symbols", "lift_control_flow",
                            "lower_breaks", "raise_convolutions", "remove_views", "expand_library_nodes", "fold_product_scales", "hoist_row_products",
                            "raise_loop_reductions", "lower_indirection", "demote_data_symbols",
                            "complete_conditional_writes", "bound_transient_shapes", "loops_to_maps", "fuse_maps",
                            "collapse_maps", "split_operations", "reverse")
    assert pipe.without("collapse_maps").names()[16] == "split_operations"
    assert pipe.insert_after("reverse", SplitVJP()).names()[-1] == "split_vjp"
    replaced = pipe.replace("reverse", Reverse(("X",), ("S",), forwarding=gradflow.RECOMPUTE_ALL))
    assert replaced.step("reverse").forwarding == gradflow.RECOMPUTE_ALL and pipe.step("reverse").forwarding != \
        gradflow.RECOMPUTE_ALL
    empty = RuleTable("library")
    swapped = pipe.with_rules(library=empty)
    assert swapped.step("expand_library_nodes").library_rules == empty == swapped.step("reverse").library_rules
    with pytest.raises(InvalidArgumentError, match="onnx_lowering"):
        pipe.with_rules(onnx_lowering=empty)
    with pytest.raises(InvalidArgumentError, match="no step 'nope'"):
        pipe.without("nope")


def test_prerequisites_are_checked_when_a_pipeline_is_built() -> None:
    with pytest.raises(InvalidArgumentError, match="'reverse' requires 'split_operations'"):
        Pipeline((Reverse(),))
    with pytest.raises(InvalidArgumentError, match="'split_vjp' requires 'reverse'"):
        NORMALIZE + SplitVJP()
    with pytest.raises(InvalidArgumentError, match="'reverse' requires 'split_operations'"):
        ad_pipeline().without("split_operations")
    assert Pipeline((Reverse(),), assumes=("split_operations",)).names() == ("reverse",)


def test_named_pipelines_take_options() -> None:
    pipe = Pipeline.named("split_operations", "reverse", options={"reverse": {"wrt": ["X"], "of": "S"}})
    assert pipe.step("reverse") == Reverse(("X",), ("S",))
    with pytest.raises(InvalidArgumentError, match="has no option"):
        Pipeline.named("split_operations", "reverse", options={"reverse": {"flavour": 1}})
    with pytest.raises(InvalidArgumentError, match="not in the pipeline"):
        Pipeline.named("split_operations", options={"reverse": {}})


def test_grad_binds_or_rejects_the_pipelines_reverse_step() -> None:
    case = loops.CASES_BY_NAME["lp_if_else"]
    sdfg = case.to_sdfg()
    bound = gradflow.grad(sdfg, wrt=["X"], of="S", pipeline=ad_pipeline())  # wrt/of filled in from the call
    assert "grad_X" in bound.arrays
    with pytest.raises(InvalidArgumentError, match="wrt"):
        gradflow.grad(sdfg, wrt=["X"], of="S", pipeline=ad_pipeline(Reverse(("S",), ("S",))))
    with pytest.raises(InvalidArgumentError, match="forwarding"):
        gradflow.grad(sdfg, wrt=["X"], of="S", forwarding=gradflow.STORE_ALL.with_loop_bounds(w=3),
                      pipeline=ad_pipeline(Reverse(forwarding=gradflow.RECOMPUTE_ALL)))
    with pytest.raises(InvalidArgumentError, match="mode"):
        gradflow.grad(sdfg, wrt=["X"], of="S", pipeline=ad_pipeline(Reverse(mode="vjp")))
    with pytest.raises(InvalidArgumentError, match="0 'reverse' steps"):
        gradflow.grad(sdfg, wrt=["X"], of="S", pipeline=NORMALIZE)
    with pytest.raises(InvalidArgumentError, match="gradflow.Pipeline"):
        gradflow.grad(sdfg, wrt=["X"], of="S", pipeline="x")
    assert attrs.evolve(ad_pipeline().step("reverse"), wrt=["X"]).wrt == ("X",)
