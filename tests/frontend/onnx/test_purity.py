"""`onnx_lower` is a pure pass: over the acceptance models and ONNX node-test models (lowered, failing, or
needing a value input) its input Graph keeps its canonical fingerprint and its model, and a success is a new
Graph that owns a new SDFG. (tests/core/test_purity.py runs every registered pass, this one included, over
SDFGs without a model, where it fails as a value.)"""

from __future__ import annotations

import functools

import onnx
import pytest
from returns.result import Failure, Success

import gradflow
from gradflow.core.errors import GradflowError
from gradflow.core.graph import Graph, fingerprint
from gradflow.frontend.onnx import OnnxLower, model_graph, read_model
from gradflow.verify.onnx_conformance import all_node_cases
from onnx_testutil import cnn, export_cnn, export_mlp, export_transformer, mlp, transformer

#: node-test models that lower: convolution with auto_pad, cubic resize and TopK (their shape-deciding
#: inputs bound to the case's values, as `OnnxProgram.specialize` does), einsum, a loss with weights, gathers,
#: layer norm with extra outputs, pooling with indices, a scatter.
NODE_CASES = (
    "test_conv_with_autopad_same", "test_resize_downsample_scales_cubic", "test_einsum_batch_diagonal",
    "test_sce_mean_weight_ii_4d", "test_gather_elements_1", "test_gathernd_example_float32",
    "test_layer_normalization_4d_axis2", "test_maxpool_with_argmax_2d_precomputed_pads", "test_scatternd",
    "test_top_k",
)
#: inputs bound to their values in the case's first data set
BIND = {"test_resize_downsample_scales_cubic": ("scales",), "test_top_k": ("k",)}
#: ...and node-test models whose lowering fails as a value: a graph input deciding a shape (unbound), a
#: float8 Cast, a sequence input.
FAILING_CASES = ("test_reshape_reduced_dims", "test_training_dropout", "test_cast_FLOAT_to_FLOAT8E4M3FN",
                 "test_identity_sequence")


EXPORTS = {"mlp": (mlp, export_mlp), "cnn": (cnn, export_cnn), "transformer": (transformer, export_transformer)}


@functools.cache
def model(name: str) -> onnx.ModelProto:
    if name in EXPORTS:
        make, export = EXPORTS[name]
        return export(make())
    return all_node_cases()[name].model


def _input_graph(name: str, proto: onnx.ModelProto) -> Graph:
    model = read_model(proto)
    if name in BIND:
        case = all_node_cases()[name]
        feeds = dict(zip([vi.name for vi in proto.graph.input], case.data_sets[0][0]))
        model = model.bind({n: feeds[n] for n in BIND[name]})
    return model_graph(model)


def test_onnx_lower_is_registered_by_importing_gradflow():
    assert gradflow.registered_passes()["onnx_lower"] is OnnxLower
    assert gradflow.onnx.load is gradflow.frontend.onnx.load


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", *NODE_CASES, *FAILING_CASES])
def test_onnx_lower_is_pure(name):
    proto = model(name)
    proto_bytes = proto.SerializeToString()
    graph = _input_graph(name, proto)
    before, model_bytes = graph.fingerprint, graph.meta["onnx_model"].data

    result = OnnxLower()(graph)
    again = OnnxLower()(graph)

    assert fingerprint(graph.sdfg) == before and not graph.changed_since_fingerprint(), "input SDFG mutated"
    assert graph.meta["onnx_model"].data == model_bytes, "the model in the input's meta changed"
    assert proto.SerializeToString() == proto_bytes, "the caller's ModelProto changed"
    assert type(result) is type(again)
    if isinstance(result, Failure):
        assert isinstance(result.failure(), GradflowError)
        assert name in FAILING_CASES, f"{name} should lower: {result.failure()}"
        return
    assert name not in FAILING_CASES and isinstance(result, Success)
    out = result.unwrap()
    assert isinstance(out, Graph) and out is not graph and out.sdfg is not graph.sdfg
    assert out.fingerprint != before and out.meta["onnx_model"] is graph.meta["onnx_model"]
    assert again.unwrap().fingerprint == out.fingerprint, "lowering must be deterministic"
    assert "onnx_signature" not in graph.meta
