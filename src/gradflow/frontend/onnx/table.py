"""The ONNX lowering rule table's vocabulary: `Node`, the verb `onnx_rule`, rule selection by opset.

A rule is `fn(lw: Lowering, node: Node) -> None`: it reads its inputs from `lw`, builds the op's dataflow
into new states of the SDFG under construction and records its outputs. `applies(node)` may check the
opset or attributes; the highest-priority applicable rule wins (see `gradflow.core.rule_table`).
The rule modules import this one; the built-in table itself is collected where they are listed
(`gradflow.frontend.onnx.rules.default_table`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable, Mapping

import attrs
import numpy as np
import onnx
from onnx import helper, numpy_helper

from gradflow.core.rule_table import Rule, RuleTable, rule_verb

#: The name of the ONNX lowering table.
TABLE = "onnx_lowering"

#: The newest ai.onnx opset the built-in rules were checked against (every op's changes up to it are
#: handled, and ONNX 1.23's node tests pass). A model with a newer opset is refused until a rule says
#: otherwise: a later opset may change what an op means.
LATEST_OPSET = 28


def widened(value: float) -> float:
    """The double an ONNX float attribute most likely came from.

    ONNX stores FLOAT attributes in single precision: an exporter writing `LeakyReLU(0.1)` of a float64
    model stores 0.100000001490116..., and a float64 program built from that slope differs from the model
    by 1.5e-9 relative (`HardSigmoid`'s 1/6, `Elu`'s alpha and the epsilons of the normalizations alike).
    Of the doubles that round to the stored single, this takes the shortest decimal (0.1, 1e-05) and, when
    that needs seven or more digits, a fraction with a denominator up to 100 if one rounds to it (1/6): never
    further from the stored value than single precision's rounding, and for float32 programs the same single.
    """
    single = np.float32(value)
    if not np.isfinite(single) or single == 0:
        return float(value)
    text = np.format_float_positional(single, unique=True, trim="-") if 1e-4 <= abs(single) < 1e6 else \
        np.format_float_scientific(single, unique=True, trim="-")
    decimal = float(text)
    if len(text.lstrip("-0.").split("e")[0].replace(".", "")) >= 7:
        fraction = Fraction(decimal).limit_denominator(100)
        if np.float32(float(fraction)) == single:
            return float(fraction)
    return decimal


def _attr_value(a: onnx.AttributeProto) -> Any:
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == onnx.AttributeProto.FLOAT:
        return widened(a.f)
    if a.type == onnx.AttributeProto.FLOATS:
        return [widened(f) for f in a.floats]
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


#: gradflow's own ONNX domain, and the ops a model may use from it: `StopGradient` (x, with no gradient:
#: torch's detach, which ONNX lacks; `gradflow.torch` exports a model's detaches as it)
GRADFLOW_DOMAIN = "gradflow"
GRADFLOW_OPS = frozenset({(GRADFLOW_DOMAIN, "StopGradient")})


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

    @property
    def where(self) -> str:
        """The node as error messages name it: "ONNX node '<name>' (<op>)"."""
        return f"ONNX node '{self.name or self.label}' ({self.op_type})"


_verb = rule_verb(TABLE)


def onnx_rule(*op_types: str, priority: int = 0, applies: Callable[[Node], bool] | None = None,
              opsets: tuple[int, int] = (1, LATEST_OPSET), **meta: Any):
    """The registration verb of the lowering table: mark `fn(lw, node)` as the rule of each op type.

    `opsets = (first, last)`: the model opsets the rule implements the op's semantics for (inclusive); a
    node of a model outside every rule's range is an `UnsupportedOpsetError`. Marking registers nothing:
    the built-in table (`gradflow.frontend.onnx.rules.default_table()`) is collected from the rule modules
    listed in `gradflow.frontend.onnx.rules.MODULES`; a user's own rules go into a table value
    (`default_table() + RuleTable(...)`) handed to `OnnxLower(table=...)` or `load(..., table=...)`. Rule
    names are `<function>[<op>]`.
    """
    first, last = opsets
    if not 1 <= first <= last:
        raise ValueError(f"opsets must be (first, last) with 1 <= first <= last, got {opsets!r}")

    def deco(fn):
        names = {} if len(op_types) > 1 else {"name": f"{fn.__name__}[{op_types[0]}]"}
        return _verb(*op_types, priority=priority, applies=applies, opsets=(int(first), int(last)), **names,
                     **meta)(fn)

    return deco


def opset_range(rule: Rule) -> tuple[int, int]:
    """The (first, last) model opsets a lowering rule covers (every opset for a rule made without the verb)."""
    first, last = rule.meta.get("opsets", (1, 1 << 30))
    return int(first), int(last)


def select_rule(table: RuleTable, node: Node) -> tuple[Rule | None, list[Rule]]:
    """The best rule whose opset range holds the node's opset and that applies to it, and the op's rules
    (best first) for the message when there is none."""
    candidates = table.candidates(node.op_type)
    for rule in candidates:
        first, last = opset_range(rule)
        if first <= node.opset <= last and rule.applies(node):
            return rule, candidates
    return None, candidates


def as_int_list(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]
