"""Typed errors of the ONNX frontend (all `GradflowError`s, frozen records, raised unchanged at the edge)."""

from __future__ import annotations

import attrs

from gradflow.core.errors import ArgumentError, GradflowError, InvalidArgumentError, ResourceLimitError


@attrs.frozen(eq=False)
class OnnxError(GradflowError):
    """Base of the frontend's errors, so callers can catch "anything the ONNX frontend rejected"."""


@attrs.frozen(eq=False)
class MalformedModelError(OnnxError, InvalidArgumentError):
    """The model cannot be read or `onnx.checker` rejects it; the message carries the checker's text."""


@attrs.frozen(eq=False)
class InvalidNodeError(MalformedModelError):
    """A node breaks its ONNX specification (an axis out of range, a zero stride, an unknown enum value, k
    larger than the axis, ...), which onnxruntime rejects too; names the op, node, opset and attribute."""

    @classmethod
    def build(cls, op_type: str, node: str, opset: int, why: str) -> "InvalidNodeError":
        return cls(f"invalid ONNX node '{node}' ({op_type}, opset {opset}): {why}",
                   "fix the model; see the operator's specification at https://onnx.ai/onnx/operators/")


@attrs.frozen(eq=False)
class ExternalDataError(MalformedModelError):
    """A tensor stored outside the model file cannot be read safely: no base folder was named for a model
    given as bytes or `ModelProto`, or its location leaves that folder, or the file does not hold it."""


@attrs.frozen(eq=False)
class TensorTooLargeError(OnnxError, ResourceLimitError):
    """A tensor of the model needs more memory than the limit (`gradflow.frontend.onnx.limits`)."""


@attrs.frozen(eq=False)
class UnsupportedOpError(OnnxError):
    """No lowering rule applies to a node: names the op type, the node, its domain and opset version."""

    @classmethod
    def build(cls, op_type: str, node: str, domain: str, opset: int, why: str = "",
              hint: str = "see docs/onnx.md for the covered ops; register a rule with gradflow.frontend.onnx.onnx_rule",
              ) -> "UnsupportedOpError":
        dom = domain or "ai.onnx"
        text = f"unsupported ONNX op '{op_type}' (domain '{dom}', opset {opset}) at node '{node}'"
        if why:
            text += f": {why}"
        return cls(text, hint)


@attrs.frozen(eq=False)
class UnsupportedTypeError(UnsupportedOpError):
    """A value whose type gradflow cannot represent: element types without a C++ type in DaCe (float8,
    float4, 2-/4-bit integers, strings, complex) and non-tensor values (sequences, optionals, maps).
    `type_name` is the ONNX name of the type (e.g. 'FLOAT8E4M3FN', 'sequence')."""

    type_name: str = ""

    def at_node(self, op_type: str, node: str, domain: str, opset: int) -> "UnsupportedTypeError":
        """The same error, its message prefixed with the node that met the type."""
        where = f"ONNX op '{op_type}' (domain '{domain or 'ai.onnx'}', opset {opset}) at node '{node}'"
        return UnsupportedTypeError(f"{where}: {self.message}", self.hint, self.type_name)


@attrs.frozen(eq=False)
class DynamicShapeError(UnsupportedOpError):
    """A value that decides a shape (Reshape's shape, Slice's starts, ...) is computed at run time."""


@attrs.frozen(eq=False)
class InputMismatchError(OnnxError, ArgumentError):
    """An argument at call time has the wrong dtype, rank or shape for the model's input."""


@attrs.frozen(eq=False)
class UnsupportedOpsetError(UnsupportedOpError):
    """The model's opset is outside the range of opsets the op's lowering rule was written for."""
