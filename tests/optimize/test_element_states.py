"""`join_elementwise_states`: a state of element-wise maps joins the state before it when one of its maps
reads a same-range map's result there, so that `fuse_maps` fuses the two; it is left apart when joining
could reorder a write and another access (the later state writes what the earlier one touches, or the
earlier state has two nodes of the array read), and when there is nothing to fuse. Values equal numpy's;
the gradient of a corpus program whose reverse sweep is joined equals torch's."""

from __future__ import annotations

import dace
import numpy as np
import torch

import gradflow
from gradflow.analysis.access import successive_states
from gradflow.api import grad_graph
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE, FuseMaps, JoinElementwiseStates
from gradflow.optimize.element_states import _joinable
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.corpus import loops

N = dace.symbol("N")


def _two_states(kind: str) -> dace.SDFG:
    """State A: t = 2 y over 0:N; state B: a map over `0:N` reading t (`kind` "plain": z = t + 1;
    "overwrites": y = t + 1, writing what A reads; "shifted": z[0:N-1] = t[1:N], another range), or A with
    a second node of t ("two_nodes")."""
    sdfg = dace.SDFG(f"two_states_{kind}")
    for name in ("y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    sdfg.add_transient("t", [N], dace.float64)
    first = sdfg.add_state("double")
    first.add_mapped_tasklet("double", {"i": "0:N"}, {"a": dace.Memlet("y[i]")}, "o = 2 * a",
                             {"o": dace.Memlet("t[i]")}, external_edges=True)
    if kind == "two_nodes":
        first.add_nedge(first.add_read("t"), first.add_write("z"), dace.Memlet("t[0:N] -> [0:N]"))
    second = sdfg.add_state_after(first, "plus")
    target = "y" if kind == "overwrites" else "z"
    if kind == "shifted":
        second.add_mapped_tasklet("shift", {"i": "0:N-1"}, {"a": dace.Memlet("t[i + 1]")}, "o = a + 1",
                                  {"o": dace.Memlet("z[i]")}, external_edges=True)
    else:
        second.add_mapped_tasklet("plus", {"i": "0:N"}, {"a": dace.Memlet("t[i]")}, "o = a + 1",
                                  {"o": dace.Memlet(f"{target}[i]")}, external_edges=True)
    sdfg.validate()
    return sdfg


def joinable_pairs(graph: Graph) -> int:
    """Pairs of states the pass would join (leaving out empty states), over every SDFG of `graph`."""
    return sum(1 for sdfg in graph.sdfg.all_sdfgs_recursive() for _, first, second in successive_states(sdfg)
               if _joinable(first, second))


def _maps(graph: Graph) -> int:
    return sum(isinstance(n, dace.nodes.MapEntry) for n, _ in graph.sdfg.all_nodes_recursive())


def test_a_consumer_state_joins_and_its_map_fuses_with_the_producer() -> None:
    graph = Graph.of(_two_states("plain"))
    assert joinable_pairs(graph) == 1
    joined = JoinElementwiseStates()(graph).unwrap()
    assert len(list(joined.sdfg.states())) == 1 and joinable_pairs(joined) == 0
    fused = FuseMaps()(joined).unwrap()
    assert _maps(fused) == 1  # one pass over memory where there were two
    y = np.random.default_rng(2).normal(size=7)
    z = np.zeros(7)
    compile_sdfg(fused.sdfg)(y=y.copy(), z=z, N=7)
    np.testing.assert_allclose(z, 2 * y + 1, rtol=1e-15)


def test_states_whose_join_could_reorder_an_access_stay_apart() -> None:
    # "overwrites": joined, nothing would order B's write of y after A's read of y;
    # "two_nodes": B's read of t could not start from A's one node of t
    for kind in ("overwrites", "two_nodes"):
        graph = Graph.of(_two_states(kind))
        assert joinable_pairs(graph) == 0, kind
        assert JoinElementwiseStates()(graph).unwrap() is graph


def test_states_with_nothing_to_fuse_stay_apart() -> None:
    graph = Graph.of(_two_states("shifted"))  # B's map ranges over 0:N-1, A's over 0:N
    assert joinable_pairs(graph) == 0
    assert JoinElementwiseStates()(graph).unwrap() is graph


def before_join() -> Graph:
    """The gradient (in A) of `lp_whole_array_update`, through the passes of `OPTIMIZE` before this one."""
    names = [step.name for step in OPTIMIZE.steps]
    return grad_graph(loops.lp_whole_array_update, "A", "S", None, None, gradflow.STORE_ALL,
                      Pipeline(OPTIMIZE.steps[:names.index("join_elementwise_states")]))


def test_a_reverse_sweep_is_joined_and_its_gradient_equals_torchs() -> None:
    assert joinable_pairs(before_join()) > 0
    optimized = grad_graph(loops.lp_whole_array_update, "A", "S", None, None, gradflow.STORE_ALL, True)
    assert joinable_pairs(optimized) == 0
    rng = np.random.default_rng(5)
    n, steps = 9, 4
    A, W = rng.normal(size=n), rng.normal(size=n)
    value, grad_a = gradflow.value_and_grad(loops.lp_whole_array_update, wrt="A", of="S")(
        A=A.copy(), W=W, S=np.zeros(1), N=n, T=steps)
    At = torch.tensor(A, requires_grad=True)
    x = At
    for _ in range(steps):
        x = torch.tanh(x) * torch.tensor(W) + 0.1 * x
    total = (x * torch.arange(1, n + 1, dtype=torch.float64)).sum()
    total.backward()
    np.testing.assert_allclose(value, total.item(), rtol=1e-12)
    np.testing.assert_allclose(grad_a, At.grad.numpy(), rtol=1e-12)
