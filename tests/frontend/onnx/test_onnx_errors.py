"""Typed errors: unsupported op, malformed model, wrong argument at call time."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from gradflow.core.errors import ArgumentError, GradflowError
from gradflow.frontend.onnx import (
    DynamicShapeError, InputMismatchError, MalformedModelError, UnsupportedOpError, UnsupportedTypeError, load,
)
from onnx_testutil import single_node_model

F = TensorProto.FLOAT


def test_unsupported_op_names_op_node_and_opset():
    model = single_node_model("Det", [("x", F, [3, 3])], [("y", F, [])], opset=17)
    model.graph.node[0].name = "my_det_node"
    with pytest.raises(UnsupportedOpError) as info:
        load(model)
    text = str(info.value)
    assert "'Det'" in text and "my_det_node" in text and "opset 17" in text
    assert isinstance(info.value, GradflowError)


def test_unsupported_custom_domain():
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError, match="FancyOp.*com.example"):
        load(model)


def test_malformed_model_carries_checker_message():
    node = helper.make_node("Relu", ["undefined_input"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(onnx.checker.ValidationError) as checker:
        onnx.checker.check_model(model)
    with pytest.raises(MalformedModelError) as info:
        load(model)
    assert str(checker.value).strip().splitlines()[0] in str(info.value)


def test_garbage_bytes_and_wrong_type():
    with pytest.raises(MalformedModelError):
        load(b"\x00not a model at all\xff" * 3)
    with pytest.raises(MalformedModelError):
        load(12345)


@pytest.fixture(scope="module")
def relu_program():
    return load(single_node_model("Relu", [("x", F, ["n", 4])], [("y", F, ["n", 4])]))


def test_call_checks_dtype_rank_and_shape(relu_program):
    good = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    (out,) = relu_program(good)
    np.testing.assert_array_equal(out, np.maximum(good, 0))
    with pytest.raises(InputMismatchError, match="dtype float32.*float64"):
        relu_program(good.astype(np.float64))
    with pytest.raises(InputMismatchError, match="rank 2"):
        relu_program(good.reshape(8))
    with pytest.raises(InputMismatchError, match="shape"):
        relu_program(good.reshape(4, 2))
    with pytest.raises(InputMismatchError, match="missing input"):
        relu_program()
    with pytest.raises(InputMismatchError, match="no input named"):
        relu_program(good, z=good)
    assert issubclass(InputMismatchError, ArgumentError)


def test_call_checks_torch_dtype(relu_program):
    with pytest.raises(InputMismatchError, match="dtype"):
        relu_program(torch.zeros(2, 4, dtype=torch.float64))


def test_symbolic_dims_must_agree():
    prog = load(single_node_model("Add", [("a", F, ["n"]), ("b", F, ["n"])], [("c", F, ["n"])]))
    a = np.ones(3, np.float32)
    (c,) = prog(a, a)
    np.testing.assert_array_equal(c, a + a)
    with pytest.raises(InputMismatchError, match="symbolic"):
        prog(a, np.ones(4, np.float32))


def test_shape_computed_from_data_is_a_dynamic_shape_error():
    nodes = [
        helper.make_node("Cast", ["s"], ["s_int"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "s_int"], ["y"], name="data_reshape"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [2, 6]), helper.make_tensor_value_info("s", F, [2])],
        [helper.make_tensor_value_info("y", F, ["a", "b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(DynamicShapeError, match="data_reshape.*s_int"):
        load(model)


def test_unsupported_element_types_are_typed_errors_naming_the_type():
    cast = single_node_model("Cast", [("x", F, [3])], [("y", TensorProto.FLOAT8E4M3FN, [3])], opset=21,
                             to=TensorProto.FLOAT8E4M3FN)
    cast.graph.node[0].name = "to_fp8"
    with pytest.raises(UnsupportedTypeError) as info:
        load(cast)
    text = str(info.value)
    assert "FLOAT8E4M3FN" in text and "'Cast'" in text and "to_fp8" in text and "opset 21" in text
    assert info.value.type_name == "FLOAT8E4M3FN" and isinstance(info.value, UnsupportedOpError)

    int4_in = single_node_model("Cast", [("x", TensorProto.INT4, [4])], [("y", F, [4])], opset=21, to=F)
    with pytest.raises(UnsupportedTypeError, match="graph input 'x' has element type INT4"):
        load(int4_in)

    fp8 = helper.make_tensor("w", TensorProto.FLOAT8E5M2, [2], [1.0, 2.0])
    init = single_node_model("Cast", [], [("y", F, [2])], opset=21, initializers=[fp8], to=F)
    with pytest.raises(UnsupportedTypeError, match="initializer 'w' has element type FLOAT8E5M2"):
        load(init)


def test_sequence_and_optional_inputs_are_typed_errors():
    seq = helper.make_tensor_sequence_value_info("s", F, [2])
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g", [seq],
                              [helper.make_tensor_sequence_value_info("t", F, [2])])
    with pytest.raises(UnsupportedTypeError, match="'s' is a sequence value") as info:
        load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert info.value.type_name == "sequence"


def test_a_declared_output_type_the_node_does_not_compute_is_named_with_both_types():
    model = single_node_model("Add", [("a", F, [3]), ("b", F, [3])], [("c", TensorProto.DOUBLE, [3])])
    with pytest.raises(MalformedModelError, match="graph output 'c' is declared double, but its node computes float"):
        load(model)


def test_an_allocation_larger_than_the_machine_is_a_typed_error_before_allocating():
    prog = load(single_node_model("Add", [("a", F, ["N"]), ("b", F, ["N"])], [("c", F, ["N"])]))
    huge = np.broadcast_to(np.ones(1, np.float32), (2**40,))  # 4 TiB once copied to a dense layout
    with pytest.raises(ArgumentError, match=r"input 'a' \(copied to a dense layout\) would need 4096.0 GiB"):
        prog(huge, huge)
