"""Evaluation at lowering time of nodes whose inputs are all known (shape arithmetic, constants).

Exported models compute shapes with Shape -> Gather -> Concat -> Reshape chains. Their values must be known
while lowering (they decide array shapes), so such nodes are evaluated here instead of being lowered.
Numeric values are evaluated with ONNX's reference evaluator (the spec's own semantics); values that
contain symbolic dimensions (object arrays of SymPy expressions) go through the small numpy-based folders
below. Float initializers are *not* known values: they are weights and stay arrays.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from gradflow.frontend.onnx.table import Node, as_int_list

#: Ops never folded: random ops, ops with subgraphs, and gradflow's own (the reference evaluator lacks them;
#: their rules fold known values themselves).
NO_FOLD = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
     "If", "Loop", "Scan", "Dropout", "StopGradient"}
)

#: Folding a node whose output would be larger than this is left to the lowering (no huge constants).
MAX_FOLD_ELEMENTS = 1 << 16

#: What evaluating a node on known values raises when the node cannot be evaluated (invalid inputs or
#: attributes, an op the reference evaluator lacks): the node is then left to its lowering rule, which
#: lowers it or rejects it with a typed error naming the node.
FOLD_ERRORS = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, RuntimeError)


def fold_numeric(node: onnx.NodeProto, values: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """Outputs of `node` on numeric inputs via the reference evaluator, or None when it cannot or when an
    output would be larger than `MAX_FOLD_ELEMENTS` (decided by ONNX shape inference *before* evaluating,
    so a constant of 2^52 elements is never materialized)."""
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in zip(node.input, values) if n]
    out_infos = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    graph = helper.make_graph([node], "fold", [], out_infos, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if not _small_outputs(model):
        return None
    try:
        results = ReferenceEvaluator(model).run(None, {})
    except FOLD_ERRORS:
        return None
    return [np.asarray(r) for r in results]


def _small_outputs(model: onnx.ModelProto) -> bool:
    """Whether shape inference (with the inputs' values) gives every output a static shape of at most
    `MAX_FOLD_ELEMENTS` elements."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return False
    for out in inferred.graph.output:
        tt = out.type.tensor_type
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            return False
        count = 1
        for d in tt.shape.dim:
            count *= d.dim_value
        if count > MAX_FOLD_ELEMENTS:
            return False
    return True


#: What the symbolic folders raise on values they cannot fold (bad axes, shapes that do not match).
SYMBOLIC_ERRORS = (ValueError, TypeError, IndexError, KeyError, ArithmeticError)


def _int_floor_div(a, b):
    return sympy.floor(sympy.sympify(a) / sympy.sympify(b))


def _axes(node: Node, values: list, k: int) -> list[int] | None:
    if node.attr("axes") is not None:
        return [int(a) for a in node.attr("axes")]
    if len(values) > k and values[k] is not None:
        return as_int_list(values[k])
    return None


def _axis(a: int, rank: int) -> int:
    """An ONNX axis in [-rank, rank - 1] as a non-negative one (IndexError otherwise: never wrapped)."""
    if not -rank <= a < rank:
        raise IndexError(f"axis {a} out of range for rank {rank}")
    return a % rank


def _slice(node: Node, v: list) -> np.ndarray:
    data = v[0]
    starts, ends = as_int_list(v[1]), as_int_list(v[2])
    axes = as_int_list(v[3]) if len(v) > 3 and v[3] is not None else list(range(len(starts)))
    steps = as_int_list(v[4]) if len(v) > 4 and v[4] is not None else [1] * len(starts)
    sl = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("slice step 0")
        sl[_axis(a, data.ndim)] = slice(s, e, st)
    return data[tuple(sl)]


def _squeeze(node: Node, v: list) -> np.ndarray:
    axes = _axes(node, v, 1)
    return np.squeeze(v[0], axis=tuple(_axis(a, v[0].ndim) for a in axes) if axes else None)


def _unsqueeze(node: Node, v: list) -> np.ndarray:
    axes = sorted(_axis(a, v[0].ndim + len(_axes(node, v, 1))) for a in _axes(node, v, 1))
    out = v[0]
    for a in axes:
        out = np.expand_dims(out, a)
    return out


def _reshape(node: Node, v: list) -> np.ndarray:
    shape = as_int_list(v[1])
    shape = [v[0].shape[k] if (s == 0 and not node.attr("allowzero", 0)) else s for k, s in enumerate(shape)]
    return v[0].reshape(shape)


_BINARY = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: np.vectorize(_int_floor_div, otypes=[object])(a, b),
    "Max": lambda a, b: np.vectorize(lambda x, y: sympy.Max(x, y), otypes=[object])(a, b),
    "Min": lambda a, b: np.vectorize(lambda x, y: sympy.Min(x, y), otypes=[object])(a, b),
}

#: Folders for values holding symbolic dimensions (object arrays).
SYMBOLIC: dict[str, Callable[[Node, list], np.ndarray]] = {
    "Identity": lambda n, v: v[0],
    "Cast": lambda n, v: v[0],
    "Gather": lambda n, v: np.take(v[0], np.asarray(v[1]).astype(np.int64), axis=int(n.attr("axis", 0))),
    "Concat": lambda n, v: np.concatenate([np.asarray(x, dtype=object) for x in v], axis=int(n.attr("axis"))),
    "Slice": _slice,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Reshape": _reshape,
    **{op: (lambda f: lambda n, v: f(np.asarray(v[0], dtype=object), np.asarray(v[1], dtype=object)))(f)
       for op, f in _BINARY.items()},
}


def simplify_object(value: np.ndarray) -> np.ndarray:
    """An object array whose entries are all integers becomes an int64 array again."""
    flat = [sympy.sympify(x) for x in value.reshape(-1)]
    if all(x.is_Integer for x in flat):
        return np.array([int(x) for x in flat], dtype=np.int64).reshape(value.shape)
    out = np.empty(value.shape, dtype=object)
    out.reshape(-1)[:] = [sympy.simplify(x) for x in flat]
    return out
