"""The ONNX lowering rule table: one rule per op type.

A rule is `fn(lw: Lowering, node: Node) -> None`: it reads its inputs from `lw`, builds the op's dataflow
into new states of the SDFG under construction and records its outputs. `applies(node)` may check the
opset or attributes; the highest-priority applicable rule wins (see `gradflow.core.rule_table`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs
import numpy as np
import onnx
from onnx import helper, numpy_helper

from gradflow.core.rule_table import MutableRuleRegistry, RuleTable

ONNX_RULES: MutableRuleRegistry = MutableRuleRegistry("onnx_lowering")


def _attr_value(a: onnx.AttributeProto) -> Any:
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


@attrs.frozen
class Node:
    """A read-only view of one ONNX node: op, generated safe label, inputs/outputs ('' = absent), attributes."""

    op_type: str
    name: str
    label: str
    domain: str
    opset: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]

    @classmethod
    def of(cls, proto: onnx.NodeProto, label: str, opset: int) -> "Node":
        return cls(
            proto.op_type, proto.name, label, proto.domain, opset, tuple(proto.input), tuple(proto.output),
            {a.name: _attr_value(a) for a in proto.attribute},
        )

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def input(self, k: int) -> str:
        """Name of input k, '' when absent."""
        return self.inputs[k] if k < len(self.inputs) else ""

    def output(self, k: int) -> str:
        return self.outputs[k] if k < len(self.outputs) else ""


def onnx_rule(*op_types: str, priority: int = 0, applies: Callable[[Node], bool] | None = None):
    """Register `fn` as the lowering rule of each op type in `op_types`."""

    def deco(fn):
        for op in op_types:
            kw = {"applies": applies} if applies is not None else {}
            ONNX_RULES.register(op, priority=priority, name=f"{fn.__name__}[{op}]", **kw)(fn)
        return fn

    return deco


def default_table() -> RuleTable:
    """The built-in rules (importing the rules package fills the registry)."""
    import gradflow.frontend.onnx.rules  # noqa: F401

    return ONNX_RULES.table


def as_int_list(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]
