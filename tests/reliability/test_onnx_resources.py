"""Resources: no tensor larger than the memory limit is ever allocated (a typed error instead of an abort in
`std::bad_alloc`), and external data is read only from the folder the model belongs to.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper, helper

from gradflow.core.errors import InvalidArgumentError
from gradflow.frontend.onnx import load
from gradflow.frontend.onnx.errors import ExternalDataError, TensorTooLargeError
from gradflow.frontend.onnx.limits import DEFAULT_MAX_TENSOR_BYTES, ENV

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def expanded(elements: int) -> onnx.ModelProto:
    """y = sum(Expand(x, [elements])): a declared intermediate 'big' of `elements` floats."""
    shape = helper.make_tensor("shape", I64, [1], [elements])
    nodes = [helper.make_node("Expand", ["x", "shape"], ["big"], name="grow"),
             helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0)]
    return _model(nodes, [("x", F, [1])], [("y", F, [])], [shape])


def test_a_declared_intermediate_of_2_52_elements_is_refused_before_anything_is_allocated():
    with pytest.raises(TensorTooLargeError) as info:
        load(expanded(1 << 52))
    text = str(info.value)
    assert "'big'" in text and str(4 << 52) in text and str(DEFAULT_MAX_TENSOR_BYTES) in text and ENV in text


def test_the_limit_is_a_load_option_and_an_environment_variable(monkeypatch):
    model = expanded(256)  # 1 KiB
    load(model)
    with pytest.raises(TensorTooLargeError, match="'big'.*1024 bytes.*limit of 1000"):
        load(model, max_tensor_bytes=1000)
    load(model, max_tensor_bytes=1024)
    monkeypatch.setenv(ENV, "1000")
    with pytest.raises(TensorTooLargeError, match="limit of 1000"):
        load(model)
    load(model, max_tensor_bytes=4096)  # the option wins over the environment
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(InvalidArgumentError, match=ENV):
        load(model)
    with pytest.raises(InvalidArgumentError, match="max_tensor_bytes"):
        load(model, max_tensor_bytes=-5)


def test_sizes_that_depend_on_input_shapes_are_checked_at_each_call():
    prog = load(_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["n"])], [("y", F, ["n"])]),
                max_tensor_bytes=64)
    (y,) = prog(np.linspace(-1, 1, 16, dtype=np.float32))  # 64 bytes: allowed
    np.testing.assert_array_equal(y, np.maximum(np.linspace(-1, 1, 16, dtype=np.float32), 0))
    with pytest.raises(TensorTooLargeError, match="68 bytes.*limit of 64"):
        prog(np.ones(17, dtype=np.float32))


# -- external data -----------------------------------------------------------------------------------------
WEIGHTS = np.array([1.5, -2.0, 4.25], dtype=np.float32)


def external_model(location: str, data: bytes | None = None, folder=None, length: int | None = None) -> onnx.ModelProto:
    """y = x + w, with w (3 floats) stored in the external file `location` (written into `folder`)."""
    w = onnx.numpy_helper.from_array(WEIGHTS, "w")
    raw = w.raw_data
    external_data_helper.set_external_data(w, location, offset=0, length=len(raw) if length is None else length)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    if folder is not None:
        (folder / location).write_bytes(raw if data is None else data)
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F, [3])], [("y", F, [3])], [w])


def test_bytes_and_protos_never_read_external_data_from_the_current_directory(tmp_path, monkeypatch):
    model = external_model("weights.bin", folder=tmp_path)
    monkeypatch.chdir(tmp_path)
    for given in (model, model.SerializeToString()):
        with pytest.raises(ExternalDataError, match="(?s)'w'.*base_dir"):
            load(given)


def test_a_named_folder_is_read(tmp_path):
    model = external_model("weights.bin", folder=tmp_path)
    prog = load(model.SerializeToString(), base_dir=tmp_path)
    np.testing.assert_array_equal(next(iter(prog.weights.values())), WEIGHTS)


def test_locations_outside_the_folder_are_refused(tmp_path):
    inside = tmp_path / "model"
    inside.mkdir()
    (tmp_path / "secret.bin").write_bytes(WEIGHTS.tobytes())
    os.symlink(tmp_path / "secret.bin", inside / "link.bin")
    for location in ("../secret.bin", str(tmp_path / "secret.bin"), "link.bin"):
        with pytest.raises(ExternalDataError, match="'w'"):
            load(external_model(location), base_dir=inside)
    path = inside / "model.onnx"
    onnx.save(external_model("link.bin"), str(path))
    with pytest.raises(ExternalDataError, match="outside"):
        load(str(path))


def test_external_data_must_hold_exactly_the_tensor(tmp_path):
    with pytest.raises(ExternalDataError, match="needs 12 bytes.*holds 8"):
        load(external_model("short.bin", data=WEIGHTS.tobytes()[:8], folder=tmp_path, length=8), base_dir=tmp_path)
    with pytest.raises(ExternalDataError, match="after the end"):
        load(external_model("short.bin", data=WEIGHTS.tobytes()[:8], folder=tmp_path), base_dir=tmp_path)


def test_a_huge_external_tensor_is_refused_before_it_is_read(tmp_path):
    model = external_model("weights.bin", folder=tmp_path)
    w = model.graph.initializer[0]
    del w.dims[:]
    w.dims.extend([1 << 40])
    for entry in w.external_data:
        if entry.key == "length":
            entry.value = str(4 << 40)
    with pytest.raises(TensorTooLargeError, match="stored tensor 'w'"):
        load(model, base_dir=tmp_path)


# -- constant folding -------------------------------------------------------------------------------------------
def _constant_of_shape(elements: int) -> onnx.ModelProto:
    shape = helper.make_tensor("shape", I64, [1], [elements])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill",
                              value=helper.make_tensor("v", F, [1], [1.0])),
             helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)]
    return _model(nodes, [], [("y", F, [])], [shape])


def test_folding_never_materializes_a_large_constant():
    """Constant folding asks shape inference for the size first: a 64 MiB constant is left to the lowering
    (a map filling an array at run time), never built while lowering."""
    import tracemalloc

    from gradflow.frontend.onnx import OnnxModel, default_table, lower_model

    model = _constant_of_shape(1 << 24)
    tracemalloc.start()
    try:
        lower_model(OnnxModel(model.SerializeToString(), 18), default_table())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"lowering allocated {peak} bytes"


def test_a_constant_over_the_limit_is_refused_by_the_lowering():
    from gradflow.frontend.onnx import OnnxModel, default_table, lower_model

    with pytest.raises(TensorTooLargeError, match="'fill'"):
        lower_model(OnnxModel(_constant_of_shape(1 << 40).SerializeToString(), 18), default_table())


def test_a_failing_folder_is_a_bug_not_a_silent_fallback(monkeypatch):
    """Folding catches only what an invalid node raises; any other exception surfaces with its cause."""
    from gradflow.core.errors import PassError
    from gradflow.frontend.onnx import fold

    def broken(node, values):
        raise RuntimeError("a bug in a folder")

    monkeypatch.setitem(fold.SYMBOLIC, "Concat", broken)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Concat", ["s"], ["ss"], axis=0),
             helper.make_node("Reshape", ["x", "ss"], ["y"])]
    model = _model(nodes, [("x", F, ["n", 1])], [("y", F, ["n", 1])])
    with pytest.raises(PassError) as info:
        load(model)
    assert isinstance(info.value.__cause__, RuntimeError)
