"""Helpers shared by the ONNX frontend tests (a uniquely named module: tests/ has no packages here)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator


def export(module, args, **kwargs) -> onnx.ModelProto:
    """torch.onnx.export into memory (exporter warnings silenced)."""
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, **kwargs)
    return onnx.load_from_string(buf.getvalue())


def reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Outputs of ONNX's pure-Python reference evaluator."""
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def single_node_model(op: str, inputs, outputs, opset: int = 18, initializers=(), **attrs) -> onnx.ModelProto:
    """A one-node model; `inputs` / `outputs` are (name, elem_type, shape) triples."""
    node = helper.make_node(op, [n for n, _, _ in inputs] + [t.name for t in initializers],
                            [n for n, _, _ in outputs], **attrs)
    graph = helper.make_graph(
        [node], f"{op}_graph",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        initializer=list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
