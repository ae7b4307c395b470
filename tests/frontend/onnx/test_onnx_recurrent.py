"""ONNX's RNN, GRU and LSTM nodes with the attributes torch's exporter never writes (GRU without
`linear_before_reset`, chosen activations, the reverse direction, batch-first `layout`, no bias, an initial
state), against a NumPy transcription of the ONNX specification's equations; and the gradient of a loss
through two of them against central differences of that transcription. The models from torch's own
modules (nn.GRU, nn.RNN, stacked and bidirectional) are checked against torch in `test_onnx_zoo.py`.

Each node structure is lowered and compiled once; hypothesis varies the data.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import gradflow
import gradflow.onnx

T, B, I, H = 3, 2, 3, 2
ACTS = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh, "relu": lambda v: np.maximum(v, 0)}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _step(op: str, acts, x, h, c, w, r, wb, rb, before_reset: bool):
    """One step of one direction, as the ONNX specification writes it (gates in ONNX's order)."""
    f = [ACTS[a.lower()] for a in acts]
    if op == "RNN":
        return f[0](x @ w.T + h @ r.T + wb + rb), None
    if op == "GRU":
        (wz, wr, wh), (rz, rr, rh) = np.split(w, 3), np.split(r, 3)
        (wbz, wbr, wbh), (rbz, rbr, rbh) = np.split(wb, 3), np.split(rb, 3)
        z = f[0](x @ wz.T + h @ rz.T + wbz + rbz)
        rg = f[0](x @ wr.T + h @ rr.T + wbr + rbr)
        if before_reset:
            n = f[1](x @ wh.T + rg * (h @ rh.T + rbh) + wbh)
        else:
            n = f[1](x @ wh.T + (rg * h) @ rh.T + rbh + wbh)
        return (1 - z) * n + z * h, None
    gi, go, gf, gc = np.split(x @ w.T + h @ r.T + wb + rb, 4, axis=-1)
    cn = f[0](gf) * c + f[0](gi) * f[1](gc)
    return f[0](go) * f[2](cn), cn


def _reference(op: str, attrs: dict, x, w, r, b, h0):
    """Y and Y_h of the node (layout 0 or 1), direction by direction."""
    layout, direction = attrs.get("layout", 0), attrs.get("direction", "forward")
    xs = x.transpose(1, 0, 2) if layout else x
    D = 2 if direction == "bidirectional" else 1
    n = len(DEFAULTS[op])
    acts = attrs.get("activations", DEFAULTS[op] * D)
    G = GATES[op]
    ys, last = [], []
    for d in range(D):
        backward = direction == "reverse" or d == 1
        h = np.zeros((x.shape[1 - layout], H)) if h0 is None else (h0.transpose(1, 0, 2) if layout else h0)[d]
        c = np.zeros_like(h)
        bias = np.zeros(2 * G * H) if b is None else b[d]
        out = [None] * xs.shape[0]
        for t in (reversed(range(xs.shape[0])) if backward else range(xs.shape[0])):
            h, c = _step(op, acts[d * n:(d + 1) * n], xs[t], h, c, w[d], r[d], bias[:G * H], bias[G * H:],
                         bool(attrs.get("linear_before_reset", 0)))
            out[t] = h
        ys.append(np.stack(out))
        last.append(h)
    y, yh = np.stack(ys, axis=1), np.stack(last)
    return (y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2)) if layout else (y, yh)


#: id -> (op, attributes, with bias, with initial_h)
CASES = {
    "gru_reset_first": ("GRU", {}, True, True),
    "gru_linear_before_reset_reverse": ("GRU", {"linear_before_reset": 1, "direction": "reverse"}, False, False),
    "gru_bidirectional_relu": ("GRU", {"direction": "bidirectional",
                                       "activations": ["Sigmoid", "Tanh", "Sigmoid", "Relu"]}, True, False),
    "rnn_bidirectional_batch_first": ("RNN", {"direction": "bidirectional", "layout": 1,
                                              "activations": ["Relu", "Sigmoid"]}, True, True),
    "lstm_relu_cell": ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, True, False),
}
#: the cases whose gradient is checked as well
GRADIENTS = ("gru_reset_first", "rnn_bidirectional_batch_first")


def _shapes(op: str, attrs: dict) -> dict[str, tuple]:
    D = 2 if attrs.get("direction") == "bidirectional" else 1
    G = GATES[op]
    batch_first = attrs.get("layout", 0)
    return {"X": (B, T, I) if batch_first else (T, B, I), "W": (D, G * H, I), "R": (D, G * H, H),
            "B": (D, 2 * G * H), "initial_h": (B, D, H) if batch_first else (D, B, H)}


def _model(case: str, loss: bool):
    """The node alone (outputs Y, Y_h), or followed by loss = sum(Y * C) (C an input)."""
    op, attrs, with_bias, with_h0 = CASES[case]
    shapes = _shapes(op, attrs)
    names = ["X", "W", "R", "B" if with_bias else "", "", "initial_h" if with_h0 else ""]
    inputs = [n for n in names if n]
    node = helper.make_node(op, names, ["Y", "Y_h"], hidden_size=H, **attrs)
    y_shape = (B, T, len(shapes["W"]) and shapes["W"][0], H) if attrs.get("layout") else (T, shapes["W"][0], B, H)
    nodes, outs = [node], [("Y", y_shape), ("Y_h", shapes["initial_h"])]
    if loss:
        nodes += [helper.make_node("Mul", ["Y", "C"], ["YC"]), helper.make_node("ReduceSum", ["YC"], ["loss"],
                                                                                 keepdims=0)]
        inputs.append("C")
        shapes["C"] = y_shape
        outs = [("loss", ())]
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(n, TensorProto.DOUBLE, shapes[n])
                                            for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, inputs, shapes


def _data(case: str, seed: int, loss: bool) -> dict[str, np.ndarray]:
    _, inputs, shapes = _model(case, loss)
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1, 1, shapes[n]) for n in inputs}


def _reference_of(case: str, feeds: dict):
    op, attrs, _, _ = CASES[case]
    return _reference(op, attrs, feeds["X"], feeds["W"], feeds["R"], feeds.get("B"), feeds.get("initial_h"))


@functools.cache
def _program(case: str):
    return gradflow.onnx.load(_model(case, loss=False)[0])


@pytest.mark.parametrize("case", list(CASES))
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_node_matches_the_specification(case: str, seed: int) -> None:
    prog = _program(case)
    feeds = _data(case, seed, loss=False)
    y, yh = prog(*(feeds[p.onnx_name] for p in prog.signature.inputs))
    want_y, want_yh = _reference_of(case, feeds)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(yh, want_yh, rtol=1e-12, atol=1e-13)


@functools.cache
def _gradient(case: str):
    prog = gradflow.onnx.load(_model(case, loss=True)[0])
    sig = prog.signature
    wrt = [p.array for p in sig.inputs if p.onnx_name != "C"]
    return prog, gradflow.value_and_grad(prog.graph, wrt=wrt, of=sig.outputs[0].array)


@pytest.mark.parametrize("case", GRADIENTS)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_gradient_matches_central_differences(case: str, seed: int) -> None:
    prog, fn = _gradient(case)
    feeds = _data(case, seed, loss=True)

    def loss(values: dict) -> float:
        return float(np.sum(_reference_of(case, values)[0] * values["C"]))

    value, grads = fn(**{p.array: feeds[p.onnx_name] for p in prog.signature.inputs})
    assert float(np.asarray(value).reshape(-1)[0]) == pytest.approx(loss(feeds), rel=1e-12)
    eps = 1e-6
    for port in prog.signature.inputs:
        if port.onnx_name == "C":
            continue
        want = np.zeros_like(feeds[port.onnx_name])
        for k in np.ndindex(want.shape):
            up, down = ({**feeds, port.onnx_name: feeds[port.onnx_name].copy()} for _ in range(2))
            up[port.onnx_name][k] += eps
            down[port.onnx_name][k] -= eps
            want[k] = (loss(up) - loss(down)) / (2 * eps)
        np.testing.assert_allclose(grads[port.array], want, rtol=1e-6, atol=1e-8,
                                   err_msg=f"{case}: gradient of {port.onnx_name}")
