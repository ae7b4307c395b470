"""Tensors stored outside the model file ("external data"), read only from a folder the caller chose.

A path given model reads its external data from the model's own folder. A model given as bytes or as a
`ModelProto` has no folder: resolving its locations against the current directory would let a model read
any file there, so it is refused unless the caller names one (`load(..., base_dir=...)`). Either way each
location must be a relative path that stays inside the folder (symbolic links resolved), name a regular
file, and hold exactly the bytes the tensor's shape and type need; only then is it read.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import onnx
from onnx import external_data_helper, helper

from gradflow.frontend.onnx.errors import ExternalDataError

#: Element types stored several to a byte (their raw size is not dims x itemsize).
_PACKED = frozenset({"INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1"})

_HINT = "keep external data files next to the model, or pass base_dir= naming the folder that holds them"


def tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph: initializers and tensor attributes, in subgraphs too."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from tensors(attr.g)
            for sub in attr.graphs:
                yield from tensors(sub)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]


def load_into(model: onnx.ModelProto, base_dir: str | os.PathLike | None, origin: str) -> None:
    """Read every external tensor of `model` (in place) from `base_dir`, confined to it; `origin` says how
    the model was given, for messages. Raises `ExternalDataError`."""
    external = external_tensors(model)
    if not external:
        return
    if base_dir is None:
        raise ExternalDataError(
            f"the model ({origin}) stores tensor '{external[0].name}' in an external file, and no folder was named "
            "to read it from (gradflow never reads it relative to the current directory)",
            "pass base_dir= (the folder holding the external data) to gradflow.onnx.load")
    root = os.path.realpath(os.fspath(base_dir))
    if not os.path.isdir(root):
        raise ExternalDataError(f"base_dir '{base_dir}' is not a folder", _HINT)
    for tensor in external:
        _check_location(tensor, root)
        try:
            external_data_helper.load_external_data_for_tensor(tensor, root)
        except (OSError, ValueError) as exc:
            raise ExternalDataError(f"cannot read the external data of tensor '{tensor.name}': {exc}", _HINT) from None


def _check_location(tensor: onnx.TensorProto, root: str) -> None:
    try:
        info = external_data_helper.ExternalDataInfo(tensor)
    except ValueError as exc:
        raise ExternalDataError(f"tensor '{tensor.name}': {exc}", _HINT) from None
    location = info.location
    parts = location.replace("\\", "/").split("/")
    if not location or os.path.isabs(location) or ".." in parts or "\x00" in location:
        raise ExternalDataError(
            f"tensor '{tensor.name}' names external data at '{location}', which is not a relative path inside the "
            "model's folder", _HINT)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        raise ExternalDataError(f"external data '{location}' of tensor '{tensor.name}' resolves outside the folder "
                                f"'{root}'", _HINT)
    if not os.path.isfile(path):
        raise ExternalDataError(f"external data '{location}' of tensor '{tensor.name}' is not a regular file in "
                                f"'{root}'", _HINT)
    want = _nbytes(tensor)
    size = os.path.getsize(path)
    offset = info.offset or 0
    length = info.length if info.length is not None else size - offset
    if want is not None and length != want:
        raise ExternalDataError(f"tensor '{tensor.name}' of shape {list(tensor.dims)} needs {want} bytes, its "
                                f"external data holds {length}", _HINT)
    if offset + length > size:
        raise ExternalDataError(f"external data of tensor '{tensor.name}' ends at byte {offset + length}, after the "
                                f"end of '{location}' ({size} bytes)", _HINT)


def _nbytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of a tensor's raw data from its dims and element type (None for types without a fixed size)."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    if tensor.data_type == onnx.TensorProto.STRING or onnx.TensorProto.DataType.Name(tensor.data_type) in _PACKED:
        return None
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize
