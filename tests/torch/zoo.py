"""The small model zoo the PyTorch integration is checked on (`test_compile.py`, `test_dynamo_backend.py`):
constructors, input shapes, fresh seeded models and their inputs."""

from __future__ import annotations

import torch


class TwoHeads(torch.nn.Module):
    """Two inputs, two outputs (a tuple), a root-level parameter and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.left = torch.nn.Linear(3, 4)
        self.right = torch.nn.Linear(2, 4)
        self.scale = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("offset", torch.randn(4), persistent=False)

    def forward(self, a, b):
        h = torch.tanh(self.left(a) + self.right(b))
        return h * self.scale, h.sum(dim=1) + self.offset.sum()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _lenet():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(2 * 3 * 3, 3))


def _conv_bn():
    # no Conv bias before the BatchNorm (as in ResNets): its exact gradient is 0, and Adam would turn the
    # rounding noise of that 0 into steps of size lr
    return torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, bias=False), torch.nn.BatchNorm2d(3), torch.nn.ReLU())


def _transformer():
    # attention is exported written out (gradflow.torch.export._attention_math): MatMul, Softmax, masks. The
    # head matters: the sum of a LayerNorm's outputs is ~0 whatever its input, so without it the loss and its
    # gradient are rounding noise, on which two correct implementations part ways within a few steps.
    return torch.nn.Sequential(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                               torch.nn.Linear(8, 3))


class _ResidualBlock(torch.nn.Module):
    """A ResNet-style block: Conv/BatchNorm/ReLU stem, a residual Conv/BatchNorm branch, pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, padding=1, bias=False), torch.nn.BatchNorm2d(3),
                                        torch.nn.ReLU())
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, padding=1, bias=False), torch.nn.BatchNorm2d(3))
        self.head = torch.nn.Linear(3, 2)

    def forward(self, x):
        h = self.stem(x)
        return self.head(torch.relu(h + self.body(h)).mean(dim=(2, 3)))


def _mobilenet():
    # depthwise-separable: a grouped (depthwise) convolution, ReLU6 (ONNX Clip with min/max inputs)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 1, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU6(),
                               torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU6(), torch.nn.Conv2d(4, 3, 1), torch.nn.Flatten(),
                               torch.nn.Linear(3 * 5 * 5, 2))


def _layernorm_gelu():
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.GELU(), torch.nn.Linear(6, 3))


class _EmbedLSTM(torch.nn.Module):
    """A trainable Embedding, nn.LSTM over the sequence, a head on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(7, 3)
        self.lstm = torch.nn.LSTM(3, 4, batch_first=True)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class _EmbedLSTMCell(torch.nn.Module):
    """A trainable Embedding and an LSTMCell unrolled over the sequence in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(7, 3)
        self.cell = torch.nn.LSTMCell(3, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, tokens):
        e = self.embed(tokens)
        h = c = torch.zeros(tokens.shape[0], 4, dtype=e.dtype)
        for t in range(tokens.shape[1]):
            h, c = self.cell(e[:, t], (h, c))
        return self.head(h)


TOKENS = "tokens"  # an input shape marked so is integer tokens in [0, 7), not floats

#: name -> (constructor, input shapes)
MODELS = {
    "mlp": (mlp, [(2, 4)]),
    "lenet": (_lenet, [(2, 1, 8, 8)]),
    "conv_bn": (_conv_bn, [(3, 2, 5, 5)]),
    "two_heads": (TwoHeads, [(2, 3), (2, 2)]),
    "transformer": (_transformer, [(2, 3, 8)]),
    "resnet_block": (_ResidualBlock, [(2, 2, 4, 4)]),
    "mobilenet": (_mobilenet, [(2, 2, 5, 5)]),
    "layernorm_gelu": (_layernorm_gelu, [(3, 4)]),
    "embedding_lstm": (_EmbedLSTM, [(TOKENS, 2, 3)]),
    "embedding_lstmcell": (_EmbedLSTMCell, [(TOKENS, 2, 3)]),
}
NAMES = sorted(MODELS)


def fresh(name: str, dtype=torch.float64, seed: int = 0) -> torch.nn.Module:
    """A new torch model with random weights (and, for BatchNorm, non-trivial running statistics)."""
    torch.manual_seed(seed)
    model = MODELS[name][0]().to(dtype)
    with torch.no_grad():
        for b in model.buffers():
            if b.is_floating_point():
                b.copy_(torch.rand_like(b) + 0.5)
    return model


def inputs(name: str, dtype=torch.float64, seed: int = 1) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 7, shape[1:], generator=gen) if shape[0] == TOKENS else
                 torch.randn(*shape, generator=gen, dtype=dtype) for shape in MODELS[name][1])


class StraightThroughRelu(torch.autograd.Function):
    """ReLU forward, identity backward: a backward the ONNX export drops (refused when trained)."""

    @staticmethod
    def forward(ctx, x):
        return x.clamp(min=0.0)

    @staticmethod
    def backward(ctx, g):
        return g
