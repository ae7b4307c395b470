"""The model zoo of issue 14: eight small torch models exported *with their loss* to ONNX, and their loss
gradient through gradflow compared with torch.autograd.

Each entry builds a float64 model (random init, tiny sizes), an example batch and a loss module
`forward(x, target) -> F.cross_entropy(net(x), target)`. `export_with_loss` exports it with
`torch.onnx.export(..., dynamo=True, optimize=False)` (parameters stay initializers named like
`named_parameters()`), `gradflow_grads` differentiates the lowered loss with respect to the chosen
parameters, and `torch_grads` gives torch's. Shared by `tests/frontend/onnx/test_onnx_zoo.py` and
`benchmarks/onnx_zoo_grad.py` (a module with a unique name: tests/ has no packages here).
"""

from __future__ import annotations

import io
import warnings
from typing import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 4


class WithLoss(nn.Module):
    """`cross_entropy(net(x), target)`: the scalar the exported model returns."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x, target):
        return F.cross_entropy(self.net(x), target)


class Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Encoder(nn.Module):
    """TransformerEncoderLayer, mean over the sequence, a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(self.layer(x).mean(dim=1))


class EmbeddingLSTM(nn.Module):
    """Embedding, one-layer nn.LSTM (batch first), a classifier on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 5)
        self.lstm = nn.LSTM(5, 6, batch_first=True)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class EmbeddingLSTMCell(nn.Module):
    """Embedding and an LSTMCell unrolled over the sequence in Python, a classifier on the last state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 5)
        self.cell = nn.LSTMCell(5, 6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens):
        e = self.embed(tokens)
        h = torch.zeros(e.shape[0], 6, dtype=e.dtype)
        c = torch.zeros(e.shape[0], 6, dtype=e.dtype)
        for t in range(e.shape[1]):
            h, c = self.cell(e[:, t], (h, c))
        return self.head(h)


class BiLSTM(nn.Module):
    """A bidirectional nn.LSTM on float inputs (both directions of ONNX's LSTM), a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, 0] + out[:, -1])


class StackedGRU(nn.Module):
    """A two-layer bidirectional nn.GRU (torch's gates: linear before reset), a classifier on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class ReluRNN(nn.Module):
    """An Elman nn.RNN with ReLU (ONNX's RNN with activations [Relu]), classifying its last state."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(3, 5, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(5, CLASSES)

    def forward(self, x):
        _, h = self.rnn(x)
        return self.head(h[0])


def _mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, CLASSES)), torch.randn(3, 6)


def _lenet():
    net = nn.Sequential(
        nn.Conv2d(1, 2, 5, padding=2), nn.Tanh(), nn.AvgPool2d(2),
        nn.Conv2d(2, 3, 5), nn.Tanh(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(3 * 2 * 2, 8), nn.Tanh(), nn.Linear(8, CLASSES),
    )
    return net, torch.randn(2, 1, 16, 16)


def _resnet():
    def conv_bn(c_in, c_out):
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out)]

    net = nn.Sequential(
        *conv_bn(2, 3), nn.ReLU(),
        Residual(nn.Sequential(*conv_bn(3, 3), nn.ReLU(), *conv_bn(3, 3))), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, CLASSES),
    )
    return net, torch.randn(2, 2, 5, 5)


def _mobilenet():
    block = nn.Sequential(
        nn.Conv2d(3, 6, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU6(),
        nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False), nn.BatchNorm2d(6), nn.ReLU6(),
        nn.Conv2d(6, 3, 1, bias=False), nn.BatchNorm2d(3),
    )
    net = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), Residual(block), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(3, CLASSES))
    return net, torch.randn(2, 2, 5, 5)


def _transformer():
    return Encoder(), torch.randn(2, 3, 8)


def _layernorm_gelu():
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, CLASSES)), torch.randn(3, 6)


def _lstm():
    return EmbeddingLSTM(), torch.randint(0, 10, (2, 3))


def _lstm_cell():
    return EmbeddingLSTMCell(), torch.randint(0, 10, (2, 3))


#: name -> () -> (float64 net in training mode, example input); seeded in `build`
MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "mlp": _mlp, "lenet5": _lenet, "resnet_bn": _resnet, "mobilenet_dw": _mobilenet,
    "transformer": _transformer, "layernorm_gelu": _layernorm_gelu, "embedding_lstm": _lstm,
    "embedding_lstmcell": _lstm_cell,
}

#: models beyond the issue's eight, for ops the eight use in one form only
EXTRA: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "bidirectional_lstm": lambda: (BiLSTM(), torch.randn(2, 3, 3)),
    "stacked_gru": lambda: (StackedGRU(), torch.randn(2, 2, 3)),
    "relu_rnn": lambda: (ReluRNN(), torch.randn(2, 4, 3)),
}


def build(name: str, seed: int = 0) -> tuple[WithLoss, torch.Tensor, torch.Tensor]:
    """The loss module (float64, training mode), an example input and integer targets."""
    torch.manual_seed(seed)
    with torch.random.fork_rng():
        net, x = {**MODELS, **EXTRA}[name]()
    loss = WithLoss(net).double().train()
    x = x.double() if x.is_floating_point() else x
    target = torch.randint(0, CLASSES, (x.shape[0],))
    return loss, x, target


def _has_batch_norm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def export_with_loss(loss: nn.Module, x: torch.Tensor, target: torch.Tensor) -> onnx.ModelProto:
    """The ONNX model of `loss(x, target)`, parameters kept as initializers named as in torch.

    The dynamo exporter (onnxscript 0.7) writes a BatchNorm of a module in training mode as an
    *inference* BatchNormalization (running statistics), another function than torch's; models with
    BatchNorm therefore go through the TorchScript exporter in training mode, which writes
    `training_mode=1` (batch statistics, running statistics as extra outputs)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _has_batch_norm(loss):
            torch.onnx.export(loss, (x, target), buf, dynamo=False, do_constant_folding=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, input_names=["x", "target"])
        else:
            torch.onnx.export(loss, (x, target), buf, dynamo=True, optimize=False, input_names=["x", "target"])
    return onnx.load_from_string(buf.getvalue())


def torch_grads(loss: nn.Module, x: torch.Tensor, target: torch.Tensor, names) -> tuple[float, dict]:
    """torch's loss and its gradient w.r.t. the named parameters (on a copy of the module)."""
    import copy

    loss = copy.deepcopy(loss)
    params = dict(loss.named_parameters())
    value = loss(x, target)
    grads = torch.autograd.grad(value, [params[n] for n in names])
    return value.item(), {n: g.numpy() for n, g in zip(names, grads)}


def weight_arrays(prog) -> dict[str, str]:
    """ONNX initializer name -> SDFG array of a loaded program's float weights."""
    return {port.onnx_name: port.array for port in prog.signature.weights}


def gradflow_grads(prog, x: torch.Tensor, target: torch.Tensor, names, grad_fn=None) -> tuple[float, dict]:
    """gradflow's loss and its gradient w.r.t. the weights named (ONNX initializer names)."""
    import gradflow

    sig = prog.signature
    arrays = weight_arrays(prog)
    wrt = [arrays[n] for n in names]
    fn = grad_fn or gradflow.value_and_grad(prog.graph, wrt=wrt, of=sig.outputs[0].array)
    feeds = {sig.inputs[0].array: x.numpy(), sig.inputs[1].array: target.numpy(),
             **{k: np.array(v) for k, v in prog.weights.items()}}
    value, grads = fn(**feeds)
    return float(np.asarray(value).reshape(-1)[0]), {n: grads[arrays[n]] for n in names}
