"""Models that break the ONNX specification are typed errors at load, never silently lowered.

- The cases of issue 11 (Softmax axis 7 on rank 2, TopK with k larger than the axis, opset 999, an unknown
  Gelu approximation or auto_pad, a zero stride, a kernel of the wrong rank, an Einsum equation with a stray
  character) are rejected by `load` with an error naming the node, and by the lowering itself when it is
  given a model that skipped `load`'s checks (`lower_model` on an unchecked `OnnxModel`).
- Attributes fuzzed by hypothesis: lowering an unchecked model and loading it end in success or a
  `GradflowError`, nothing else; when ONNX's reference evaluator rejects the node, so does the lowering.
- The declared attribute constraints and rule opset ranges agree with the schemas in `onnx.defs`.

Nothing here compiles: lowering is pure Python.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.defs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from gradflow.core.errors import GradflowError
from gradflow.core.rule_table import RuleTable
from gradflow.frontend.onnx import (
    InvalidNodeError, MalformedModelError, OnnxModel, UnsupportedOpError, default_table, load, lower_model, onnx_rule,
)
from gradflow.frontend.onnx.errors import UnsupportedOpsetError
from gradflow.frontend.onnx.spec import SPEC, AtLeast, Choice, Equation
from gradflow.frontend.onnx.table import GRADFLOW_DOMAIN, GRADFLOW_OPS, LATEST_OPSET, opset_range

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def node_model(op: str, inputs, outputs, opset: int = 18, initializers=(), name: str = "the_node",
               **attrs) -> onnx.ModelProto:
    """One named node; `inputs`/`outputs` are (name, elem type, shape) (output shape None: inferred below)."""
    node = helper.make_node(op, [n for n, _, _ in inputs] + [t.name for t in initializers],
                            [n for n, _, _ in outputs], name=name)
    node.attribute.extend(  # lists typed explicitly, so an empty one is an (empty) INTS attribute
        helper.make_attribute(k, v, attr_type=onnx.AttributeProto.INTS if isinstance(v, list) else None)
        for k, v in attrs.items())
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def with_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its outputs' shapes filled in by (lenient) shape inference, where it can (not for an
    Einsum equation `spec` rejects: ONNX's inference loops forever on some, e.g. 'i.i')."""
    node = model.graph.node[0]
    if node.op_type == "Einsum" and Equation().problem(helper.get_attribute_value(node.attribute[0]).decode()):
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for given, found in zip(out.graph.output, inferred.graph.output):
        if found.type.tensor_type.HasField("shape"):
            given.CopyFrom(found)
    return out


def unchecked(model: onnx.ModelProto) -> OnnxModel:
    """The model as the lowering pass takes it, without the checker or shape inference of `load`."""
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    return OnnxModel(model.SerializeToString(), opset)


def lower(model: onnx.ModelProto):
    return lower_model(unchecked(model), default_table())


X23 = ("x", F, [2, 3])
CONV_IN = [("x", F, [1, 1, 5, 5]), ("w", F, [1, 1, 3, 3])]
K5 = helper.make_tensor("k", I64, [1], [5])

#: The cases of issue 11: (model, what the error must name besides the node).
ISSUE_CASES = {
    "softmax_axis_7": (node_model("Softmax", [X23], [("y", F, [2, 3])], axis=7), "axis"),
    "topk_k_above_axis": (node_model("TopK", [X23], [("v", F, [2, 5]), ("i", I64, [2, 5])], initializers=[K5]), "k"),
    "opset_999": (node_model("Relu", [X23], [("y", F, [2, 3])], opset=999), "opset 999"),
    "gelu_unknown_approximation": (node_model("Gelu", [X23], [("y", F, [2, 3])], opset=20, approximate="fast"),
                                   "approximate"),
    "conv_unknown_auto_pad": (node_model("Conv", CONV_IN, [("y", F, [1, 1, 3, 3])], auto_pad="SAME_MIDDLE"),
                              "auto_pad"),
    "conv_zero_stride": (node_model("Conv", CONV_IN, [("y", F, [1, 1, 3, 3])], strides=[0, 1]), "strides"),
    "conv_kernel_of_wrong_rank": (node_model("Conv", CONV_IN, [("y", F, [1, 1, 3, 3])], kernel_shape=[3]),
                                  "kernel_shape"),
    "einsum_stray_character": (node_model("Einsum", [("a", F, [2, 3]), ("b", F, [3, 4])], [("y", F, [2, 4])],
                                          equation="ij,jk->ik!"), "ik!"),
    # ONNX's shape inference loops forever on this equation: load must reject it before inference runs
    "einsum_single_dot": (node_model("Einsum", [("a", F, [2, 3])], [("y", F, [3])], equation="i.i"), "i.i"),
}


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_load_rejects_models_onnxruntime_rejects(case):
    model, _ = ISSUE_CASES[case]
    with pytest.raises((MalformedModelError, UnsupportedOpError)) as info:
        load(model)
    assert "the_node" in str(info.value)


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_lowering_itself_rejects_them(case):
    """The lowering's own checks, for a model that did not go through `load` (ONNX's shape inference
    catches several of these first there)."""
    model, named = ISSUE_CASES[case]
    expected = UnsupportedOpsetError if case == "opset_999" else InvalidNodeError
    with pytest.raises(expected) as info:
        lower(model)
    text = str(info.value)
    assert "the_node" in text and model.graph.node[0].op_type in text and named in text, text


def test_opset_error_names_op_node_and_opset():
    with pytest.raises(UnsupportedOpsetError) as info:
        load(ISSUE_CASES["opset_999"][0])
    text = str(info.value)
    assert "'Relu'" in text and "the_node" in text and "opset 999" in text and f"1-{LATEST_OPSET}" in text


def test_a_table_with_a_wider_range_lowers_the_opset():
    """The range is data of the rule: a user's table with a Relu rule declared for opset 999 lowers it."""
    relu = default_table().named("table_formula[Relu]")

    @onnx_rule("Relu", opsets=(1, 999))
    def relu_999(lw, node):
        relu.fn(lw, node)

    table = default_table() + RuleTable("onnx_lowering", relu_999.__gradflow_rules__)
    sdfg, sig = lower_model(unchecked(ISSUE_CASES["opset_999"][0]), table)
    assert [p.onnx_name for p in sig.outputs] == ["y"] and sig.outputs[0].array in sdfg.arrays


def test_rules_outside_their_first_opset_are_refused():
    """Add before opset 7 broadcast by attributes, not numpy's rules: it must not be lowered as numpy."""
    model = node_model("Add", [X23, ("b", F, [3])], [("y", F, [2, 3])], opset=6, broadcast=1)
    with pytest.raises(UnsupportedOpsetError, match="opset 6.*7-"):
        load(model)


# -- fuzzing -----------------------------------------------------------------------------------------------
#: Examples per family (a deterministic sequence, unless GRADFLOW_FUZZ_RANDOM=1): raise both to fuzz deeper.
FUZZ_EXAMPLES = int(os.environ.get("GRADFLOW_FUZZ_EXAMPLES", "40"))
FUZZ_RANDOM = os.environ.get("GRADFLOW_FUZZ_RANDOM") == "1"


def _ints(lo, hi, max_size=4):
    return st.lists(st.integers(lo, hi), min_size=0, max_size=max_size)


def _axis_op(op, extra=None):
    def build(draw):
        attrs = {"axis": draw(st.integers(-4, 4))}
        opset = draw(st.sampled_from([11, 13, 18]))
        return node_model(op, [X23], [("y", F, None)], opset=opset, **attrs), {"x": _data(2, 3)}
    return build


def _data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _gather(draw):
    op = draw(st.sampled_from(["Gather", "GatherElements"]))
    # GatherElements' indices take the data's shape (ONNX's reference evaluator wants that; onnxruntime only
    # bounds them by it)
    idx = helper.make_tensor("i", I64, [2, 3], draw(st.lists(st.integers(-4, 3), min_size=6, max_size=6)))
    return node_model(op, [X23], [("y", F, None)], axis=draw(st.integers(-3, 3)), initializers=[idx]), {"x": _data(2, 3)}


def _topk(draw):
    k = helper.make_tensor("k", I64, [1], [draw(st.integers(-2, 5))])
    attrs = {"axis": draw(st.integers(-3, 3)), "largest": draw(st.integers(0, 2)), "sorted": draw(st.integers(0, 1))}
    return node_model("TopK", [X23], [("v", F, None), ("i", I64, None)], initializers=[k], **attrs), {"x": _data(2, 3)}


AUTO_PADS = st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "same", "BOGUS"])


def _window_attrs(draw, pool: bool):
    attrs = {}
    for name, values in (("strides", _ints(-1, 3, 3)), ("dilations", _ints(0, 2, 3)), ("pads", _ints(-1, 3, 5))):
        if draw(st.booleans()):
            attrs[name] = draw(values)
    if pool or draw(st.booleans()):
        attrs["kernel_shape"] = draw(_ints(0, 4, 3))
    if draw(st.booleans()):
        attrs["auto_pad"] = draw(AUTO_PADS)
    return attrs


def _conv(draw):
    attrs = _window_attrs(draw, pool=False)
    if draw(st.booleans()):
        attrs["group"] = draw(st.integers(0, 2))
    return node_model("Conv", [("x", F, [1, 2, 5, 5]), ("w", F, [2, 2, 3, 3])], [("y", F, None)], **attrs), {
        "x": _data(1, 2, 5, 5), "w": _data(2, 2, 3, 3)}


def _pool(draw):
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    attrs = _window_attrs(draw, pool=True)
    # (ONNX's reference evaluator does not implement ceil_mode together with auto_pad, which the spec allows)
    if attrs.get("auto_pad", "NOTSET") == "NOTSET" and draw(st.booleans()):
        attrs["ceil_mode"] = draw(st.integers(0, 2))
    return node_model(op, [("x", F, [1, 1, 5, 5])], [("y", F, None)], **attrs), {"x": _data(1, 1, 5, 5)}


def _einsum(draw):
    eq = draw(st.text(alphabet="ijk,->. !", min_size=1, max_size=10))
    return node_model("Einsum", [("a", F, [2, 3]), ("b", F, [3, 3])], [("y", F, None)], equation=eq), {
        "a": _data(2, 3), "b": _data(3, 3)}


def _enums(draw):
    op, attr, opset = draw(st.sampled_from([("Gelu", "approximate", 20), ("Pad", "mode", 18),
                                            ("ScatterElements", "reduction", 18)]))
    value = draw(st.sampled_from(["none", "tanh", "constant", "edge", "reflect", "wrap", "add", "max", "", "Tanh",
                                  "mul ", "bogus"]))
    if op == "Gelu":
        return node_model(op, [X23], [("y", F, None)], opset=opset, **{attr: value}), {"x": _data(2, 3)}
    if op == "Pad":
        pads = helper.make_tensor("p", I64, [4], [1, 0, 1, 2])
        return node_model(op, [X23], [("y", F, None)], opset=opset, initializers=[pads], **{attr: value}), {
            "x": _data(2, 3)}
    ind = helper.make_tensor("i", I64, [1, 3], [0, 1, 0])
    upd = helper.make_tensor("u", F, [1, 3], [1.0, 2.0, 3.0])
    return node_model(op, [X23], [("y", F, None)], opset=opset, initializers=[ind, upd], **{attr: value}), {
        "x": _data(2, 3)}


def _shape_ops(draw):
    op = draw(st.sampled_from(["Transpose", "Squeeze", "Unsqueeze", "ReduceSum", "Split", "Flatten", "Concat",
                               "CumSum"]))
    x = ("x", F, [2, 1, 3])
    feeds = {"x": _data(2, 1, 3)}
    if op == "Transpose":
        return node_model(op, [x], [("y", F, None)], perm=draw(_ints(-1, 3, 4))), feeds
    if op == "Flatten":
        return node_model(op, [x], [("y", F, None)], axis=draw(st.integers(-5, 5))), feeds
    if op == "Concat":
        return node_model(op, [x, ("z", F, [2, 1, 3])], [("y", F, None)], axis=draw(st.integers(-4, 4))), {
            **feeds, "z": _data(2, 1, 3)}
    values = draw(_ints(-4, 4, 3))
    axes = helper.make_tensor("a", I64, [len(values)], values)
    if op == "CumSum":
        axis = helper.make_tensor("a", I64, [], [draw(st.integers(-4, 4))])
        return node_model(op, [x], [("y", F, None)], initializers=[axis]), feeds
    if op == "Split":
        sizes = helper.make_tensor("s", I64, [len(values)], values)
        outs = [(f"y{k}", F, None) for k in range(max(1, len(values)))]
        return node_model(op, [x], outs, initializers=[sizes], axis=draw(st.integers(-4, 3))), feeds
    if op == "ReduceSum":
        return node_model(op, [x], [("y", F, None)], initializers=[axes], keepdims=draw(st.integers(0, 2))), feeds
    return node_model(op, [x], [("y", F, None)], initializers=[axes]), feeds


FAMILIES = {
    "softmax": _axis_op("Softmax"), "log_softmax": _axis_op("LogSoftmax"), "gather": _gather, "topk": _topk,
    "conv": _conv, "pool": _pool, "einsum": _einsum, "enums": _enums, "shape_ops": _shape_ops,
}


def _reference_accepts(model: onnx.ModelProto, feeds: dict) -> bool:
    try:
        ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # noqa: BLE001 - any failure of the reference means "ONNX rejects this node"
        return False
    return True


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=not FUZZ_RANDOM,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_attributes(family, data):
    model, feeds = FAMILIES[family](data.draw)
    model = with_output_shapes(model)
    try:
        lower(model)
        lowered = True
    except GradflowError:
        lowered = False
    if lowered:
        assert _reference_accepts(model, feeds), (
            f"the lowering accepted a node ONNX's reference evaluator rejects: {model.graph.node[0]}")
    try:
        load(model)
    except GradflowError:
        pass


# -- the declarations agree with onnx.defs ----------------------------------------------------------------
def _schemas(op: str, first: int, last: int) -> list:
    out = []
    for version in range(first, min(last, onnx.defs.onnx_opset_version()) + 1):
        try:
            schema = onnx.defs.get_schema(op, version)
        except onnx.defs.SchemaError:
            continue
        if schema.since_version not in {s.since_version for s in out}:
            out.append(schema)
    return out


def test_rule_opset_ranges_agree_with_onnx_defs():
    assert LATEST_OPSET <= onnx.defs.onnx_opset_version()
    for rule in default_table():
        first, last = opset_range(rule)
        assert 1 <= first <= last <= LATEST_OPSET, rule.name
        if rule.meta.get("domain") == GRADFLOW_DOMAIN:  # gradflow's own ops have no ONNX schema
            assert (GRADFLOW_DOMAIN, rule.key) in GRADFLOW_OPS, rule.name
            continue
        assert _schemas(rule.key, first, last), f"{rule.name}: no ONNX schema of {rule.key} in opsets {first}-{last}"


def test_attribute_constraints_agree_with_onnx_defs():
    """Each constrained attribute exists (as an int, ints or string attribute) in a schema of the op the
    rules cover; each string choice is named in the attribute's description; defaults are allowed values."""
    table = default_table()
    for op, attrs in SPEC.items():
        ranges = [opset_range(r) for r in table.candidates(op)]
        assert ranges, f"SPEC names {op}, which has no lowering rule"
        schemas = [s for first, last in ranges for s in _schemas(op, first, last)]
        for name, rule in attrs.items():
            found = [(s.since_version, s.attributes[name]) for s in schemas if name in s.attributes]
            assert found, f"{op} has no attribute '{name}' in opsets {ranges}"
            for version, attr in found:
                kind = attr.type
                if isinstance(rule, Choice) and all(isinstance(v, str) for v in rule.values):
                    assert kind == onnx.defs.OpSchema.AttrType.STRING, (op, name)
                    for value in rule.values:
                        named = value in attr.description
                        assert named == (value in rule.allowed(version)), (
                            f"{op}.{name} in opset {version}: {value!r} is {'' if named else 'not '}named in the "
                            "schema's description")
                elif isinstance(rule, Equation):
                    assert kind == onnx.defs.OpSchema.AttrType.STRING, (op, name)
                else:
                    assert kind in (onnx.defs.OpSchema.AttrType.INT, onnx.defs.OpSchema.AttrType.INTS), (op, name)
                default = helper.get_attribute_value(attr.default_value) if attr.default_value.name else None
                if isinstance(default, bytes):
                    default = default.decode()
                if default is not None and default != []:
                    problem = rule.problem(default, version)
                    assert problem is None, f"{op}.{name}: the default {default!r} {problem}"
    assert isinstance(SPEC["Conv"]["strides"], AtLeast)
