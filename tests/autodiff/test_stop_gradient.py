"""`gradflow_stop_gradient(x)` in tasklet code (what the ONNX `StopGradient` of gradflow's domain lowers to,
and torch's detach exported): the value of x, with no derivative in reverse mode, forward mode and second
order, checked against torch's `detach` on the same function."""

from __future__ import annotations

import copy

import dace
import numpy as np
import pytest
import sympy
import torch

import gradflow
from gradflow.core.stop_gradient import StopGradient, used
from gradflow.core.symbolic import derivative, print_code

N = 5


def _program() -> dace.SDFG:
    """y[i] = x[i] * stop(x[i]^2) + stop(sin(x[i])) * x[i]^2 (one tasklet), z[i] = stop(y[i]) (a tasklet of
    its own, as the ONNX lowering writes it), S = sum(y * z + y * y)."""
    sdfg = dace.SDFG("stopped")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    first = sdfg.add_state("first")
    first.add_mapped_tasklet(
        "f", {"i": f"0:{N}"}, {"a": dace.Memlet("x[i]")},
        "b = a * gradflow_stop_gradient(a * a) + gradflow_stop_gradient(sin(a)) * a * a",
        {"b": dace.Memlet("y[i]")}, external_edges=True)
    second = sdfg.add_state_after(first, "second")
    second.add_mapped_tasklet("stop", {"i": f"0:{N}"}, {"a": dace.Memlet("y[i]")}, "b = gradflow_stop_gradient(a)",
                              {"b": dace.Memlet("z[i]")}, external_edges=True)
    third = sdfg.add_state_after(second, "third")
    third.add_mapped_tasklet(
        "s", {"i": f"0:{N}"}, {"a": dace.Memlet("y[i]"), "c": dace.Memlet("z[i]")}, "b = a * c + a * a",
        {"b": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)
    return sdfg


def _torch(x: torch.Tensor) -> torch.Tensor:
    y = x * (x * x).detach() + torch.sin(x).detach() * x * x
    z = y.detach()
    return (y * z + y * y).sum()


def _arrays(x: np.ndarray) -> dict:
    return {"x": x.copy(), "y": np.zeros(N), "z": np.zeros(N), "S": np.zeros(1)}


@pytest.fixture(scope="module")
def program() -> dace.SDFG:
    return _program()


def test_the_stop_has_the_value_and_no_derivative():
    x = sympy.Symbol("x", real=True)
    expr = x * StopGradient(x ** 2)
    assert derivative(expr, x) == StopGradient(x ** 2)
    assert StopGradient(sympy.Float(2.5)) == sympy.Float(2.5)  # a constant has no gradient to stop
    assert StopGradient(StopGradient(x)) == StopGradient(x)
    assert print_code(StopGradient(x) * 2) == "(2 * gradflow_stop_gradient(x))"


@pytest.mark.parametrize("seed", [0, 1])
def test_reverse_mode_stops_where_torch_detaches(program, seed):
    x = np.random.default_rng(seed).uniform(-1.5, 1.5, N)
    value, gx = gradflow.value_and_grad(program, wrt="x", of="S")(**_arrays(x))
    t = torch.tensor(x, requires_grad=True)
    want = _torch(t)
    want.backward()
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(gx, t.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert not np.allclose(gx, torch.func.grad(lambda v: _torch_undetached(v))(torch.tensor(x)).numpy())


def _torch_undetached(x: torch.Tensor) -> torch.Tensor:
    y = x * (x * x) + torch.sin(x) * x * x
    return (y * y + y * y).sum()


def test_forward_mode_and_second_order_stop_where_torch_detaches(program):
    rng = np.random.default_rng(2)
    x, v = rng.uniform(-1.5, 1.5, N), rng.standard_normal(N)
    value, tangents = gradflow.value_and_jvp(program, wrt="x", of="S")(**_arrays(x), tan_x=v.copy())
    want, want_tangent = torch.func.jvp(_torch, (torch.tensor(x),), (torch.tensor(v),))
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(tangents["S"], want_tangent.item(), rtol=1e-12)
    hv = gradflow.hvp(program, wrt="x", of="S")(**_arrays(x), tan_x=v.copy())
    want_hv = torch.func.jvp(torch.func.grad(_torch), (torch.tensor(x),), (torch.tensor(v),))[1]
    np.testing.assert_allclose(hv["x"], want_hv.numpy(), rtol=1e-10, atol=1e-12)


def test_a_program_with_a_stop_compiles_with_plain_dace_after_lowering():
    # the ONNX rule puts the C++ definition into the SDFG's own global code
    import onnx
    from onnx import TensorProto, helper

    import gradflow.onnx

    nodes = [helper.make_node("Mul", ["x", "x"], ["xx"]),
             helper.make_node("StopGradient", ["xx"], ["s"], domain="gradflow"),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("gradflow", 1)])
    onnx.checker.check_model(model)
    prog = gradflow.onnx.load(model)
    sdfg = prog.graph.sdfg
    assert used(sdfg) and "gradflow_stop_gradient" in sdfg.global_code["frame"].as_string
    x = np.array([0.5, -1.0, 1.5, 2.0])
    (y,) = prog(x)
    np.testing.assert_allclose(y, x ** 3, rtol=1e-15)
    inputs, outputs = prog.signature.inputs, prog.signature.outputs
    plain, out = copy.deepcopy(sdfg), np.zeros(4)
    plain.name = "stop_gradient_plain_dace"
    plain.compile()(**{inputs[0].array: x.copy(), outputs[0].array: out})
    np.testing.assert_allclose(out, x ** 3, rtol=1e-15)


def _model(nodes, output_shape=(4,)):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(output_shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("gradflow", 1)])
    onnx.checker.check_model(model)
    return model


def test_a_stop_of_a_constant_folds_and_other_ops_of_gradflows_domain_are_refused():
    from onnx import helper

    import gradflow.onnx

    two = helper.make_tensor("two", 11, [1], [2.0])
    prog = gradflow.onnx.load(_model([
        helper.make_node("Constant", [], ["c"], value=two),
        helper.make_node("StopGradient", ["c"], ["s"], domain="gradflow"),
        helper.make_node("Mul", ["x", "s"], ["y"])]))
    assert not used(prog.graph.sdfg)  # nothing left to stop: the constant passed through while lowering
    x = np.array([0.5, -1.0, 1.5, 2.0])
    np.testing.assert_allclose(prog(x)[0], 2 * x, rtol=1e-15)
    with pytest.raises(gradflow.onnx.UnsupportedOpError, match="unsupported ONNX op 'Detach' \\(domain 'gradflow'"):
        gradflow.onnx.load(_model([helper.make_node("Detach", ["x"], ["y"], domain="gradflow")]))


M = dace.symbol("M")


@dace.program
def _scaled_by_stopped(x: dace.float64[M], S: dace.float64[1]):
    h = np.sin(x)
    S[0] = np.sum(h * gradflow.stop_gradient(h) + gradflow.stop_gradient(x[1:] * 2.0)[0] * x[0])


@dace.program
def _accumulator_stopped(x: dace.float64[M], S: dace.float64[1]):
    acc = 0.0
    for i in range(M):
        acc = acc + x[i] * gradflow.stop_gradient(x[i] * x[i]) + gradflow.stop_gradient(acc) * x[i]
    S[0] = acc


def _scaled_by_stopped_torch(x):
    h = torch.sin(x)
    return (h * h.detach() + (x[1:] * 2.0).detach()[0] * x[0]).sum()


def _accumulator_stopped_torch(x):
    acc = torch.zeros((), dtype=x.dtype)
    for i in range(x.shape[0]):
        acc = acc + x[i] * (x[i] * x[i]).detach() + acc.detach() * x[i]
    return acc


@pytest.mark.parametrize("forwarding", [gradflow.STORE_ALL, gradflow.RECOMPUTE_ALL], ids=["store", "recompute"])
@pytest.mark.parametrize("program, reference", [(_scaled_by_stopped, _scaled_by_stopped_torch),
                                                (_accumulator_stopped, _accumulator_stopped_torch)],
                         ids=["arrays", "loop"])
def test_gradflow_stop_gradient_in_a_dace_program_is_torchs_detach(program, reference, forwarding):
    x = np.random.default_rng(3).uniform(-1.5, 1.5, 7)
    value, gx = gradflow.value_and_grad(program, wrt="x", of="S", forwarding=forwarding)(x=x.copy(), S=np.zeros(1))
    t = torch.tensor(x, requires_grad=True)
    want = reference(t)
    want.backward()
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(gx, t.grad.numpy(), rtol=1e-12, atol=1e-14)
    assert gradflow.stop_gradient(x) is x  # outside a DaCe program: the argument itself


def test_an_array_read_only_through_a_stop_carries_no_gradient(program):
    """z = stop(y) reads y only through the stop: activity gives z no gradient buffer and reverses nothing
    for it (the softmax's max is such a read)."""
    grad_sdfg = gradflow.grad(program, wrt="x", of="S", optimize=False)
    gradients = [name for name in grad_sdfg.arrays if name.startswith(("grad_", "gradflow_g_"))]
    assert any(name.endswith("_y") for name in gradients), gradients  # y carries one: S reads it directly
    assert not any(name.endswith("_z") for name in gradients), gradients


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_a_softmax_reverses_no_max_and_equals_torch_at_ties(log):
    """Softmax reads its max through a stop (the result does not depend on it): the gradient program has no
    gradient of the max, and the gradient equals torch's in float64, also where a row's maximum is tied."""
    from onnx import TensorProto, helper

    import gradflow.onnx

    op = "LogSoftmax" if log else "Softmax"
    nodes = [helper.make_node(op, ["x"], ["y"], axis=-1), helper.make_node("Mul", ["y", "w"], ["z"]),
             helper.make_node("ReduceSum", ["z"], ["loss"], keepdims=0)]
    d = TensorProto.DOUBLE
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", d, [3, 5]),
                                           helper.make_tensor_value_info("w", d, [3, 5])],
                              [helper.make_tensor_value_info("loss", d, [])])
    prog = gradflow.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    xa, wa = (p.array for p in prog.signature.inputs)
    of = prog.signature.outputs[0].array
    grad_sdfg = gradflow.grad(prog.graph, wrt=xa, of=of, optimize=False)
    assert not [n for n in grad_sdfg.arrays if "max" in n and n.startswith(("grad_", "gradflow_g_"))]
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    x[0, 1] = x[0, 3] = x[0].max() + 0.5  # a tie for the maximum
    x[2] = 0.25  # a row of equal elements
    value, grads = gradflow.value_and_grad(prog.graph, wrt=[xa], of=of)(**{xa: x.copy(), wa: w})
    xt = torch.tensor(x, requires_grad=True)
    f = torch.log_softmax if log else torch.softmax
    want = (f(xt, dim=-1) * torch.tensor(w)).sum()
    want.backward()
    np.testing.assert_allclose(np.asarray(value).reshape(-1)[0], want.item(), rtol=1e-12)
    np.testing.assert_allclose(grads[xa], xt.grad.numpy(), rtol=1e-12, atol=1e-15)
