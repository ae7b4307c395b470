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
from onnx import helper
from onnx.reference import ReferenceEvaluator

from gradflow.frontend.onnx.table import Node, as_int_list

#: Ops never folded: random ops, and ops with subgraphs.
NO_FOLD = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
     "If", "Loop", "Scan", "Dropout"}
)

#: Folding a node whose output would be larger than this is left to the lowering (no huge constants).
MAX_FOLD_ELEMENTS = 1 << 16


def fold_numeric(node: onnx.NodeProto, values: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """Outputs of `node` on numeric inputs via the reference evaluator, or None when it cannot."""
    names = [n for n in node.input]
    feeds = {n: v for n, v in zip(names, values) if n}
    in_infos = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))
        for n, v in feeds.items()
    ]
    out_infos = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    graph = helper.make_graph([node], "fold", in_infos, out_infos)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        results = ReferenceEvaluator(model).run(None, feeds)
    except Exception:
        return None
    return [np.asarray(r) for r in results]


def _int_floor_div(a, b):
    return sympy.floor(sympy.sympify(a) / sympy.sympify(b))


def _axes(node: Node, values: list, k: int) -> list[int] | None:
    if node.attr("axes") is not None:
        return [int(a) for a in node.attr("axes")]
    if len(values) > k and values[k] is not None:
        return as_int_list(values[k])
    return None


def _slice(node: Node, v: list) -> np.ndarray:
    data = v[0]
    starts, ends = as_int_list(v[1]), as_int_list(v[2])
    axes = as_int_list(v[3]) if len(v) > 3 and v[3] is not None else list(range(len(starts)))
    steps = as_int_list(v[4]) if len(v) > 4 and v[4] is not None else [1] * len(starts)
    sl = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[a % data.ndim] = slice(s, e, st)
    return data[tuple(sl)]


def _squeeze(node: Node, v: list) -> np.ndarray:
    axes = _axes(node, v, 1)
    return np.squeeze(v[0], axis=tuple(a % v[0].ndim for a in axes) if axes else None)


def _unsqueeze(node: Node, v: list) -> np.ndarray:
    axes = sorted(a % (v[0].ndim + len(_axes(node, v, 1))) for a in _axes(node, v, 1))
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
