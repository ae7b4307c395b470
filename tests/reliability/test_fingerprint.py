"""The canonical fingerprint: equal programs hash equal however they were built; different ones do not.

Builds are cached by fingerprint, so a fingerprint that follows construction order (node order inside a
state, which used to follow object addresses) makes every process rebuild every gradient, and one that
ignores a real difference would load the wrong library. Both directions are checked here, in-process
(the cross-process check is `test_processes.py`).
"""

from __future__ import annotations

import copy
import random

import dace
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import fingerprint
from gradflow.verify.corpus.dataflow import CASES_BY_NAME as DATAFLOW
from gradflow.verify.corpus.loops import CASES_BY_NAME as LOOPS

CASES_BY_NAME = {**DATAFLOW, **LOOPS}

N = dace.symbol("N")

@pytest.fixture(autouse=True)
def _no_line_info():
    """DaCe inspects the Python stack for every node added (deep under pytest and hypothesis): off here,
    it only fills in source positions, which the fingerprint leaves out anyway."""
    with dace.config.set_temporary("compiler", "lineinfo", value="none"):
        yield


#: element-wise operations of a random program
_OPS = ("a + b", "a * b", "a - b", "exp(a) * b", "a / (1.0 + b * b)")


def _program(steps: list[tuple[int, int, int]]) -> dace.SDFG:
    """One state computing, for each step (op, i, j), T_k = op(source i, source j) over N elements, where
    the sources are X, Y and the earlier T's (indices are clamped to those)."""
    sdfg = dace.SDFG("prog")
    sdfg.add_array("X", [N], dace.float64)
    sdfg.add_array("Y", [N], dace.float64)
    state = sdfg.add_state("main")
    nodes = [state.add_access("X"), state.add_access("Y")]
    for k, (op, i, j) in enumerate(steps):
        sdfg.add_array(f"T{k}", [N], dace.float64)
        out = state.add_access(f"T{k}")
        me, mx = state.add_map(f"m{k}", {"i": "0:N"})
        tasklet = state.add_tasklet(f"t{k}", {"a", "b"}, {"o"}, f"o = {_OPS[op]}")
        for conn, src in (("a", nodes[min(i, k + 1)]), ("b", nodes[min(j, k + 1)])):
            state.add_memlet_path(src, me, tasklet, dst_conn=conn, memlet=dace.Memlet(f"{src.data}[i]"))
        state.add_memlet_path(tasklet, mx, out, src_conn="o", memlet=dace.Memlet(f"T{k}[i]"))
        nodes.append(out)
    return sdfg


def _reordered(sdfg: dace.SDFG, seed: int) -> dace.SDFG:
    """The same program with the nodes and edges of every state added in another order (new node ids)."""
    rng = random.Random(seed)
    new = copy.deepcopy(sdfg)
    for state in (s for inner in new.all_sdfgs_recursive() for s in inner.states()):
        nodes, edges = list(state.nodes()), list(state.edges())
        for e in edges:
            state.remove_edge(e)
        for n in nodes:
            state.remove_node(n)
        rng.shuffle(nodes)
        rng.shuffle(edges)
        for n in nodes:
            state.add_node(n)
        for e in edges:
            state.add_edge(e.src, e.src_conn, e.dst, e.dst_conn, e.data)
    return new


_steps = st.lists(st.tuples(st.integers(0, len(_OPS) - 1), st.integers(0, 6), st.integers(0, 6)),
                  min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(steps=_steps, seed=st.integers(0, 2**16))
def test_fingerprint_ignores_the_order_nodes_were_added_in(steps, seed):
    sdfg = _program(steps)
    assert fingerprint(_reordered(sdfg, seed)) == fingerprint(sdfg)


def test_fingerprint_ignores_node_order_but_not_content():
    base = _program([(0, 0, 1), (1, 0, 2), (3, 3, 0)])
    for seed in range(3):
        assert fingerprint(_reordered(base, seed)) == fingerprint(base)
    # another operation, or the same operation on swapped operands, is another program
    assert fingerprint(_program([(0, 0, 1), (1, 0, 2), (4, 3, 0)])) != fingerprint(base)
    assert fingerprint(_program([(0, 0, 1), (1, 0, 2), (3, 0, 3)])) != fingerprint(base)


@pytest.mark.parametrize("case", ["df_nested_map", "lp_if_else"])
def test_fingerprint_of_a_gradient_ignores_node_order(case):
    """Gradient SDFGs (nested SDFGs, a conditional in a loop, the tape): reordering every state's nodes,
    nested SDFGs included, leaves the fingerprint alone."""
    c = CASES_BY_NAME[case]
    sdfg = gradflow.grad(c.program, wrt=list(c.wrt), of=c.of)
    assert fingerprint(_reordered(sdfg, 7)) == fingerprint(sdfg)


def test_fingerprint_ignores_the_order_of_blocks():
    def chain(first_added: str) -> dace.SDFG:
        sdfg = dace.SDFG("blocks")
        sdfg.add_array("X", [N], dace.float64)
        labels = [first_added] + [x for x in ("s0", "s1", "s2") if x != first_added]
        added = {lab: sdfg.add_state(lab, is_start_block=(lab == "s0")) for lab in labels}
        sdfg.add_edge(added["s0"], added["s1"], dace.InterstateEdge(assignments={"k": "1"}))
        sdfg.add_edge(added["s1"], added["s2"], dace.InterstateEdge())
        return sdfg

    assert fingerprint(chain("s2")) == fingerprint(chain("s0")) == fingerprint(chain("s1"))
    other = chain("s0")
    other.edges()[0].data.assignments["k"] = "2"
    assert fingerprint(other) != fingerprint(chain("s0"))


@dace.program
def _branchy(A: dace.float64[N], S: dace.float64[1]):
    for i in range(N):
        if A[i] > 0:
            S[0] += A[i]
        else:
            S[0] -= 2 * A[i]


def test_fingerprint_of_conditionals_is_stable_under_deepcopy():
    """A conditional block's branches are (condition, region) pairs: their memlet guids, renewed by
    every deepcopy, are volatile too."""
    sdfg = _branchy.to_sdfg(simplify=True)
    assert fingerprint(copy.deepcopy(sdfg)) == fingerprint(sdfg)
