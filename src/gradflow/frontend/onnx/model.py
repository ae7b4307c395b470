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
from onnx import numpy_helper

from gradflow.frontend.onnx.errors import MalformedModelError


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


def read_model(model: Any) -> OnnxModel:
    """Path, bytes or `ModelProto` -> checked, shape-inferred `OnnxModel`; errors are `MalformedModelError`."""
    try:
        if isinstance(model, onnx.ModelProto):
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
        elif isinstance(model, (bytes, bytearray, memoryview)):
            proto = onnx.load_from_string(bytes(model))
        elif isinstance(model, (str, os.PathLike)):
            proto = onnx.load(os.fspath(model))
        else:
            raise MalformedModelError(
                f"cannot load an ONNX model from a {type(model).__name__}",
                "pass a file path, the serialized bytes, or an onnx.ModelProto",
            )
    except MalformedModelError:
        raise
    except Exception as exc:  # protobuf DecodeError, OSError, ...
        raise MalformedModelError(f"cannot read the ONNX model: {type(exc).__name__}: {exc}") from None
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise MalformedModelError(f"onnx.checker rejected the model: {exc}", "fix or re-export the model") from None
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False, data_prop=True)
    except Exception as exc:  # InferenceError / ValidationError
        raise MalformedModelError(f"ONNX shape inference failed: {exc}", "fix or re-export the model") from None
    return OnnxModel(inferred.SerializeToString(), default_opset(inferred))
