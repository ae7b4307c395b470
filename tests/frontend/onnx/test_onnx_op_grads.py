"""Gradients through the lowerings the model zoo needs, op by op, against torch.autograd (float64):
SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (every reduction, class weights, ignore_index),
Gather with indices read from data (an embedding: scatter-add backward, duplicates and negative indices),
ScatterElements and ScatterND (overwriting and accumulating), pools whose windows read padding (MaxPool,
AveragePool with and without counting the padding, ceil_mode), and an error about an op the AD cannot
differentiate names the ONNX node.

Each model structure is lowered and compiled once (`_grad_fn`); hypothesis varies the data.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import gradflow
import gradflow.onnx
from gradflow.core.errors import NotDifferentiableError

N, C, D = 3, 4, 2
DOUBLE = TensorProto.DOUBLE

#: name -> (op, reduction, class weights?, ignore_index, spatial dim?)
LOSSES = {
    "sce_mean": ("SoftmaxCrossEntropyLoss", "mean", False, None, False),
    "sce_sum_weighted_ignore": ("SoftmaxCrossEntropyLoss", "sum", True, 1, True),
    "sce_none_weighted": ("SoftmaxCrossEntropyLoss", "none", True, None, False),
    "nll_mean_weighted_ignore": ("NegativeLogLikelihoodLoss", "mean", True, -1, True),
    "nll_sum": ("NegativeLogLikelihoodLoss", "sum", False, None, False),
}

WEIGHT = np.array([0.5, 1.5, 1.0, 2.0])


def _loss_model(op: str, reduction: str, weighted: bool, ignore: int | None, spatial: bool):
    """scores (N, C[, D]) and labels -> op -> (for reduction 'none': times a fixed cotangent, summed) -> loss."""
    xs, ls = ((N, C, D), (N, D)) if spatial else ((N, C), (N,))
    inits, extra = [], {}
    if weighted:
        inits.append(helper.make_tensor("w", DOUBLE, (C,), WEIGHT.tolist()))
    if ignore is not None:
        extra["ignore_index"] = ignore
    loss_out = "per" if reduction == "none" else "loss"
    nodes = [helper.make_node(op, ["x", "t"] + (["w"] if weighted else []), [loss_out], reduction=reduction, **extra)]
    if reduction == "none":
        inits.append(helper.make_tensor("cot", DOUBLE, ls, np.linspace(-1.0, 2.0, int(np.prod(ls))).tolist()))
        nodes += [helper.make_node("Mul", ["per", "cot"], ["weighted"]),
                  helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "loss", [helper.make_tensor_value_info("x", DOUBLE, xs),
                                              helper.make_tensor_value_info("t", TensorProto.INT64, ls)],
                              [helper.make_tensor_value_info("loss", DOUBLE, ())], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), xs, ls


@functools.cache
def _grad_fn(name: str):
    model, xs, ls = _loss_model(*LOSSES[name])
    prog = gradflow.onnx.load(model)
    sig = prog.signature
    fn = gradflow.value_and_grad(prog.graph, wrt=[sig.inputs[0].array], of=sig.outputs[0].array)
    return prog, fn, xs, ls


def _torch_loss(name: str, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    op, reduction, weighted, ignore, _ = LOSSES[name]
    kwargs = dict(weight=torch.from_numpy(WEIGHT) if weighted else None, reduction=reduction,
                  ignore_index=-100 if ignore is None else ignore)
    if op == "SoftmaxCrossEntropyLoss":
        out = F.cross_entropy(x, t, **kwargs)
    else:
        out = F.nll_loss(x, t, **kwargs)
    if reduction == "none":
        out = (out * torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()
    return out


@pytest.mark.parametrize("name", sorted(LOSSES))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_loss_gradient_matches_torch(name: str, seed: int) -> None:
    prog, fn, xs, ls = _grad_fn(name)
    ignore = LOSSES[name][3]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs)
    t = rng.integers(0, C, ls)
    if ignore is not None:
        t.reshape(-1)[0] = ignore  # one ignored element, the others labelled
        t.reshape(-1)[-1] = (ignore + 1) % C
    sig = prog.signature
    weights = {k: np.array(v) for k, v in prog.weights.items()}
    value, grads = fn(**{sig.inputs[0].array: x, sig.inputs[1].array: t}, **weights)
    xt = torch.from_numpy(x).requires_grad_(True)
    want = _torch_loss(name, xt, torch.from_numpy(t))
    want.backward()
    assert float(np.asarray(value).reshape(-1)[0]) == pytest.approx(want.item(), rel=1e-9)
    np.testing.assert_allclose(grads[sig.inputs[0].array], xt.grad.numpy(), rtol=1e-9, atol=1e-14)


@functools.cache
def _embedding():
    """out = sum(Gather(W, idx)^2) with W (5, 3) a weight and idx (2, 4) read from data."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "idx"], ["e"], axis=0), helper.make_node("Mul", ["e", "e"], ["sq"]),
         helper.make_node("ReduceSum", ["sq"], ["out"], keepdims=0)],
        "embedding", [helper.make_tensor_value_info("idx", TensorProto.INT64, (2, 4))],
        [helper.make_tensor_value_info("out", DOUBLE, ())],
        initializer=[helper.make_tensor("W", DOUBLE, (5, 3), np.linspace(-1, 1, 15).tolist())])
    prog = gradflow.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    (weight,) = prog.signature.weights
    fn = gradflow.value_and_grad(prog.graph, wrt=[weight.array], of=prog.signature.outputs[0].array)
    return prog, weight.array, fn


@settings(max_examples=4, deadline=None)
@given(idx=st.lists(st.integers(-5, 4), min_size=8, max_size=8))
def test_embedding_gradient_scatter_adds_over_duplicate_and_negative_indices(idx: list[int]) -> None:
    prog, array, fn = _embedding()
    index = np.array(idx, dtype=np.int64).reshape(2, 4)
    w = np.array(prog.weights[array])
    value, grads = fn(**{prog.signature.inputs[0].array: index, array: w})
    wt = torch.from_numpy(w).requires_grad_(True)
    want = (wt[torch.from_numpy(index)] ** 2).sum()  # torch indexing wraps negative indices as ONNX does
    want.backward()
    assert float(np.asarray(value).reshape(-1)[0]) == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(grads[array], wt.grad.numpy(), rtol=1e-12, atol=0)


#: name -> (ONNX pool node with padding, the same pool in torch, output shape): windows that read padding
POOLS = {
    "maxpool_pad": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                    lambda x: F.max_pool2d(x, 3, 2, padding=1), (1, 2, 3, 3)),
    "maxpool_pad_end_ceil": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                              pads=[0, 0, 1, 1], ceil_mode=1),
                             lambda x: F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3, 2, ceil_mode=True),
                             (1, 2, 3, 3)),
    "avgpool_pad_excluded": (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                             lambda x: F.avg_pool2d(x, 3, 1, padding=1, count_include_pad=False), (1, 2, 5, 5)),
    "avgpool_pad_counted": (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                             pads=[1, 1, 1, 1], count_include_pad=1),
                            lambda x: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=True), (1, 2, 3, 3)),
}


@functools.cache
def _pool(name: str):
    """sum(pool(x) * cot) for a fixed cotangent, so every output element's gradient counts differently."""
    graph = helper.make_graph(
        [POOLS[name][0], helper.make_node("Mul", ["y", "cot"], ["w"]),
         helper.make_node("ReduceSum", ["w"], ["out"], keepdims=0)],
        "pool", [helper.make_tensor_value_info("x", DOUBLE, (1, 2, 5, 5)),
                 helper.make_tensor_value_info("cot", DOUBLE, POOLS[name][2])],
        [helper.make_tensor_value_info("out", DOUBLE, ())])
    prog = gradflow.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    sig = prog.signature
    fn = gradflow.value_and_grad(prog.graph, wrt=[sig.inputs[0].array], of=sig.outputs[0].array)
    return prog, fn


@pytest.mark.parametrize("name", sorted(POOLS))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_padded_pool_gradient_matches_torch(name: str, seed: int) -> None:
    prog, fn = _pool(name)
    sig = prog.signature
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 2, 5, 5))
    xt = torch.from_numpy(x).requires_grad_(True)
    y = POOLS[name][1](xt)
    cot = rng.standard_normal(tuple(y.shape))
    (y * torch.from_numpy(cot)).sum().backward()
    _, grads = fn(**{sig.inputs[0].array: x, sig.inputs[1].array: cot})
    np.testing.assert_allclose(grads[sig.inputs[0].array], xt.grad.numpy(), rtol=1e-12, atol=1e-15)


#: a node no reverse rule handles -> what the message names: TopK's tasklet (a loop inside it), the array
#: a multiplying ScatterElements's tasklet reads whole
#: (TopK was here until 2026-12-05: its values are now a gather at the selected indices)
NOT_DIFFERENTIABLE = {
    "ScatterElements": (helper.make_node("ScatterElements", ["x", "k2", "u"], ["y"], axis=1, reduction="mul",
                                         name="put"), "put"),
}


#: name -> (scatter node, torch of (x, u), indices): overwriting scatters with distinct indices (ONNX leaves
#: repeated ones undefined), accumulating ones with a repeated index, negative indices counted from the end
SCATTERS = {
    "elements_none": (helper.make_node("ScatterElements", ["x", "ind", "u"], ["y"], axis=1),
                      lambda x, u, i: x.scatter(1, i % 5, u), np.array([[4, 0], [-2, 1]])),
    "elements_add": (helper.make_node("ScatterElements", ["x", "ind", "u"], ["y"], axis=1, reduction="add"),
                     lambda x, u, i: x.scatter_add(1, i % 5, u), np.array([[4, 4], [-2, 1]])),
    "nd_none": (helper.make_node("ScatterND", ["x", "ind", "u"], ["y"]),
                lambda x, u, i: x.index_put((i[:, 0],), u), np.array([[1], [-3]])),
    "nd_add": (helper.make_node("ScatterND", ["x", "ind", "u"], ["y"], reduction="add"),
               lambda x, u, i: x.index_put((i[:, 0],), u, accumulate=True), np.array([[1], [-1]])),
}


@functools.cache
def _scatter(name: str):
    """sum(scatter(x, ind, u)^3) for x (3, 5) and u, both with gradients; the indices a constant."""
    node, _, ind = SCATTERS[name]
    u_shape = (2, 5) if name.startswith("nd") else (2, 2)
    graph = helper.make_graph(
        [node, helper.make_node("Mul", ["y", "y"], ["y2"]), helper.make_node("Mul", ["y2", "y"], ["y3"]),
         helper.make_node("ReduceSum", ["y3"], ["out"], keepdims=0)],
        "scatter",
        [helper.make_tensor_value_info("x", DOUBLE, (3, 5)), helper.make_tensor_value_info("u", DOUBLE, u_shape)],
        [helper.make_tensor_value_info("out", DOUBLE, ())],
        initializer=[helper.make_tensor("ind", TensorProto.INT64, ind.shape, ind.reshape(-1).tolist())])
    prog = gradflow.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    sig = prog.signature
    names = [a.array for a in sig.inputs]
    return names, u_shape, gradflow.value_and_grad(prog.graph, wrt=names, of=sig.outputs[0].array)


@pytest.mark.parametrize("name", sorted(SCATTERS))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_scatter_gradients_match_torch(name: str, seed: int) -> None:
    # overwritten elements of x get no gradient, each update the gradient where it lands (until 2026-12-04
    # the tasklet read the whole output and was refused)
    names, u_shape, fn = _scatter(name)
    rng = np.random.default_rng(seed)
    x, u = rng.standard_normal((3, 5)), rng.standard_normal(u_shape)
    value, grads = fn(**dict(zip(names, (x, u))))
    xt, ut = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(u).requires_grad_(True)
    want = (SCATTERS[name][1](xt, ut, torch.from_numpy(SCATTERS[name][2])) ** 3).sum()
    want.backward()
    assert float(np.asarray(value).reshape(-1)[0]) == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(grads[names[0]], xt.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads[names[1]], ut.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", sorted(NOT_DIFFERENTIABLE))
def test_a_not_differentiable_op_is_named_by_its_onnx_node(op: str) -> None:
    node, name = NOT_DIFFERENTIABLE[op]
    graph = helper.make_graph(
        [node, helper.make_node("ReduceSum", ["y"], ["out"], keepdims=0)],
        "not_differentiable", [helper.make_tensor_value_info("x", DOUBLE, (2, 5))],
        [helper.make_tensor_value_info("out", DOUBLE, ())],
        initializer=[helper.make_tensor("k", TensorProto.INT64, (1,), [2]),
                     helper.make_tensor("k2", TensorProto.INT64, (2, 1), [4, 0]),
                     helper.make_tensor("u", DOUBLE, (2, 1), [1.0, 2.0])])
    prog = gradflow.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    with pytest.raises(NotDifferentiableError, match=rf"ONNX node '{name}' \({op}\)"):
        gradflow.grad(prog.graph, wrt=prog.signature.inputs[0].array, of=prog.signature.outputs[0].array)
