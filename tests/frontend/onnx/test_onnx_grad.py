"""The lowered SDFG (`OnnxProgram.graph`) is an ordinary gradflow Graph: `gradflow.grad` / `gradflow.vjp`
differentiate it with respect to the model input and every weight, matching `torch.autograd`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gradflow
import gradflow.onnx
from onnx_testutil import cnn, export, mlp, transformer

TOL = dict(rtol=1e-5, atol=1e-5)


class SquaredSum(torch.nn.Module):
    """A scalar loss around a model, so `grad` has one `of`: sum(net(x) ** 2)."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return (self.net(x) ** 2).sum()


#: model, input shape, export options, how many torch parameters appear unchanged (or transposed) as weights
CASES = {
    "mlp": (mlp, (3, 12), dict(dynamo=False), 6),
    "cnn": (cnn, (2, 3, 8, 8), dict(dynamo=False, do_constant_folding=False,
                                    training=torch.onnx.TrainingMode.PRESERVE), 10),
    "transformer": (transformer, (2, 5, 16), dict(dynamo=True, opset_version=18), 7),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_of_lowered_model_matches_torch(name):
    make, shape, kwargs, min_matched = CASES[name]
    loss = SquaredSum(make())
    torch.manual_seed(3)
    x = torch.randn(*shape)
    prog = gradflow.onnx.load(export(loss, (x,), **kwargs))
    sig = prog.signature
    x_array, of = sig.inputs[0].array, sig.outputs[0].array
    wrt = [x_array, *prog.weights]
    value, grads = gradflow.value_and_grad(prog.graph, wrt=wrt, of=of)(
        **{x_array: x.numpy(), **{k: np.array(v) for k, v in prog.weights.items()}}
    )

    xt = x.clone().requires_grad_(True)
    want = loss(xt)
    want.backward()
    assert value == pytest.approx(want.item(), rel=1e-5)
    torch.testing.assert_close(torch.from_numpy(grads[x_array]), xt.grad, **TOL)
    # Float initializers are weight arrays. Match them to torch parameters by value (exporters may store a
    # matrix transposed; values shared by several parameters, like LayerNorm's initial ones, are ambiguous
    # and skipped) and compare the gradients of every match.
    params = list(loss.parameters())
    matched = set()
    for array, w in prog.weights.items():
        hits = []
        for k, p in enumerate(params):
            layouts = [(p.detach().numpy(), p.grad)]
            if p.ndim == 2:
                layouts.append((p.detach().numpy().T, p.grad.T))
            hits += [(k, grad) for layout, grad in layouts if layout.shape == w.shape and np.array_equal(layout, w)]
        if len(hits) == 1:
            torch.testing.assert_close(torch.from_numpy(grads[array]), hits[0][1], **TOL)
            matched.add(hits[0][0])
    assert len(matched) >= min_matched, f"only parameters {sorted(matched)} found among the weights"


def test_vjp_of_mlp_with_symbolic_batch_through_torch():
    """`gradflow.vjp` on the lowered graph, run as a torch.autograd.Function, at a batch size other than
    the exported one (the batch is an SDFG symbol in both the forward and the backward SDFG)."""
    import gradflow.torch as gt

    net = mlp()
    prog = gradflow.onnx.load(export(net, (torch.randn(3, 12),), dynamo=False, input_names=["x"],
                                     dynamic_axes={"x": {0: "batch"}}))
    sig = prog.signature
    inputs = [sig.inputs[0].array, *prog.weights]
    result = gradflow.vjp(prog.graph, wrt=inputs, of=[sig.outputs[0].array])
    f = gt.function(result, inputs=inputs, outputs=[sig.outputs[0].array])

    x = torch.randn(7, 12, requires_grad=True)
    weights = [torch.tensor(np.array(v), requires_grad=True) for v in prog.weights.values()]
    cotangent = torch.randn(7, 5)
    y = f(x, *weights)
    (y * cotangent).sum().backward()

    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = net(x_ref)
    (y_ref * cotangent).sum().backward()
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
    for w, p in zip(weights, net.parameters()):  # Linear weights/biases in order, exported as Gemm operands
        torch.testing.assert_close(w.grad, p.grad, **TOL)
