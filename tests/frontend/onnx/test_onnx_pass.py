"""`onnx_lower` is a registered, pure pass over a Graph carrying the model."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
from returns.result import Failure, Success

from gradflow.core.errors import GradflowError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline, registered_passes
from gradflow.frontend.onnx import OnnxLower, model_graph, read_model
from onnx_testutil import single_node_model

F = TensorProto.FLOAT


def _model():
    return single_node_model("Softmax", [("x", F, [2, 5])], [("y", F, [2, 5])])


def test_registered_and_usable_in_a_pipeline():
    assert registered_passes()["onnx_lower"] is OnnxLower
    graph = model_graph(read_model(_model()))
    before = graph.fingerprint
    result = Pipeline.named("onnx_lower")(graph)
    assert isinstance(result, Success)
    lowered = result.unwrap()
    assert isinstance(lowered, Graph) and lowered.sdfg.number_of_nodes() > 1
    assert "onnx_signature" in lowered.meta and "onnx_model" in lowered.meta
    assert graph.fingerprint == before and not graph.changed_since_fingerprint()  # input untouched
    assert OnnxLower()(graph).unwrap().fingerprint == lowered.fingerprint  # deterministic


def test_without_model_is_a_failure_value():
    result = OnnxLower()(Graph.of(model_graph(read_model(_model())).sdfg))
    assert isinstance(result, Failure) and isinstance(result.failure(), GradflowError)


def test_custom_table_overrides_a_rule():
    from gradflow.core.rule_table import Rule
    from gradflow.frontend.onnx import load
    from gradflow.frontend.onnx.rules import default_table

    def relu_as_abs(lw, node):
        x = lw.get(node.inputs[0])
        lw.elementwise(node.label, "res = abs(x)", {"x": x}, node.outputs[0], x.dtype)

    table = default_table().with_rule(Rule("Relu", relu_as_abs, "relu_as_abs"))
    prog = load(single_node_model("Relu", [("x", F, [4])], [("y", F, [4])]), table=table)
    x = np.array([-2, -1, 1, 2], np.float32)
    np.testing.assert_array_equal(prog(x)[0], np.abs(x))
    assert "Relu" in default_table().keys()
    assert load(single_node_model("Relu", [("x", F, [4])], [("y", F, [4])]))(x)[0].tolist() == [0, 0, 1, 2]
