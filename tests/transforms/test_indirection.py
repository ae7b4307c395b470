"""Gathers, scatters and tasklet statements beyond what the corpora check against torch: overwriting scatters
with duplicate indices (torch leaves them undefined; checked against finite differences of a sequential
reference), and the typed errors for what stays unsupported."""

from __future__ import annotations

import dace
import numpy as np
import pytest
from dace.sdfg import nodes as nd

import gradflow
from gradflow import NotDifferentiableError
from gradflow.transforms.indirection import LowerIndirection, indexed_connectors
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg

N, M = dace.symbol("N"), dace.symbol("M")
f64, i64 = dace.float64, dace.int64


@dace.program
def scatter_duplicates(A: f64[N], idx: i64[M], jdx: i64[M], V: f64[M], U: f64[M], W: f64[N], S: f64[1]):
    A[idx] = V
    for i in dace.map[0:M]:
        A[jdx[i]] = V[i] * U[i]
    S[0] = np.sum(A * A * W)


def _reference(A, idx, jdx, V, U, W) -> float:
    """The program run sequentially (the last write to an element wins)."""
    A = A.copy()
    for i in range(len(idx)):
        A[idx[i]] = V[i]
    for i in range(len(jdx)):
        A[jdx[i]] = V[i] * U[i]
    return float(np.sum(A * A * W))


def _central_differences(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(x)
    for k in range(x.size):
        up, down = x.copy(), x.copy()
        up.flat[k] += eps
        down.flat[k] -= eps
        out.flat[k] = (f(up) - f(down)) / (2 * eps)
    return out


def test_overwriting_scatters_with_duplicate_indices_credit_the_last_writer() -> None:
    rng = np.random.default_rng(3)
    n, m = 7, 5
    idx = np.array([4, 1, 4, 6, 1], dtype=np.int64)  # elements 4 and 1 written twice
    jdx = np.array([2, 5, 2, 2, 0], dtype=np.int64)  # element 2 written three times
    A, V, U, W = rng.normal(size=n), rng.normal(size=m), rng.normal(size=m), rng.normal(size=n)
    graph = gradflow.api.grad_graph(scatter_duplicates.to_sdfg(), ["A", "V", "U", "W"], "S")
    arrays = {"A": A.copy(), "idx": idx, "jdx": jdx, "V": V.copy(), "U": U.copy(), "W": W.copy(), "S": np.zeros(1),
              **{f"grad_{x}": np.full(s, np.nan) for x, s in (("A", n), ("V", m), ("U", m), ("W", n))}}
    compile_sdfg(graph)(**arrays, N=n, M=m)
    assert arrays["S"][0] == pytest.approx(_reference(A, idx, jdx, V, U, W), rel=1e-12)
    args = {"A": A, "idx": idx, "jdx": jdx, "V": V, "U": U, "W": W}
    expected = {x: _central_differences(lambda v, x=x: _reference(**{**args, x: v}), args[x]) for x in "AVUW"}
    for x in "AVUW":
        np.testing.assert_allclose(arrays[f"grad_{x}"], expected[x], rtol=1e-6, atol=1e-8, err_msg=x)


@dace.program
def read_modify_write(A: f64[N], idx: i64[M], S: f64[1]):
    for i in dace.map[0:M]:
        A[idx[i]] = A[idx[i]] * 2.0
    S[0] = np.sum(A)


def test_a_map_reading_and_overwriting_through_an_index_is_rejected() -> None:
    with pytest.raises(NotDifferentiableError, match="chosen by an index; iterations would race"):
        gradflow.grad(read_modify_write.to_sdfg(), wrt="A", of="S")


@dace.program
def frontend_scatter(A: f64[N], idx: i64[M], V: f64[M], S: f64[1]):
    A[idx] = V
    S[0] = np.sum(A)


def test_indexed_memlets_are_widened_to_the_whole_array() -> None:
    """The frontend gives `A[idx] = V` the memlet A[0:M]; the tape must see that any element may change."""
    def written(graph: Graph) -> list[str]:
        out = []
        for state in graph.sdfg.states():
            for node in state.nodes():
                if isinstance(node, nd.Tasklet) and indexed_connectors(node):
                    out += [str(e.data.subset) for e in state.out_edges(node)]
        return out

    graph = Graph.of(frontend_scatter.to_sdfg())
    assert written(graph) == ["0:M"]
    assert written(LowerIndirection()(graph).unwrap()) == ["0:N"]


def _conditional_plain_memlet() -> dace.SDFG:
    sdfg = dace.SDFG("conditional_plain")
    sdfg.add_array("X", [N], f64)
    sdfg.add_array("Y", [N], f64)
    sdfg.add_array("S", [1], f64)
    state = sdfg.add_state("s")
    state.add_mapped_tasklet("t", {"i": "0:N"}, {"x": dace.Memlet("X[i]")}, "if x > 0:\n    y = x",
                             {"y": dace.Memlet("Y[i]")}, external_edges=True)
    total = sdfg.add_state_after(state)
    total.add_mapped_tasklet("r", {"i": "0:N"}, {"y": dace.Memlet("Y[i]")}, "s = y",
                             {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)
    return sdfg


def test_an_output_left_undefined_on_some_path_is_rejected() -> None:
    with pytest.raises(NotDifferentiableError, match=r"tasklet 't' leaves output 'y' unassigned.*not dynamic"):
        gradflow.grad(_conditional_plain_memlet(), wrt="X", of="S")


@dace.program
def product(A: f64[N], S: f64[1]):
    S[0] = np.prod(A)


@dace.program
def median(A: f64[N], S: f64[1]):
    S[0] = np.median(A)


def test_np_prod_is_a_product_reduce() -> None:
    sdfg = product.to_sdfg()
    reduces = [n for n, _ in sdfg.all_nodes_recursive() if type(n).__name__ == "Reduce"]
    assert [dace.frontend.operations.detect_reduction_type(r.wcr) for r in reduces] == [
        dace.dtypes.ReductionType.Product]
    assert not any(isinstance(n, nd.Tasklet) and "numpy_prod" in n.code.as_string
                   for n, _ in sdfg.all_nodes_recursive())


def test_a_python_callback_is_named() -> None:
    with pytest.raises(NotDifferentiableError, match=r"tasklet 'callback_\w+'.*numpy_median.*Python callbacks"):
        gradflow.grad(median.to_sdfg(), wrt="A", of="S")


@dace.program
def gather_by_pairs(A: f64[N, 3], pairs: i64[M, 2], W: f64[M], S: f64[1]):
    out = np.ndarray([M], dtype=np.float64)
    for j in dace.map[0:M]:
        row = pairs[j, 0]
        col = pairs[j, 1]
        out[j] = A[row, col] * A[row, 2] * W[j]
    S[0] = np.sum(out)


def test_an_index_read_from_a_two_dimensional_index_array_is_lowered() -> None:
    # `pairs[j, 0]` on the interstate edge: its slice is a tuple, which the rewrite wrote as "(j, 0)", one
    # subscript DaCe's memlet parser rejected (a crash in lower_indirection, found writing GradBench's ba)
    A = np.arange(12.0).reshape(4, 3) / 7 + 0.5
    pairs = np.array([[0, 1], [3, 0], [0, 1], [2, 2]])
    W = np.array([0.3, -1.1, 0.7, 2.0])
    V = np.random.default_rng(2).standard_normal(A.shape)
    _, tangents = gradflow.value_and_jvp(gather_by_pairs, wrt="A", of="S")(A=A, pairs=pairs, W=W, S=np.zeros(1),
                                                                          tan_A=V)
    want = sum((V[r, c] * A[r, 2] + A[r, c] * V[r, 2]) * w for (r, c), w in zip(pairs, W))
    np.testing.assert_allclose(tangents["S"][0], want, rtol=1e-13)
    # reverse mode: the second index stays a symbol the map body's nested SDFG reads, so every iteration
    # reads all of A (was refused: "map iterations read overlapping parts of 'A'"); the reverse map over the
    # body's vjp runs its iterations one after another, each adding into grad_A in turn
    want_grad = np.zeros_like(A)
    for (r, c), w in zip(pairs, W):  # pairs repeat: (0, 1) twice
        want_grad[r, c] += A[r, 2] * w
        want_grad[r, 2] += A[r, c] * w
    _, got = gradflow.value_and_grad(gather_by_pairs, wrt="A", of="S")(A=A, pairs=pairs, W=W, S=np.zeros(1))
    np.testing.assert_allclose(got, want_grad, rtol=1e-13)
    sdfg = gradflow.grad(gather_by_pairs, wrt="A", of="S")
    reverse_maps = [n for n, state in sdfg.all_nodes_recursive() if isinstance(n, nd.MapEntry)
                    and n.label.startswith("rev_") and any(isinstance(m, nd.NestedSDFG)
                                                           for m in state.scope_children()[n])]
    assert reverse_maps and all(m.map.schedule == dace.ScheduleType.Sequential for m in reverse_maps)
