"""Reading a model: load, check, infer shapes, and freeze it into a value the lowering pass consumes.

`OnnxModel` holds the serialized (checked, shape-inferred) model, never a mutable `ModelProto`, so a
`Graph` carrying it in `meta["onnx_model"]` stays a value: `proto()` hands out a fresh parse each time.
`bound_inputs` are graph inputs fixed to concrete values (a specialisation used when an input decides
a shape, e.g. the `shape` input of a Reshape in ONNX's node tests).
"""

from __future__ import annotations

import functools
import os
from types import MappingProxyType
from typing import Any, Mapping

import attrs
import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from gradflow.frontend.onnx import external, limits
from gradflow.frontend.onnx.builder import InvalidNode
from gradflow.frontend.onnx.errors import InvalidNodeError, MalformedModelError
from gradflow.frontend.onnx.spec import check_attributes
from gradflow.frontend.onnx.table import Node


def _frozen_arrays(values: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    out = {}
    for k, v in values.items():
        a = np.array(v, copy=True)
        a.flags.writeable = False
        out[k] = a
    return MappingProxyType(out)


@functools.lru_cache(maxsize=64)
def _parse(data: bytes) -> onnx.ModelProto:
    return onnx.load_from_string(data)


@attrs.frozen(eq=False)
class OnnxModel:
    """A checked, shape-inferred ONNX model as an immutable value."""

    data: bytes = attrs.field(repr=False)
    opset: int
    bound_inputs: Mapping[str, np.ndarray] = attrs.field(factory=dict, converter=_frozen_arrays, repr=False)

    def proto(self) -> onnx.ModelProto:
        """A private copy of the model to read (callers may not mutate the cached parse)."""
        copy = onnx.ModelProto()
        copy.CopyFrom(_parse(self.data))
        return copy

    def graph(self) -> onnx.GraphProto:
        return _parse(self.data).graph

    def bind(self, values: Mapping[str, np.ndarray]) -> "OnnxModel":
        """The same model with some graph inputs fixed to values (they stop being call arguments)."""
        return OnnxModel(self.data, self.opset, {**self.bound_inputs, **values})

    def initializer_values(self) -> dict[str, np.ndarray]:
        return {t.name: numpy_helper.to_array(t) for t in self.graph().initializer}


def default_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def read_model(model: Any, *, base_dir: str | os.PathLike | None = None,
               max_tensor_bytes: int | None = None) -> OnnxModel:
    """Path, bytes or `ModelProto` -> checked, shape-inferred `OnnxModel`.

    Every declared tensor size is checked against the memory limit (`limits`) before anything is read or
    allocated, external data is read only from the model's folder (`base_dir` for bytes / `ModelProto`,
    see `external`). Errors: `MalformedModelError` and its subclasses, `TensorTooLargeError`.
    """
    limit = limits.max_tensor_bytes(max_tensor_bytes)
    proto, origin, folder = _parse_input(model)
    folder = os.fspath(base_dir) if base_dir is not None else folder
    _check_declared(proto, limit)
    external.load_into(proto, folder, origin)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise MalformedModelError(f"onnx.checker rejected the model: {exc}", "fix or re-export the model") from None
    _check_attributes(proto.graph, default_opset(proto))
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise MalformedModelError(_declared_type_conflict(proto) or f"ONNX shape inference failed: {exc}",
                                  "fix or re-export the model") from None
    _check_declared(inferred, limit)
    return OnnxModel(inferred.SerializeToString(), default_opset(inferred))


def _parse_input(model: Any) -> tuple[onnx.ModelProto, str, str | None]:
    """The model as a private `ModelProto` (external data not read yet), how it was given, and its folder."""
    try:
        if isinstance(model, onnx.ModelProto):
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
            return proto, "given as an onnx.ModelProto", None
        if isinstance(model, (bytes, bytearray, memoryview)):
            return onnx.load_from_string(bytes(model)), "given as bytes", None
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            proto = onnx.load(path, load_external_data=False)
            return proto, f"file '{path}'", os.path.dirname(os.path.abspath(path))
    except (OSError, ValueError, DecodeError) as exc:
        raise MalformedModelError(f"cannot read the ONNX model: {type(exc).__name__}: {exc}") from None
    raise MalformedModelError(
        f"cannot load an ONNX model from a {type(model).__name__}",
        "pass a file path, the serialized bytes, or an onnx.ModelProto",
    )


def _check_attributes(graph: onnx.GraphProto, opset: int) -> None:
    """Every node's attribute values against the specification (`spec`), subgraphs included, before shape
    inference sees them."""
    for k, proto in enumerate(graph.node):
        if proto.domain not in ("", "ai.onnx"):
            continue
        where = proto.name or f"#{k} (unnamed)"
        node = Node.of(proto, where, opset)
        try:
            check_attributes(node)
        except InvalidNode as exc:
            raise InvalidNodeError.build(proto.op_type, where, opset, str(exc)) from None
        for attr in proto.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _check_attributes(sub, opset)


def _check_declared(proto: onnx.ModelProto, limit: int) -> None:
    """Each tensor the model declares with a static shape (graph inputs, outputs, intermediates, initializers,
    constants) against the memory limit, before anything of that size exists."""
    graph = proto.graph
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type" or not tt.HasField("shape"):
            continue
        dims = [d.dim_value for d in tt.shape.dim]
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            limits.check_static(dims, _itemsize(tt.elem_type), f"tensor '{vi.name}'", limit)
    for tensor in external.tensors(graph):
        limits.check_static(list(tensor.dims), _itemsize(tensor.data_type), f"stored tensor '{tensor.name}'", limit)


def _itemsize(elem_type: int) -> np.dtype:
    """A dtype of the element type's size, for the memory estimate (1 byte when it has no numpy type)."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return np.dtype(np.uint8)


def _declared_type_conflict(proto: onnx.ModelProto) -> str:
    """When strict inference failed: the first value whose declared element type (a graph output or a
    value_info) differs from the one its node computes, by name and both types; '' when none does."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_declared_types(proto))
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return ""
    computed = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for what, vi in [("graph output", vi) for vi in proto.graph.output] + \
            [("value", vi) for vi in proto.graph.value_info]:
        declared, got = vi.type.tensor_type.elem_type, computed.get(vi.name, 0)
        if declared and got and declared != got:
            name = onnx.TensorProto.DataType.Name
            return (f"{what} '{vi.name}' is declared {name(declared).lower()}, but its node computes "
                    f"{name(got).lower()}")
    return ""


def _without_declared_types(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose outputs and value_infos carry no types, so inference says what the nodes compute."""
    bare = onnx.ModelProto()
    bare.CopyFrom(proto)
    del bare.graph.value_info[:]
    outputs = [onnx.helper.make_empty_tensor_value_info(o.name) for o in bare.graph.output]
    del bare.graph.output[:]
    bare.graph.output.extend(outputs)
    return bare
