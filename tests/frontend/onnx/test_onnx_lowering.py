"""Lowering behaviour: elementwise ops come from the elementwise table, symbolic shapes, value inputs."""

from __future__ import annotations

import ast

import dace
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from gradflow.core.elementwise import elementwise_table
from gradflow.frontend.onnx.rules.elementwise import printer
from gradflow.frontend.onnx import InputMismatchError, OnnxError, UnsupportedOpError, load
from onnx_testutil import export, reference, single_node_model

F = TensorProto.FLOAT
TABLE_OPS = sorted(elementwise_table().by_onnx)


def _norm(code: str) -> str:
    return ast.unparse(ast.parse(code.strip()))


@pytest.mark.parametrize("op", TABLE_OPS)
def test_table_elementwise_op_matches_reference(op):
    """Every ONNX op named in rules/elementwise.toml lowers to its formula and matches ONNX's reference."""
    entry = elementwise_table().by_onnx[op]
    names = [f"in{k}" for k in range(len(entry.args))]
    shapes = [[3, 4], [4]][: len(names)] if len(names) > 1 else [[3, 4]]
    model = single_node_model(op, [(n, F, s) for n, s in zip(names, shapes)], [("out", F, [3, 4])], opset=20)
    rng = np.random.default_rng(abs(hash(op)) % 2**32)
    feeds = {
        n: rng.uniform(*entry.domain[a], size=s).astype(np.float32) for n, a, s in zip(names, entry.args, shapes)
    }
    prog = load(model)
    codes = [_norm(n.code.as_string) for n, _ in prog.sdfg.all_nodes_recursive() if isinstance(n, dace.nodes.Tasklet)]
    # float32 models print the formula with float32 literals and functions (`printer`)
    assert _norm(f"res = {printer(np.float32)(entry.expr)}") in codes, "tasklet code must be the table's formula"
    (got,) = prog(*feeds.values())
    (want,) = reference(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,attrs", [("Softmax", {"axis": -1}), ("LogSoftmax", {"axis": -1}),
                                      ("ReduceLogSumExp", {}), ("ReduceL2", {})])
def test_float32_normalisations_call_no_double_function(op, attrs):
    """A normalisation's code written once for every dtype (`exp(a - m) / s`) calls DaCe's type-generic
    functions in a float32 model: a bare `exp` compiles to C's double `exp` (a GPT's softmax ran in double)."""
    shape = [3, 5]
    out_shape = [3, 5] if "Softmax" in op else [1, 1]
    model = single_node_model(op, [("x", F, shape)], [("out", F, out_shape)], opset=13, **attrs)
    prog = load(model)
    codes = [n.code.as_string for n, _ in prog.sdfg.all_nodes_recursive() if isinstance(n, dace.nodes.Tasklet)]
    functions = [c for c in codes if any(f"{f}(" in c for f in ("exp", "log", "sqrt"))]
    assert functions and all("math." in c for c in functions), codes
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32) * 4
    (got,) = prog(x)
    (want,) = reference(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x_shape", [[3, 4, 6], [5, 6]])
def test_a_product_with_a_transposed_matrix_reads_the_matrix(x_shape):
    """MatMul(x, Transpose(W)), a Linear layer as exported: the product reads W with its transposed flag (no
    transposed copy of W is computed, nor of its gradient in reverse mode), and value and gradients hold."""
    import gradflow

    nodes = [helper.make_node("Transpose", ["W"], ["WT"], perm=[1, 0]), helper.make_node("MatMul", ["x", "WT"], ["y"]),
             helper.make_node("ReduceSumSquare", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape),
                                           helper.make_tensor_value_info("W", F, [7, 6])],
                              [helper.make_tensor_value_info("loss", F, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    prog = load(model)
    sdfg = prog.graph.sdfg
    gemms = [n for n, _ in sdfg.all_nodes_recursive() if type(n).__name__ == "Gemm"]
    w_array = prog.signature.inputs[1].array
    assert len(gemms) == 1 and gemms[0].transB
    state = next(st for st in sdfg.states() if gemms[0] in st.nodes())
    assert any(e.data.data == w_array for e in state.in_edges(gemms[0]))
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=x_shape).astype(np.float32), rng.normal(size=(7, 6)).astype(np.float32)
    np.testing.assert_allclose(prog(x, w)[0], np.sum((x @ w.T) ** 2), rtol=1e-5)
    y_array = prog.signature.outputs[0].array
    _, grads = gradflow.value_and_grad(prog.graph, wrt=[prog.signature.inputs[0].array, w_array], of=y_array)(
        **{prog.signature.inputs[0].array: x, w_array: w})
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ((xt @ wt.T) ** 2).sum().backward()
    np.testing.assert_allclose(grads[w_array], wt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[prog.signature.inputs[0].array], xt.grad.numpy(), rtol=1e-5, atol=1e-5)


class Flat(torch.nn.Module):
    def forward(self, x):
        y = x.reshape(x.shape[0], -1)  # Shape -> Gather -> Concat -> Reshape over a symbolic batch
        return torch.softmax(y, dim=1) * y.shape[1]


def test_shape_arithmetic_over_symbolic_batch():
    model = export(Flat(), (torch.randn(2, 3, 4),), dynamo=False, input_names=["x"],
                   dynamic_axes={"x": {0: "batch"}})
    assert {"Shape", "Reshape"} <= {n.op_type for n in model.graph.node}
    prog = load(model)
    assert len(prog.signature.symbols) == 1
    for batch in (2, 5):
        x = torch.randn(batch, 3, 4)
        (got,) = prog(x)
        torch.testing.assert_close(got, Flat()(x), rtol=1e-5, atol=1e-6)


def test_inputs_that_decide_shapes_specialise_per_value():
    model = single_node_model("Reshape", [("data", F, [2, 6]), ("shape", TensorProto.INT64, [2])],
                              [("out", F, ["a", "b"])])
    prog = load(model)
    assert prog.value_inputs == ("shape",)
    with pytest.raises(OnnxError, match="decide shapes"):
        prog.graph
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    for target in ([3, 4], [-1, 2], [12, 1]):
        shape = np.array(target, dtype=np.int64)
        (got,) = prog(data, shape)
        np.testing.assert_array_equal(got, reference(model, {"data": data, "shape": shape})[0])
    assert prog.specialize({"data": data, "shape": np.array([3, 4])}).graph.sdfg.arrays


def test_constants_and_integer_initializers_are_not_weights():
    w = helper.make_tensor("w", F, [4], [1.0, 2.0, 3.0, 4.0])
    idx = helper.make_tensor("idx", TensorProto.INT64, [2], [3, 0])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("cv", F, [], [0.5])),
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "c"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["y"], axis=0),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("y", F, [2])], initializer=[w, idx])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    prog = load(model)
    assert list(prog.weights.values())[0].tolist() == [1.0, 2.0, 3.0, 4.0] and len(prog.weights) == 1
    x = np.array([1, -1, 2, -2], np.float32)
    np.testing.assert_allclose(prog(x)[0], reference(model, {"x": x})[0])


def test_bfloat16_is_computed_in_float32_and_rounded_at_outputs():
    model = single_node_model("Mul", [("a", TensorProto.BFLOAT16, [5]), ("b", TensorProto.BFLOAT16, [5])],
                              [("c", TensorProto.BFLOAT16, [5])])
    prog = load(model)
    a = torch.tensor([1.5, -2.25, 3.0, 1e-3, 7.0], dtype=torch.bfloat16)
    b = torch.tensor([0.3, 1.7, -2.1, 5.0, 1.01], dtype=torch.bfloat16)
    (c,) = prog(a, b)
    assert c.dtype == torch.bfloat16
    assert torch.equal(c, a * b)  # one rounding of the float32 product, as torch does
    with pytest.raises(InputMismatchError, match="dtype"):
        prog(a.float(), b.float())


def _graph_model(nodes, inputs, outputs, initializers=(), opset: int = 18):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _dropout_model(seed=None):
    kw = {} if seed is None else {"seed": seed}
    return _graph_model(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], **kw)],
        [("x", F, [4, 50])], [("y", F, [4, 50]), ("mask", TensorProto.BOOL, [4, 50])],
        [helper.make_tensor("r", F, [], [0.3]), helper.make_tensor("t", TensorProto.BOOL, [], [True])],
    )


def test_training_dropout_with_a_seed_draws_the_reference_mask():
    model = _dropout_model(seed=7)
    prog = load(model)
    x = np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32)
    y, mask = prog(x)
    y_ref, mask_ref = reference(model, {"x": x})
    np.testing.assert_array_equal(mask, mask_ref)
    assert 0.5 < mask.mean() < 0.9  # ratio 0.3: about 70% kept
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(prog(x)[1], mask)  # a constant of the program: the same on every call


def test_training_dropout_without_a_seed_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="Dropout.*seed"):
        load(_dropout_model())


def test_bool_and_non_finite_constants():
    cond = helper.make_tensor("cv", TensorProto.BOOL, [4], [True, False, True, False])
    special = helper.make_tensor("sv", F, [4], [np.inf, -np.inf, np.nan, 1.0])
    model = _graph_model(
        [helper.make_node("Constant", [], ["c"], value=cond), helper.make_node("Constant", [], ["s"], value=special),
         helper.make_node("Where", ["c", "x", "s"], ["y"])],
        [("x", F, [4])], [("y", F, [4])],
    )
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    (got,) = load(model)(x)
    np.testing.assert_array_equal(got, reference(model, {"x": x})[0])
    np.testing.assert_array_equal(got, [1.0, -np.inf, 3.0, 1.0])


def _tasklet_reads(sdfg):
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.Tasklet):
            for e in state.in_edges(node):
                if not e.data.is_empty():
                    yield node, e.data


def test_known_gather_indices_padded_conv_and_pools_read_single_elements():
    """Gather with a constant index, a padded Conv (padded into a temporary) and pools whose windows stay
    inside the input read one element per memlet: plain dataflow the AD engine differentiates."""
    w = helper.make_tensor("w", F, [2, 3, 3, 3], np.linspace(-1, 1, 54).tolist())
    nodes = [
        helper.make_node("Constant", [], ["i"], value=helper.make_tensor("iv", TensorProto.INT64, [], [-1])),
        helper.make_node("Constant", [], ["j"], value=helper.make_tensor("jv", TensorProto.INT64, [1], [2])),
        helper.make_node("Gather", ["x", "i"], ["g"], axis=0),  # (3, 6, 6)
        helper.make_node("Gather", ["x", "j"], ["h"], axis=1),  # (2, 1, 6, 6)
        helper.make_node("Unsqueeze", ["g", "zero"], ["g4"]),
        helper.make_node("Conv", ["g4", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["h"], ["a"], kernel_shape=[3, 3]),
    ]
    model = _graph_model(nodes, [("x", F, [2, 3, 6, 6])], [("m", F, [1, 2, 3, 3]), ("a", F, [2, 1, 4, 4])],
                         [w, helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    prog = load(model)
    for tasklet, memlet in _tasklet_reads(prog.sdfg):
        assert not memlet.dynamic and memlet.subset.num_elements() == 1, (tasklet.label, str(memlet))
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    for got, want in zip(prog(x), reference(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _gemms(sdfg: dace.SDFG) -> int:
    """Nodes whose compiled code calls BLAS's matrix product."""
    from dace.libraries.blas import Gemm

    from gradflow.library.convolution import Convolution

    return sum(isinstance(n, (Gemm, Convolution)) for n, _ in sdfg.all_nodes_recursive())


@pytest.mark.parametrize("module, shape, on_blas", [
    (torch.nn.LSTM(3, 4, batch_first=True), (2, 5, 3), True),  # its bias of shape (1, 32) is added by a map
    (torch.nn.Linear(6, 5), (3, 6), True),
    (torch.nn.Linear(6, 5), (2, 3, 6), True),  # rows of a 3-D input gathered into one Gemm
    (torch.nn.Linear(6, 1), (3, 6), False),  # a (3, 1) product: DaCe's expansion mis-reads its layout
    # a 2-D Conv is a `Convolution` node, whose kernel passes its leading dimensions itself (so one output
    # channel is no (n, 1) product DaCe's expansion would mis-read); a 1-D one is im2col and a Gemm
    (torch.nn.Conv2d(2, 1, 3), (2, 2, 5, 5), True),
    (torch.nn.Conv2d(2, 3, 3), (2, 2, 5, 5), True),
    (torch.nn.Conv1d(2, 1, 3), (2, 2, 7), False),  # one output channel: an (n, 1) product
    (torch.nn.Conv1d(2, 3, 3), (2, 2, 7), True),
])
def test_which_products_run_on_blas(module, shape, on_blas):
    x = torch.randn(*shape)
    model = export(module, (x,), dynamo=False)
    prog = load(model)
    assert (_gemms(prog.sdfg) > 0) == on_blas
    for got, want in zip(prog(x.numpy()), reference(model, {model.graph.input[0].name: x.numpy()})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_what_runs_is_the_optimized_graph(monkeypatch):
    import gradflow.runtime.compile as rc
    from gradflow.optimize import optimized

    built = []
    real = rc.compile_sdfg

    def spy(program):
        built.append(program)
        return real(program)

    monkeypatch.setattr(rc, "compile_sdfg", spy)
    model = single_node_model("ReduceSum", [("x", F, [4, 6])], [("y", F, [4, 1])],
                              initializers=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    prog = load(model)
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    [got] = prog(x)
    np.testing.assert_allclose(got, x.sum(axis=1, keepdims=True), rtol=1e-6)
    want = optimized(prog.graph).fingerprint
    assert want != prog.graph.fingerprint  # the pipeline changes this graph (its sum is nested)
    assert [g.fingerprint for g in built] == [want]


def test_a_reshape_that_merges_or_splits_dimensions_has_affine_indices() -> None:
    # the map runs over the finer side of each group of dimensions; no integer division in either index,
    # so the adjoint adds into one gradient element per iteration (DaCe then needs no atomics)
    import sympy

    from gradflow.frontend.onnx.rules.tensor import refined_copy

    n = sympy.Symbol("N")
    merged = refined_copy((8, 32, 32), (256, 32))
    assert merged == ([("p0", 8), ("p1", 32), ("p2", 32)], ["p0", "p1", "p2"], ["p0*(32) + p1*(1)", "p2*(1)"])
    split = refined_copy((n, 8, 4, 8), (n, 8, 32))
    assert split[2] == ["p0*(1)", "p1*(1)", "p2*(8) + p3*(1)"] and split[1] == ["p0", "p1", "p2", "p3"]
    assert refined_copy((6,), (1, 2, 3, 1)) == ([("q1", 2), ("q2", 3)], ["q1*(3) + q2*(1)"], ["0", "q1", "q2", "0"])
    assert refined_copy((4, 6), (6, 4)) is None  # no common refinement: `reindex` with divisions


def _positions(shape, index, ranges) -> list[int]:
    """Row-major position in `shape` of the element `index` (strings over the ranges' names) names, at
    every point of `ranges`, in the map's order."""
    import itertools

    names = [n for n, _ in ranges]
    out = []
    for point in itertools.product(*(range(extent) for _, extent in ranges)):
        values = [eval(i, {}, dict(zip(names, point))) for i in index]  # noqa: S307 - our own index strings
        out.append(int(np.ravel_multi_index(values, shape)) if shape else 0)
    return out


@pytest.mark.parametrize("out_shape,in_shape", [((64, 64, 32), (64, 16, 128)), ((2, 12, 5), (2, 3, 20)),
                                                ((1, 6, 1, 8), (3, 16)), ((3, 4, 10), (12, 2, 5)), ((7,), (1, 7, 1))])
def test_a_reshape_regrouping_both_sides_runs_over_their_common_refinement(out_shape, in_shape) -> None:
    """`(T, B, H*D) -> (T, B*H, D)`, which `refined_copy` leaves to `reindex`'s divisions: the map runs over the
    common refinement, both indices affine, and pairs each element with the one at its own row-major
    position, every element once."""
    from gradflow.frontend.onnx.rules.tensor import common_refinement, refined_copy

    ranges, out_index, in_index = common_refinement(out_shape, in_shape)
    for index in (*out_index, *in_index):
        assert "//" not in index and "%" not in index
    size = int(np.prod(out_shape))
    outs, ins = _positions(out_shape, out_index, ranges), _positions(in_shape, in_index, ranges)
    assert outs == ins and sorted(outs) == list(range(size))
    if out_shape == (64, 64, 32):
        assert refined_copy(out_shape, in_shape) is None  # the case this exists for
    assert common_refinement((4, 6), (6, 4)) is None  # 4 does not divide 6: `reindex`


def test_a_regrouping_reshape_differentiates_as_torch() -> None:
    """Reshape (4, 6, 8) -> (4, 12, 4) then a weighted sum: value and gradient equal torch's, float64."""
    import gradflow

    d = TensorProto.DOUBLE
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"]), helper.make_node("Mul", ["y", "w"], ["z"]),
             helper.make_node("ReduceSum", ["z"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", d, [4, 6, 8]),
                                           helper.make_tensor_value_info("w", d, [4, 12, 4])],
                              [helper.make_tensor_value_info("loss", d, [])],
                              initializer=[helper.make_tensor("shape", TensorProto.INT64, [3], [4, 12, 4])])
    prog = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    rng = np.random.default_rng(7)
    x, w = rng.normal(size=(4, 6, 8)), rng.normal(size=(4, 12, 4))
    xa, wa = (p.array for p in prog.signature.inputs)
    value, grads = gradflow.value_and_grad(prog.graph, wrt=[xa, wa], of=prog.signature.outputs[0].array)(
        **{xa: x, wa: w})
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    loss = (xt.reshape(4, 12, 4) * wt).sum()
    loss.backward()
    np.testing.assert_allclose(np.asarray(value).reshape(-1)[0], loss.item(), rtol=1e-12)
    np.testing.assert_allclose(grads[xa], xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads[wa], wt.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_with_nans_orders_them_as_torch_does(largest: int) -> None:
    """A NaN counts as the largest value (torch's order), so every one of the K positions gets an index
    (the rank of each element is a strict total order)."""
    model = single_node_model("TopK", [("x", TensorProto.DOUBLE, [2, 6])],
                              [("v", TensorProto.DOUBLE, [2, 3]), ("i", TensorProto.INT64, [2, 3])],
                              initializers=[helper.make_tensor("k", TensorProto.INT64, (1,), [3])], largest=largest)
    x = np.array([[0.5, np.nan, -1.0, 2.0, np.nan, 0.25], [3.0, -2.0, 1.0, np.nan, 0.0, -0.5]])
    values, indices = load(model)(x)
    want = torch.topk(torch.from_numpy(x), 3, dim=-1, largest=bool(largest))
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(indices, want.indices.numpy())
