"""The ONNX frontend: load, check, shape-infer and lower ONNX models to SDFGs (see docs/onnx.md).

`load(model)` returns an `OnnxProgram`: callable with numpy arrays / torch tensors, exposing the lowered
SDFG as `.graph` (a frozen `gradflow.core.Graph`) and `.sdfg` (a copy). The lowering is the registered
pure pass `onnx_lower`; its per-op rules are the table
`default_table()` (write more with `onnx_rule` and pass `default_table() + mine` as `table=`).
"""

from gradflow.core.errors import IndexOutOfRangeError
from gradflow.frontend.onnx.errors import (
    DynamicShapeError,
    ExternalDataError,
    InputMismatchError,
    InvalidNodeError,
    MalformedModelError,
    OnnxError,
    TensorTooLargeError,
    UnsupportedOpError,
    UnsupportedOpsetError,
    UnsupportedTypeError,
)
from gradflow.frontend.onnx.lower import OnnxLower, Signature, lower_model, model_graph
from gradflow.frontend.onnx.model import OnnxModel, read_model
from gradflow.frontend.onnx.program import OnnxProgram, load
from gradflow.frontend.onnx.rules import default_table
from gradflow.frontend.onnx.table import Node, onnx_rule

__all__ = [
    "load", "OnnxProgram", "OnnxModel", "read_model", "OnnxLower", "Signature", "lower_model", "model_graph",
    "Node", "default_table", "onnx_rule", "OnnxError", "MalformedModelError", "UnsupportedOpError",
    "UnsupportedTypeError", "DynamicShapeError", "InputMismatchError", "InvalidNodeError", "UnsupportedOpsetError",
    "ExternalDataError", "TensorTooLargeError", "IndexOutOfRangeError",
]
