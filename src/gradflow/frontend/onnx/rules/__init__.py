"""The built-in lowering rules: `MODULES` is the one list the built-in table is collected from."""

from gradflow.frontend.onnx.rules import elementwise, linalg, nn, recurrent, reduce, resize, sequence, tensor

#: Modules whose `@onnx_rule` functions form the built-in lowering table, in this order.
MODULES = (elementwise, linalg, nn, recurrent, reduce, resize, sequence, tensor)
