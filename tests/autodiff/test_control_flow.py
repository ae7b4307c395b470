"""Unstructured control flow, symbols on interstate edges and growable tapes: what the loop corpus does not
show by itself (its gradients are checked against torch in test_loops_grad.py).

- `lift_control_flow` raises conditional interstate edges into structured regions, leaves structured
  SDFGs alone, and names the blocks of what it cannot raise;
- a floating-point value that reaches the differentiated code through a symbol is differentiated through
  (`demote_data_symbols`), or rejected where it cannot be, never a silently missing gradient path;
- a loop variable read after its loop is rejected;
- without a loop bound the split forward/backward pair reruns the forward sweep in the backward SDFG, and
  works as a torch autograd Function.
"""

from __future__ import annotations

import dace
import numpy as np
import pytest
from dace import InterstateEdge

import gradflow
from gradflow.core.graph import Graph
from gradflow.transforms.lifting import LiftControlFlow, branching_blocks
from gradflow.verify.corpus import loops, unstructured

N = dace.symbol("N")


def _accumulate(state: dace.SDFGState, code: str, index: str = "0") -> None:
    """S[0] = f(S[0], X[index]) in `state`."""
    x, s_in, s_out = state.add_read("X"), state.add_read("S"), state.add_write("S")
    t = state.add_tasklet(f"{state.label}_t", {"x": None, "s": None}, {"o": None}, code)
    state.add_edge(x, None, t, "x", dace.Memlet(f"X[{index}]"))
    state.add_edge(s_in, None, t, "s", dace.Memlet("S[0]"))
    state.add_edge(t, "o", s_out, None, dace.Memlet("S[0]"))


def _program(name: str) -> dace.SDFG:
    sdfg = dace.SDFG(name)
    sdfg.add_array("X", [N], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    return sdfg


def test_lifting_raises_loops_and_branches_and_leaves_structured_programs_alone() -> None:
    graph = Graph.of(unstructured.lp_api_loop_branch())
    lifted = LiftControlFlow()(graph).unwrap()
    assert branching_blocks(graph.sdfg) and not branching_blocks(lifted.sdfg)
    kinds = {type(b).__name__ for b in lifted.sdfg.all_control_flow_blocks()}
    assert {"LoopRegion", "ConditionalBlock"} <= kinds
    structured = Graph.of(loops.lp_if_else.to_sdfg())
    assert LiftControlFlow()(structured).unwrap() is structured


def _fork(name: str):
    """A program with blocks a (start), b (adds X[0] into S), c (multiplies S by it) and end, no edges yet."""
    sdfg = _program(name)
    a = sdfg.add_state("a", is_start_block=True)
    b, c, end = sdfg.add_state("b"), sdfg.add_state("c"), sdfg.add_state("end")
    _accumulate(b, "o = s + x")
    _accumulate(c, "o = s * x")
    return sdfg, (a, b, c, end)


def test_irreducible_control_flow_names_its_blocks() -> None:
    sdfg, (a, b, c, end) = _fork("irreducible")
    sdfg.add_edge(a, b, InterstateEdge("X[0] > 0"))
    sdfg.add_edge(a, c, InterstateEdge("not (X[0] > 0)"))  # the cycle b <-> c has two entries
    sdfg.add_edge(b, c, InterstateEdge("S[0] < 1.0"))
    sdfg.add_edge(c, b, InterstateEdge("S[0] < 2.0"))
    sdfg.add_edge(b, end, InterstateEdge("not (S[0] < 1.0)"))
    sdfg.add_edge(c, end, InterstateEdge("not (S[0] < 2.0)"))
    with pytest.raises(gradflow.NotDifferentiableError, match=r"blocks 'b', 'c' is irreducible"):
        gradflow.grad(sdfg, wrt="X", of="S")


def test_branches_that_may_all_be_false_are_rejected() -> None:
    sdfg, (a, b, c, end) = _fork("gap")
    sdfg.add_edge(a, b, InterstateEdge("X[0] > 1"))
    sdfg.add_edge(a, c, InterstateEdge("X[0] < -1"))  # neither when -1 <= X[0] <= 1
    sdfg.add_edge(b, end, InterstateEdge())
    sdfg.add_edge(c, end, InterstateEdge())
    with pytest.raises(gradflow.NotDifferentiableError, match=r"leaving block 'a' may all be false"):
        gradflow.grad(sdfg, wrt="X", of="S")


def test_a_float_symbol_carrying_differentiated_data_is_differentiated_through() -> None:
    """t = X[0] on an edge, then S = S + t * X[1]: `demote_data_symbols` gives t a value the tasklet reads,
    so the path through t has its gradient (it was refused before; never a silently missing path)."""
    sdfg = _program("carrier")
    a = sdfg.add_state("a", is_start_block=True)
    b = sdfg.add_state("b")
    sdfg.add_edge(a, b, InterstateEdge(assignments={"t": "X[0]"}))
    _accumulate(b, "o = s + t * x", "1")
    x = np.array([0.7, -1.3, 2.0])
    value, grad = gradflow.value_and_grad(sdfg, wrt="X", of="S")(X=x.copy(), S=np.array([0.5]))
    assert value == pytest.approx(0.5 + x[0] * x[1], rel=1e-15)
    np.testing.assert_allclose(grad, [x[1], x[0], 0.0], rtol=1e-15)


def test_a_float_symbol_a_nested_program_reads_is_rejected() -> None:
    """The same symbol handed to a nested SDFG (its symbol mapping) cannot be demoted: refused, naming it."""
    inner = _program("inner")
    inner.add_symbol("t", dace.float64)
    _accumulate(inner.add_state("body", is_start_block=True), "o = s + t * x", "1")
    sdfg = _program("carrier_nested")
    a = sdfg.add_state("a", is_start_block=True)
    b = sdfg.add_state("b")
    sdfg.add_edge(a, b, InterstateEdge(assignments={"t": "X[0]"}))
    node = b.add_nested_sdfg(inner, {"X", "S"}, {"S"}, symbol_mapping={"N": "N", "t": "t"})
    b.add_edge(b.add_read("X"), None, node, "X", dace.Memlet("X[0:N]"))
    b.add_edge(b.add_read("S"), None, node, "S", dace.Memlet("S[0]"))
    b.add_edge(node, "S", b.add_write("S"), None, dace.Memlet("S[0]"))
    with pytest.raises(gradflow.NotDifferentiableError, match=r"symbol 't'.*computed from 'X'"):
        gradflow.grad(sdfg, wrt="X", of="S")
    with pytest.raises(gradflow.NotDifferentiableError, match=r"symbol 't'.*computed from 'X'"):
        gradflow.jvp(sdfg, wrt="X", of="S")
    # The same symbol is fine when it carries data that does not depend on the differentiated inputs.
    assert "grad_S" in gradflow.grad(sdfg, wrt="S", of="S").arrays


def test_a_loop_variable_read_after_its_loop_is_rejected() -> None:
    sdfg = _program("after_loop")
    loop = dace.sdfg.state.LoopRegion("scan", "i < N - 1", "i", "i = 0", "i = i + 1", sdfg=sdfg)
    sdfg.add_node(loop, is_start_block=True)
    _accumulate(loop.add_state("body", is_start_block=True), "o = s + x * x", "i")
    after = sdfg.add_state("after")
    sdfg.add_edge(loop, after, InterstateEdge())
    _accumulate(after, "o = s * x", "i")  # i == N - 1 here
    with pytest.raises(gradflow.NotDifferentiableError, match=r"reads the variable 'i' of loop 'scan' outside"):
        gradflow.grad(sdfg, wrt="X", of="S")


def test_split_pair_of_a_growable_tape_reruns_the_forward_in_the_backward() -> None:
    case = loops.CASES_BY_NAME["lp_api_while_accumulate"]
    vjp = gradflow.vjp(case.to_sdfg(), wrt=list(case.wrt), of=case.of)
    written = {"A", "T", "S"}  # the arguments the forward writes: their initial values are saved
    assert set(vjp.saved) == {f"gradflow_init_{a}" for a in written}
    assert set(vjp.forwarded) == set(vjp.saved) | {"X", "W"}
    assert not any(n.startswith("gradflow_tape") for n in vjp.forwarded)
    assert not any(vjp.backward.arrays[a].transient is False for a in written)
    assert np.isfinite(vjp.saved_bytes({"N": 5}))
