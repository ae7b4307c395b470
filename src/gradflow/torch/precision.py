"""Undo the float32 detours torch's TorchScript exporter writes into float64 models.

Arithmetic between a 0-dim float64 tensor and a Python number (`h.sum() * 0.5`, `loss / n + 1e-3`) is
float64 in eager torch, but the exporter's scalar type analysis writes it as `Cast(to=float)`, the
arithmetic with float32 constants, and `Cast(to=double)`: the model would be only float32-accurate
(relative error ~1e-8), silently. `undo_scalar_downcasts` finds each such detour (a Cast of a float64
scalar to float32 whose float32 values reach only elementwise arithmetic with float32 Constants and Casts
back to float64) and computes it in float64: the first Cast keeps float64, and each float32 constant
becomes the float64 number with the shortest decimal form that rounds to it (the literal a user writes:
0.1f becomes 0.1). A detour without a constant (`x.float().double()`, a rounding the model asks for) is
kept, and so is one whose float32 values go anywhere else.

`float32_scales` mends the opposite: an input ONNX allows in float32 only that a float64 model's export
wrote in float64 (Resize's scales when float64 is torch's default dtype).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: elementwise arithmetic that computes in whatever float type its inputs have
_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Sqrt", "Reciprocal", "Abs"})


def _widened(proto: TensorProto) -> np.ndarray:
    """A float32 constant as the float64 numbers with the shortest decimal forms that round to its elements."""
    values = numpy_helper.to_array(proto)
    return np.array([float(str(np.float32(v))) for v in values.reshape(-1)], dtype=np.float64).reshape(values.shape)


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _detour(start: onnx.NodeProto, consumers: dict, constants: dict, outputs: set) -> tuple[list, set] | None:
    """The arithmetic nodes and the float32 constants they read, from `start` (a Cast to float32) to the
    Casts back to float64; None when a float32 value reaches anything else or no constant is read."""
    values, nodes, used, work = {start.output[0]}, [], set(), [start.output[0]]
    while work:
        value = work.pop()
        if value in outputs:
            return None
        for node in consumers.get(value, ()):
            if _cast_to(node) == TensorProto.DOUBLE or node in nodes:
                continue
            if node.op_type not in _ARITHMETIC:
                return None
            for name in node.input:
                if name not in values and name not in constants:
                    return None
                if name in constants:
                    used.add(name)
            nodes.append(node)
            for out in node.output:
                values.add(out)
                work.append(out)
    return (nodes, used) if used else None


def undo_scalar_downcasts(model: onnx.ModelProto) -> int:
    """Compute the exporter's float32 detours of float64 scalars in float64 (edits `model`, which the
    caller created); returns how many were undone."""
    graph = model.graph
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type for vi in [*inferred.graph.value_info, *inferred.graph.input,
                                                     *inferred.graph.output]}
    constants = {n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant"
                 and len(n.attribute) == 1 and n.attribute[0].name == "value"
                 and n.attribute[0].t.data_type == TensorProto.FLOAT}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    undone, widened = 0, {}
    for node in list(graph.node):
        source = types.get(node.input[0]) if node.input else None
        if (_cast_to(node) != TensorProto.FLOAT or source is None or source.elem_type != TensorProto.DOUBLE
                or len(source.shape.dim) != 0):
            continue
        found = _detour(node, consumers, constants, outputs)
        if found is None:
            continue
        nodes, used = found
        for name in used:
            if name not in widened:
                widened[name] = f"{name}_float64"
                graph.node.insert(0, helper.make_node("Constant", [], [widened[name]], value=numpy_helper.from_array(
                    _widened(constants[name]), widened[name])))
        for n in nodes:
            n.input[:] = [widened.get(name, name) for name in n.input]
        for a in node.attribute:
            if a.name == "to":
                a.i = TensorProto.DOUBLE
        stale = {out for n in [node, *nodes] for out in n.output}
        kept = [vi for vi in graph.value_info if vi.name not in stale]
        del graph.value_info[:]
        graph.value_info.extend(kept)
        undone += 1
    return undone


#: inputs ONNX requires in float32 whatever the model's float type: Resize's `scales` (input 2)
_FLOAT32_INPUTS = {"Resize": (2,)}


def float32_scales(model: onnx.ModelProto) -> int:
    """Cast to float32 the inputs ONNX types as float32 only that the exporter wrote in float64 (edits
    `model`); returns how many. With float64 as torch's default dtype, `F.interpolate(x, scale_factor=2)`
    is exported with float64 `scales`, which ONNX's type check refuses (the model would not load). The
    scales are what float32 makes of them, as in any valid ONNX model (2.0 stays 2.0)."""
    graph = model.graph
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.input,
                                                               *inferred.graph.output]}
    types.update({n.output[0]: n.attribute[0].t.data_type for n in graph.node if n.op_type == "Constant"
                  and len(n.attribute) == 1 and n.attribute[0].name == "value"})
    cast = 0
    for position, node in enumerate(list(graph.node)):
        for k in _FLOAT32_INPUTS.get(node.op_type, ()):
            if k < len(node.input) and node.input[k] and types.get(node.input[k]) == TensorProto.DOUBLE:
                name = f"{node.input[k]}_float32_{cast}"
                graph.node.insert(position + cast, helper.make_node("Cast", [node.input[k]], [name],
                                                                    to=TensorProto.FLOAT))
                node.input[k] = name
                cast += 1
    return cast
