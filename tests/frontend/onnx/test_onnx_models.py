"""Acceptance: torch-exported MLP, CNN (BatchNorm kept) and TransformerEncoderLayer run through gradflow
and match torch within 1e-5 (float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradflow.core.graph import Graph
from gradflow.frontend.onnx import load
from onnx_testutil import cnn, export_cnn, export_mlp, export_transformer, mlp, transformer

ATOL = 1e-5


def _max_err(got, want) -> float:
    return float((got - want).abs().max())


def test_mlp_matches_torch_with_symbolic_batch():
    net = mlp()
    prog = load(export_mlp(net))
    assert prog.signature.symbols, "the dynamic batch dimension must become an SDFG symbol"
    for batch in (3, 7):  # one compiled SDFG serves both batch sizes
        x = torch.randn(batch, 12)
        (out,) = prog(x)
        assert isinstance(out, torch.Tensor) and out.shape == (batch, 5)
        with torch.no_grad():
            assert _max_err(out, net(x)) <= ATOL
    (out_np,) = prog(x.numpy())
    assert isinstance(out_np, np.ndarray)
    np.testing.assert_allclose(out_np, net(x).detach().numpy(), rtol=0, atol=ATOL)


def test_cnn_with_batchnorm_matches_torch():
    net = cnn()
    x = torch.randn(2, 3, 8, 8)
    model = export_cnn(net)
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "BatchNormalization", "Relu", "MaxPool", "Flatten", "Gemm"} <= ops
    prog = load(model)
    (out,) = prog(x)
    with torch.no_grad():
        assert _max_err(out, net(x)) <= ATOL


def test_transformer_encoder_layer_matches_torch():
    layer = transformer()
    x = torch.randn(2, 5, 16)
    model = export_transformer(layer)
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMul", "Softmax", "LayerNormalization"} <= ops
    prog = load(model)
    (out,) = prog(x)
    with torch.no_grad():
        assert _max_err(out, layer(x)) <= ATOL


def test_program_exposes_frozen_graph_and_weight_arrays():
    model = export_cnn(cnn(), batch=1)
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
