"""Acceptance: torch-exported MLP, CNN (BatchNorm kept) and TransformerEncoderLayer run through gradflow
and match torch within 1e-5 (float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradflow.core.graph import Graph
from gradflow.frontend.onnx import load
from onnx_testutil import export

ATOL = 1e-5


def _max_err(got, want) -> float:
    return float((got - want).abs().max())


def test_mlp_matches_torch_with_symbolic_batch():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Sigmoid(), torch.nn.Linear(16, 5)
    ).eval()
    model = export(mlp, (torch.randn(3, 12),), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    prog = load(model)
    assert prog.signature.symbols, "the dynamic batch dimension must become an SDFG symbol"
    for batch in (3, 7):  # one compiled SDFG serves both batch sizes
        x = torch.randn(batch, 12)
        (out,) = prog(x)
        assert isinstance(out, torch.Tensor) and out.shape == (batch, 5)
        with torch.no_grad():
            assert _max_err(out, mlp(x)) <= ATOL
    (out_np,) = prog(x.numpy())
    assert isinstance(out_np, np.ndarray)
    np.testing.assert_allclose(out_np, mlp(x).detach().numpy(), rtol=0, atol=ATOL)


def _cnn():
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 2, 10),
    )
    with torch.no_grad():  # non-trivial running statistics, so BatchNorm is not the identity
        for bn in (net[1], net[5]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return net.eval()


def test_cnn_with_batchnorm_matches_torch():
    net = _cnn()
    x = torch.randn(2, 3, 8, 8)
    model = export(net, (x,), dynamo=False, do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE)
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "BatchNormalization", "Relu", "MaxPool", "Flatten", "Gemm"} <= ops
    prog = load(model)
    (out,) = prog(x)
    with torch.no_grad():
        assert _max_err(out, net(x)) <= ATOL


def test_transformer_encoder_layer_matches_torch():
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0,
                                             batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    model = export(layer, (x,), dynamo=True, opset_version=18)
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMul", "Softmax", "LayerNormalization"} <= ops
    prog = load(model)
    (out,) = prog(x)
    with torch.no_grad():
        assert _max_err(out, layer(x)) <= ATOL


def test_program_exposes_frozen_graph_and_weight_arrays():
    net = _cnn()
    model = export(net, (torch.randn(1, 3, 8, 8),), dynamo=False, do_constant_folding=False,
                   training=torch.onnx.TrainingMode.PRESERVE)
    prog = load(model)
    assert isinstance(prog.graph, Graph)
    sdfg = prog.sdfg
    assert sdfg is not prog.graph.sdfg
    weights = prog.weights
    n_params = sum(1 for t in model.graph.initializer if t.data_type == 1)
    assert len(weights) == n_params > 0
    for array in weights:
        assert not sdfg.arrays[array].transient, "initializers must be non-transient (differentiable weights)"
    for port in prog.signature.inputs + prog.signature.outputs:
        assert not sdfg.arrays[port.array].transient
    fp = prog.graph.fingerprint
    sdfg.arrays[next(iter(weights))].transient = True  # editing the copy ...
    assert prog.graph.fingerprint == fp and not prog.graph.changed_since_fingerprint()  # ... leaves the value alone
