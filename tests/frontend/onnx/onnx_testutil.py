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


# -- the acceptance models (torch module in eval mode, example input, exported ModelProto) -------------------
def mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Sigmoid(), torch.nn.Linear(16, 5)
    ).eval()


def export_mlp(module) -> onnx.ModelProto:
    """Exported with a symbolic batch dimension ('batch')."""
    import torch

    return export(module, (torch.randn(3, 12),), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})


def cnn():
    """Conv (padded and not) + BatchNorm with non-trivial running statistics + MaxPool + Gemm."""
    import torch

    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 2, 10),
    )
    with torch.no_grad():  # so BatchNorm is not the identity
        for bn in (net[1], net[5]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return net.eval()


def export_cnn(module, batch: int = 2) -> onnx.ModelProto:
    """BatchNormalization kept as an op (no constant folding into the convolutions)."""
    import torch

    return export(module, (torch.randn(batch, 3, 8, 8),), dynamo=False, do_constant_folding=False,
                  training=torch.onnx.TrainingMode.PRESERVE)


def transformer():
    import torch

    torch.manual_seed(2)
    return torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0,
                                            batch_first=True).eval()


def export_transformer(module) -> onnx.ModelProto:
    import torch

    return export(module, (torch.randn(2, 5, 16),), dynamo=True, opset_version=18)
