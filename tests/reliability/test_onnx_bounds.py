"""Indices read from data never read or write out of bounds: every ONNX op whose lowering indexes with data
checks the index in the generated code; an index out of range raises `IndexOutOfRangeError` naming the
node and the index, on every path that runs the lowered model (an `OnnxProgram` call, `value_and_grad`,
`gradflow.torch.function`); negative indices wrap as ONNX says (compared with ONNX's reference evaluator).

Each model compiles once (cached); hypothesis varies the index data. `test_hostile_indices_in_a_subprocess`
runs every out-of-bounds case in a fresh process with indices far outside the data, where a read or write
through them would crash: the process must exit normally, each case with the typed error.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import attrs
import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import gradflow
import gradflow.onnx
from gradflow.core.errors import GradflowError, IndexOutOfRangeError

F, I64 = TensorProto.FLOAT, TensorProto.INT64
X = np.arange(15, dtype=np.float32).reshape(5, 3) - 7.0


def _model(node: onnx.NodeProto, inputs, outputs, opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph([node], f"{node.op_type}_graph", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@attrs.frozen
class Case:
    """One op indexing `X` (5 x 3) with data: `make()` the model, `feeds(indices)` its inputs; `shape` of
    the indices; `extent` the size of the axis they index (for drawing in- and out-of-range values)."""

    name: str
    make: Callable[[], onnx.ModelProto]
    feeds: Callable[[np.ndarray], dict]
    shape: tuple[int, ...]
    extent: int
    wraps: bool = True  # negative indices count from the end (class labels do not)


CASES = {c.name: c for c in [
    Case("Gather",
         lambda: _model(helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="gather_node"),
                        [("x", F, [5, 3]), ("i", I64, [4])], [("y", F, [4, 3])]),
         lambda i: {"x": X, "i": i}, (4,), 5),
    Case("GatherElements",
         lambda: _model(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="gather_elements_node"),
                        [("x", F, [5, 3]), ("i", I64, [5, 2])], [("y", F, [5, 2])]),
         lambda i: {"x": X, "i": i}, (5, 2), 3),
    Case("GatherND",
         lambda: _model(helper.make_node("GatherND", ["x", "i"], ["y"], name="gather_nd_node"),
                        [("x", F, [5, 3]), ("i", I64, [3, 1])], [("y", F, [3, 3])]),
         lambda i: {"x": X, "i": i}, (3, 1), 5),
    Case("ScatterElements",
         lambda: _model(helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0, reduction="add",
                                         name="scatter_elements_node"),
                        [("x", F, [5, 3]), ("i", I64, [2, 3]), ("u", F, [2, 3])], [("y", F, [5, 3])]),
         lambda i: {"x": X, "i": i, "u": np.full((2, 3), 2.0, np.float32)}, (2, 3), 5),
    Case("ScatterND",
         lambda: _model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add", name="scatter_nd_node"),
                        [("x", F, [5, 3]), ("i", I64, [2, 1]), ("u", F, [2, 3])], [("y", F, [5, 3])]),
         lambda i: {"x": X, "i": i, "u": np.full((2, 3), 2.0, np.float32)}, (2, 1), 5),
    Case("SoftmaxCrossEntropyLoss",
         lambda: _model(helper.make_node("SoftmaxCrossEntropyLoss", ["x", "i"], ["y"], reduction="none",
                                         name="loss_node"),
                        [("x", F, [5, 3]), ("i", I64, [5])], [("y", F, [5])]),
         lambda i: {"x": X, "i": i}, (5,), 3, wraps=False),
]}


@functools.cache
def program(name: str) -> gradflow.onnx.OnnxProgram:
    return gradflow.onnx.load(CASES[name].make())


def _first_bad(case: Case, indices: np.ndarray) -> int | None:
    lo = -case.extent if case.wraps else 0
    bad = indices[(indices < lo) | (indices >= case.extent)]
    return None if bad.size == 0 else int(bad.reshape(-1)[0])


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_indices_wrap_or_raise(name, data):
    """In-range indices (negative ones included) give what ONNX's reference evaluator gives; any index out
    of range raises IndexOutOfRangeError naming the node and that index."""
    case = CASES[name]
    e = case.extent
    values = data.draw(st.lists(st.integers(-2 * e, 2 * e - 1), min_size=int(np.prod(case.shape)),
                                max_size=int(np.prod(case.shape))))
    indices = np.array(values, dtype=np.int64).reshape(case.shape)
    feeds = case.feeds(indices)
    bad = _first_bad(case, indices)
    if bad is None:
        (got,) = program(name)(**feeds)
        (want,) = ReferenceEvaluator(case.make()).run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        return
    with pytest.raises(IndexOutOfRangeError) as info:
        program(name)(**feeds)
    text = str(info.value)
    assert case.name in text and f"'{case.make().graph.node[0].name}'" in text, text
    flat = indices.reshape(-1)
    lo = -e if case.wraps else 0
    assert any(f"index {int(v)} " in text for v in flat if not lo <= v < e), text


def test_constant_indices_out_of_range_are_rejected_while_loading():
    data = helper.make_tensor("idx", I64, [2], [1, 9])
    node = helper.make_node("Gather", ["x", "idx"], ["y"], name="const_gather")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [5, 3])],
                              [helper.make_tensor_value_info("y", F, [2, 3])], initializer=[data])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(gradflow.onnx.InvalidNodeError, match="const_gather.*index 9 .*out of range"):
        gradflow.onnx.load(model)


def test_a_slice_of_a_symbolic_dim_stays_inside_the_input():
    """Slice bounds are clamped to the extent for every value of its symbol (x[1:4] of 2 elements is 1
    element), so no element past the input is read."""
    starts, ends = helper.make_tensor("s", I64, [1], [1]), helper.make_tensor("e", I64, [1], [4])
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, ["n"])], [helper.make_tensor_value_info("y", F, ["m"])],
                              initializer=[starts, ends])
    prog = gradflow.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    for n in (6, 2, 1):
        x = np.arange(n, dtype=np.float32) + 1
        (y,) = prog(x)
        np.testing.assert_array_equal(y, x[1:4])


# -- the differentiation paths check the flag too -----------------------------------------------------------
def _picking_model() -> onnx.ModelProto:
    """s = sum(Gather(x, i) * w): differentiable with respect to the weight w; x is indexed with data."""
    w = onnx.numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], name="pick"), helper.make_node("Mul", ["g", "w"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["s"], keepdims=0)]
    graph = helper.make_graph(nodes, "pick", [helper.make_tensor_value_info("x", F, [5, 3]),
                                              helper.make_tensor_value_info("i", I64, [4])],
                              [helper.make_tensor_value_info("s", F, [])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@functools.cache
def picking():
    prog = gradflow.onnx.load(_picking_model())
    sig = prog.signature
    (w,) = prog.weights
    return prog, sig.inputs[0].array, sig.inputs[1].array, w, sig.outputs[0].array


def test_value_and_grad_raises_for_an_index_out_of_range():
    prog, x, i, w, s = picking()
    f = gradflow.value_and_grad(prog.graph, wrt=[w], of=s)
    weight = np.array(prog.weights[w])
    good = np.array([0, -1, 2, -5])
    value, grads = f(**{x: X, i: good, w: weight})
    np.testing.assert_allclose(grads[w], X[good])  # d(sum(X[i] * w)) / dw = X[i], negative indices wrapped
    np.testing.assert_allclose(value, float((X[good] * weight).sum()), rtol=1e-6)
    with pytest.raises(IndexOutOfRangeError) as info:
        f(**{x: X, i: np.array([0, 1, 5, 2]), w: weight})
    assert "'pick'" in str(info.value) and "index 5 " in str(info.value)


@pytest.mark.parametrize("route", ["graph", "vjp"])
def test_torch_function_raises_for_an_index_out_of_range(route):
    import gradflow.torch as gt

    prog, x, i, w, s = picking()
    program = prog.graph if route == "graph" else gradflow.vjp(prog.graph, wrt=[w], of=[s])
    f = gt.function(program, inputs=[x, i, w], outputs=[s], wrt=[w] if route == "graph" else None)
    assert f.outputs == (s,)
    weight = torch.tensor(np.array(prog.weights[w]), requires_grad=True)
    good = torch.tensor([0, -1, 2, -5])
    y = f(torch.from_numpy(X), good, weight)
    y.sum().backward()
    torch.testing.assert_close(weight.grad, torch.from_numpy(X)[good])
    with pytest.raises(IndexOutOfRangeError) as info:
        f(torch.from_numpy(X), torch.tensor([0, 1, -6, 2]), weight)
    assert "'pick'" in str(info.value) and "index -6 " in str(info.value)


# -- hostile indices, each model in a fresh process ------------------------------------------------------------
#: Indices far outside the 5 x 3 data: a read or a write through one would leave the process's memory.
HOSTILE = {
    "Gather": np.array([0, 1 << 40, 2, 3]),
    "GatherElements": np.array([[0, 1]] * 4 + [[-(1 << 40), 0]]),
    "GatherND": np.array([[0], [1 << 41], [1]]),
    "ScatterElements": np.array([[0, 1, 2], [1 << 40, 0, -(1 << 40)]]),
    "ScatterND": np.array([[-(1 << 42)], [1]]),
    "SoftmaxCrossEntropyLoss": np.array([0, 1, 1 << 40, 2, 0]),
}


def run_hostile() -> None:
    """Subprocess entry: run every hostile case, printing '<case> <error type>' (or 'NO ERROR')."""
    for name in sorted(HOSTILE):
        print(f"start {name}", flush=True)
        try:
            program(name)(**CASES[name].feeds(HOSTILE[name]))
        except GradflowError as err:
            print(f"done {name} {type(err).__name__}", flush=True)
        else:
            print(f"done {name} NO ERROR", flush=True)


def test_hostile_indices_in_a_subprocess():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), *(p for p in sys.path if p)])}
    proc = subprocess.run([sys.executable, "-c", "from tests.reliability.test_onnx_bounds import run_hostile; "
                           "run_hostile()"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    started = [line.split()[1] for line in lines if line.startswith("start ")]
    assert proc.returncode == 0, (f"the process ended with {proc.returncode} (a signal if negative) while running "
                                  f"{started[-1] if started else '?'}:\n{proc.stderr[-3000:]}")
    done = dict(line.split()[1:3] for line in lines if line.startswith("done "))
    assert done == {name: "IndexOutOfRangeError" for name in HOSTILE}, proc.stdout
