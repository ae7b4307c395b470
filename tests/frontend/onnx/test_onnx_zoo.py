"""Issue 14's model zoo (`onnx_zoo`), each model exported with its cross-entropy loss: the loss and its
gradient w.r.t. every parameter through the lowered ONNX graph equal torch.autograd's (float64, rtol 1e-9).

Each model is exported, lowered and compiled once per module (`_program`); hypothesis varies the batch and
the targets. The embedding models are also differentiated with the embedding frozen (not in `wrt`), where
its data-indexed Gather is off the gradient path.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradflow
import gradflow.onnx
import onnx_zoo

CASES = [(name, False) for name in onnx_zoo.MODELS] + [("embedding_lstmcell", True), ("bidirectional_lstm", False),
                                                   ("stacked_gru", False), ("relu_rnn", False)]


@functools.cache
def _program(name: str, frozen: bool):
    loss, x, target = onnx_zoo.build(name)
    prog = gradflow.onnx.load(onnx_zoo.export_with_loss(loss, x, target))
    names = [n for n, _ in loss.named_parameters() if not (frozen and "embed" in n)]
    arrays = onnx_zoo.weight_arrays(prog)
    fn = gradflow.value_and_grad(prog.graph, wrt=[arrays[n] for n in names], of=prog.signature.outputs[0].array)
    return loss, x, prog, names, fn


def _batch(x: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Another batch of the example's shape (tokens for the embedding models) and other targets."""
    gen = torch.Generator().manual_seed(seed)
    if x.is_floating_point():
        data = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    else:
        data = torch.randint(0, 10, x.shape, generator=gen)
    return data, torch.randint(0, onnx_zoo.CLASSES, (x.shape[0],), generator=gen)


@pytest.mark.parametrize("name, frozen", CASES, ids=[f"{n}-frozen" if f else n for n, f in CASES])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_loss_gradient_wrt_every_weight_matches_torch(name: str, frozen: bool, seed: int) -> None:
    loss, example, prog, names, fn = _program(name, frozen)
    x, target = _batch(example, seed)
    value, got = onnx_zoo.gradflow_grads(prog, x, target, names, grad_fn=fn)
    want_value, want = onnx_zoo.torch_grads(loss, x, target, names)
    assert value == pytest.approx(want_value, rel=1e-9)
    for n in names:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-9, atol=1e-12, err_msg=f"{name}: gradient of {n}")

