"""What the ONNX specification allows an op's attributes to be, checked for every node before it is lowered.

`onnx.checker` checks attribute names and types but not their values, and the operator schemas in
`onnx.defs` state the allowed values only in prose. So the values are declared here, per op and attribute:
the strings of an enumeration (`auto_pad`, Gelu's `approximate`, ...), the 0/1 of a flag, or a lower bound
for integers and lists of integers (strides > 0, pads >= 0). A value outside is an `InvalidNode` naming the
attribute, the value and what is allowed, never a silent fall-back to a default. Constraints that need the
input shapes (an axis against the rank, the length of `kernel_shape`) are checked by the rules.
`tests/reliability/test_onnx_validation.py` checks every entry against the schemas in `onnx.defs`.

`load` checks every node's attributes *before* ONNX shape inference runs, which also protects inference
from values it mishandles (it loops forever on the Einsum equation 'i.i').
"""

from __future__ import annotations

import functools
import re
from types import MappingProxyType
from typing import Any, Mapping

import attrs
import numpy as np
import onnx.defs

from gradflow.frontend.onnx.builder import InvalidNode


@attrs.frozen
class Choice:
    """The attribute must be one of `values`; `opsets` limits some of them to the opsets (first, last)
    where the specification has them (Pad's 'wrap' appeared in opset 19)."""

    values: tuple[Any, ...]
    opsets: Mapping[Any, tuple[int, int]] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)))

    def allowed(self, opset: int) -> tuple[Any, ...]:
        return tuple(v for v in self.values if self.opsets.get(v, (1, opset))[0] <= opset <= self.opsets.get(v, (1, opset))[1])

    def problem(self, value: Any, opset: int) -> str | None:
        allowed = self.allowed(opset)
        if value in allowed:
            return None
        return f"must be one of {', '.join(repr(v) for v in allowed)} in opset {opset}"


@attrs.frozen
class AtLeast:
    """The attribute (an integer, or each integer of a list) must be >= `bound`."""

    bound: int

    def problem(self, value: Any, opset: int = 0) -> str | None:
        values = np.asarray(value).reshape(-1)
        if values.dtype.kind not in "iu" and values.size:
            return "must be integers"
        if all(int(v) >= self.bound for v in values):
            return None
        return f"must be >= {self.bound}" + (" (each element)" if np.ndim(value) else "")


@attrs.frozen
class Equation:
    """An Einsum equation: comma-separated terms of letters with at most one '...' each, optionally '->'
    and an output term whose labels occur in the inputs, once each (spaces are ignored)."""

    def problem(self, value: Any, opset: int = 0) -> str | None:
        eq = str(value).replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        terms = lhs.split(",")
        for term in terms + ([rhs] if arrow else []):
            if not _TERM.fullmatch(term):
                return f"has the term {term!r}, which is not letters with at most one '...'"
        if arrow:
            labels = rhs.replace("...", "")
            if len(set(labels)) != len(labels):
                return "repeats a label in its output term"
            if set(labels) - set("".join(terms)):
                return f"has output labels {sorted(set(labels) - set(''.join(terms)))} that no input term has"
            if "..." in rhs and not any("..." in t for t in terms):
                return "has '...' in its output term but in no input term"
        return None


_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")

FLAG = Choice((0, 1))
AUTO_PAD = Choice(("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))
_WINDOW = {"auto_pad": AUTO_PAD, "strides": AtLeast(1), "dilations": AtLeast(1), "kernel_shape": AtLeast(1),
           "pads": AtLeast(0)}
_SCATTER = {"reduction": Choice(("none", "add", "mul", "max", "min"), {"max": (18, 1 << 30), "min": (18, 1 << 30)})}
_REDUCE = {"keepdims": FLAG, "noop_with_empty_axes": FLAG}

#: op type -> attribute -> constraint.
SPEC: Mapping[str, Mapping[str, Choice | AtLeast | Equation]] = MappingProxyType({
    "Conv": {**_WINDOW, "group": AtLeast(1)},
    "ConvTranspose": {**_WINDOW, "group": AtLeast(1), "output_padding": AtLeast(0), "output_shape": AtLeast(0)},
    "MaxPool": {**_WINDOW, "ceil_mode": FLAG, "storage_order": FLAG},
    "AveragePool": {**_WINDOW, "ceil_mode": FLAG, "count_include_pad": FLAG},
    "LpPool": {**_WINDOW, "ceil_mode": FLAG, "p": AtLeast(1)},
    "Gelu": {"approximate": Choice(("none", "tanh"))},
    "Einsum": {"equation": Equation()},
    "Pad": {"mode": Choice(("constant", "reflect", "edge", "wrap"), {"wrap": (19, 1 << 30)})},  # negative pads crop
    "ScatterElements": _SCATTER,
    "ScatterND": _SCATTER,
    "SoftmaxCrossEntropyLoss": {"reduction": Choice(("none", "sum", "mean"))},
    "NegativeLogLikelihoodLoss": {"reduction": Choice(("none", "sum", "mean"))},
    "LSTM": {"direction": Choice(("forward", "reverse", "bidirectional")), "layout": FLAG, "input_forget": FLAG,
             "hidden_size": AtLeast(1)},
    "Resize": {
        "mode": Choice(("nearest", "linear", "cubic")),
        "coordinate_transformation_mode": Choice(
            ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_crop_and_resize", "tf_half_pixel_for_nn"),
            {"half_pixel_symmetric": (19, 1 << 30), "tf_half_pixel_for_nn": (11, 12)}),
        "nearest_mode": Choice(("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")),
        "keep_aspect_ratio_policy": Choice(("stretch", "not_larger", "not_smaller")),
        "antialias": FLAG, "exclude_outside": FLAG,
    },
    "TopK": {"largest": FLAG, "sorted": FLAG, "k": AtLeast(0)},
    "Gemm": {"transA": FLAG, "transB": FLAG},
    "CumSum": {"exclusive": FLAG, "reverse": FLAG},
    "Trilu": {"upper": FLAG},
    "Reshape": {"allowzero": FLAG},
    "Split": {"num_outputs": AtLeast(1), "split": AtLeast(0)},
    "GatherND": {"batch_dims": AtLeast(0)},
    "BatchNormalization": {"training_mode": FLAG},
    "Cast": {"saturate": FLAG},
    **{op: _REDUCE for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                              "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
})


@functools.lru_cache(maxsize=1024)
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The schema of an ai.onnx op at an opset (None when ONNX defines none: the rule decides)."""
    try:
        return onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return None


def check_attributes(node: Any, spec: Mapping[str, Mapping[str, Choice | AtLeast | Equation]] = SPEC) -> None:
    """Raise `InvalidNode` for the first attribute of `node` (a `table.Node`) that its op's schema in
    `onnx.defs` does not define at the node's opset, or whose value is outside its constraint."""
    schema = _schema(node.op_type, node.opset)
    if schema is not None:
        unknown = sorted(set(node.attrs) - set(schema.attributes))
        if unknown:
            raise InvalidNode(f"attribute '{unknown[0]}' is not defined for {node.op_type} in opset {node.opset} "
                              f"(its attributes: {', '.join(sorted(schema.attributes)) or 'none'})")
    for name, rule in spec.get(node.op_type, {}).items():
        if name not in node.attrs:
            continue
        value = node.attrs[name]
        problem = rule.problem(value, node.opset)
        if problem:
            shown = value.tolist() if isinstance(value, np.ndarray) else value
            raise InvalidNode(f"attribute '{name}' = {shown!r} {problem}")
