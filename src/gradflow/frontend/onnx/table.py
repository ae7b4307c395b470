"""The ONNX lowering rule table: one rule per op type.

A rule is `fn(lw: Lowering, node: Node) -> None`: it reads its inputs from `lw`, builds the op's dataflow
into new states of the SDFG under construction and records its outputs. `applies(node)` may check the
opset or attributes; the highest-priority applicable rule wins (see `gradflow.core.rule_table`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import attrs
import numpy as np
import onnx
from onnx import helper, numpy_helper

from gradflow.core.rule_table import RuleTable, collect, rule_verb

#: The name of the ONNX lowering table.
TABLE = "onnx_lowering"


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


_verb = rule_verb(TABLE)


def onnx_rule(*op_types: str, priority: int = 0, applies: Callable[[Node], bool] | None = None, **meta: Any):
    """The registration verb of the lowering table: mark `fn(lw, node)` as the rule of each op type.

    Marking registers nothing: the built-in table is collected from the rule modules listed in
    `gradflow.frontend.onnx.rules.MODULES`; a user's own rules go into a table value
    (`default_table() + RuleTable(...)`) handed to `OnnxLower(table=...)` or `load(..., table=...)`.
    Rule names are `<function>[<op>]`.
    """

    def deco(fn):
        names = {} if len(op_types) > 1 else {"name": f"{fn.__name__}[{op_types[0]}]"}
        return _verb(*op_types, priority=priority, applies=applies, **names, **meta)(fn)

    return deco


@functools.cache
def default_table() -> RuleTable:
    """The built-in lowering rules, collected from the rule modules (one value per process)."""
    from gradflow.frontend.onnx.rules import MODULES

    return collect(TABLE, MODULES)


def as_int_list(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]
