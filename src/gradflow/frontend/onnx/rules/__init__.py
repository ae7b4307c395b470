"""The built-in lowering rules; importing this package registers them in `ONNX_RULES`."""

from gradflow.frontend.onnx.rules import elementwise, linalg, nn, reduce, resize, tensor  # noqa: F401
