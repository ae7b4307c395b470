"""The ONNX frontend: load, check, shape-infer and lower ONNX models to SDFGs (see docs/onnx.md).

`load(model)` returns an `OnnxProgram`: callable with numpy arrays / torch tensors, exposing the lowered
SDFG as `.graph` (a frozen `gradflow.core.Graph`) and `.sdfg` (a copy). The lowering is the registered
pure pass `onnx_lower`; its per-op rules live in `ONNX_RULES` (register more with `onnx_rule`).
"""

from gradflow.frontend.onnx.errors import (
    DynamicShapeError, InputMismatchError, MalformedModelError, OnnxError, UnsupportedOpError, UnsupportedTypeError,
)
from gradflow.frontend.onnx.lower import OnnxLower, Signature, lower_model, model_graph
from gradflow.frontend.onnx.model import OnnxModel, read_model
from gradflow.frontend.onnx.program import OnnxProgram, load
from gradflow.frontend.onnx.table import ONNX_RULES, Node, default_table, onnx_rule

__all__ = [
    "load", "OnnxProgram", "OnnxModel", "read_model", "OnnxLower", "Signature", "lower_model", "model_graph",
    "ONNX_RULES", "Node", "default_table", "onnx_rule", "OnnxError", "MalformedModelError", "UnsupportedOpError",
    "UnsupportedTypeError", "DynamicShapeError", "InputMismatchError",
]
