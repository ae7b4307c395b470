"""`join_copy_states`: the state that copies a map's temporary into an array joins the map's state (then
`write_in_place` removes the copy), unless something in the map's state reads the array without being
ordered before the map's result. Values equal numpy's; the gradient of the llsq-shaped program, whose
forward loop is joined, written in place and interchanged, equals torch's."""

from __future__ import annotations

import dace
import numpy as np
import torch

import gradflow
from gradflow.api import grad_graph
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE, JoinCopyStates
from gradflow.optimize.copy_states import _joinable
from gradflow.runtime.compile import compile_sdfg
from tests.optimize.test_loop_interchange import _loops_in_maps

N = dace.symbol("N")


def _update(with_reader: bool) -> dace.SDFG:
    """State A: a map t = y + 1 (and, `with_reader`, a map b = 2 y beside it, not ordered before t's node);
    state B: the copy t -> y. As reverse mode leaves `y[:] = y + 1`, one operation per state."""
    sdfg = dace.SDFG(f"update_{int(with_reader)}")
    sdfg.add_array("y", [N], dace.float64)
    sdfg.add_array("b", [N], dace.float64)
    sdfg.add_transient("t", [N], dace.float64)
    first = sdfg.add_state("update")
    y = first.add_read("y")
    first.add_mapped_tasklet("plus", {"i": "0:N"}, {"a": dace.Memlet("y[i]")}, "o = a + 1",
                             {"o": dace.Memlet("t[i]")}, input_nodes={"y": y}, external_edges=True)
    if with_reader:
        first.add_mapped_tasklet("twice", {"i": "0:N"}, {"a": dace.Memlet("y[i]")}, "o = 2 * a",
                                 {"o": dace.Memlet("b[i]")}, input_nodes={"y": y}, external_edges=True)
    second = sdfg.add_state_after(first, "copy")
    second.add_nedge(second.add_read("t"), second.add_write("y"), dace.Memlet("t[0:N] -> [0:N]"))
    sdfg.validate()
    return sdfg


def _pairs(sdfg: dace.SDFG) -> int:
    return sum(1 for e in sdfg.edges() if isinstance(e.src, dace.SDFGState) and isinstance(e.dst, dace.SDFGState)
               and _joinable(e.src, e.dst))


def test_a_copy_state_joins_the_map_it_copies() -> None:
    sdfg = _update(with_reader=False)
    assert _pairs(sdfg) == 1
    joined = JoinCopyStates()(Graph.of(sdfg)).unwrap()
    assert len(list(joined.sdfg.states())) == 1
    y = np.random.default_rng(1).normal(size=6)
    got = y.copy()
    compile_sdfg(joined.sdfg)(y=got, b=np.zeros(6), N=6)
    np.testing.assert_allclose(got, y + 1, rtol=1e-15)


def test_a_reader_of_the_old_value_beside_the_map_keeps_the_states_apart() -> None:
    # joined, `twice` would not be ordered before the copy into y: it could read the new y
    graph = Graph.of(_update(with_reader=True))
    assert _pairs(graph.sdfg) == 0
    assert JoinCopyStates()(graph).unwrap() is graph


N2, M2 = dace.symbol("N2"), dace.symbol("M2")


@dace.program
def column_powers(t: dace.float64[N2], W: dace.float64[N2, M2], S: dace.float64[1]):
    P = np.ndarray([N2, M2], dtype=np.float64)
    P[:, 0] = 1.0
    for j in range(1, M2):
        P[:, j] = P[:, j - 1] * t
    S[0] = np.sum(P * W)


def before_join() -> Graph:
    """The gradient (in W) of `column_powers`, optimized by the passes of `OPTIMIZE` before `join_copy_states`."""
    names = [step.name for step in OPTIMIZE.steps]
    return grad_graph(column_powers, "W", "S", None, None, gradflow.STORE_ALL,
                      Pipeline(OPTIMIZE.steps[:names.index("join_copy_states")]))


def joinable_pairs(graph: Graph) -> int:
    return sum(_pairs(region) for sdfg in graph.sdfg.all_sdfgs_recursive()
               for region in sdfg.all_control_flow_regions())


def test_the_gradients_forward_loop_is_joined_and_its_gradient_equals_torchs() -> None:
    assert joinable_pairs(before_join()) > 0
    optimized = grad_graph(column_powers, "W", "S", None, None, gradflow.STORE_ALL, True)
    assert _loops_in_maps(optimized) == 1  # joined, written in place, then interchanged
    rng = np.random.default_rng(4)
    n, m = 8, 5
    t, W = rng.uniform(-1.3, 1.3, n), rng.normal(size=(n, m))
    value, grad_w = gradflow.value_and_grad(column_powers, wrt="W", of="S")(t=t, W=W.copy(), N2=n, M2=m)
    Wt = torch.tensor(W, requires_grad=True)
    powers = torch.tensor(t)[:, None] ** torch.arange(m, dtype=torch.float64)[None, :]
    total = (powers * Wt).sum()
    total.backward()
    np.testing.assert_allclose(value, total.item(), rtol=1e-12)
    np.testing.assert_allclose(grad_w, Wt.grad.numpy(), rtol=1e-12)
