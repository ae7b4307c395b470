"""`gradflow.onnx`: the public face of the ONNX frontend (implementation: `gradflow.frontend.onnx`).

```python
import gradflow.onnx
prog = gradflow.onnx.load("model.onnx")   # path, bytes or onnx.ModelProto
(y,) = prog(x)                            # numpy arrays or torch tensors, outputs in ONNX order
prog.graph                                # the lowered SDFG as a frozen gradflow.Graph, for grad / vjp
```

Importing `gradflow` imports this module, so the `onnx_lower` pass is always registered
(`gradflow.Pipeline.named("onnx_lower", ...)`) and the rule modules are loaded (the pass's default table,
`default_table()`, is collected from them on first use).
See docs/onnx.md.
"""

from gradflow.frontend.onnx import (
    DynamicShapeError,
    ExternalDataError,
    IndexOutOfRangeError,
    InputMismatchError,
    InvalidNodeError,
    MalformedModelError,
    Node,
    OnnxError,
    OnnxLower,
    OnnxModel,
    OnnxProgram,
    Signature,
    TensorTooLargeError,
    UnsupportedOpError,
    UnsupportedOpsetError,
    UnsupportedTypeError,
    default_table,
    load,
    model_graph,
    onnx_rule,
    read_model,
)

__all__ = [
    "load", "OnnxProgram", "OnnxModel", "read_model", "OnnxLower", "Signature", "model_graph",
    "Node", "default_table", "onnx_rule", "OnnxError", "MalformedModelError", "UnsupportedOpError",
    "UnsupportedTypeError", "DynamicShapeError", "InputMismatchError", "InvalidNodeError", "UnsupportedOpsetError",
    "ExternalDataError", "TensorTooLargeError", "IndexOutOfRangeError",
]
