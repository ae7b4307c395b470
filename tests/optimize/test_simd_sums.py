"""`simd_register_sums`: sequential loops that sum into one-element register accumulators get
`#pragma omp simd reduction(...)`; loops whose other write-conflicts could meet in one element, or that
read their accumulator, do not. Values: the two-route test runs every corpus program through it."""

from __future__ import annotations

import re

import dace
import numpy as np
import pytest

from gradflow.core.graph import Graph
from gradflow.optimize.simd_sums import SIMD_SUMS, SimdRegisterSums, reductions
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


def _loop(write: str | None, reads_acc: bool = False, grid: bool = False, scalar: bool = False) -> dace.SDFG:
    """acc = 0; for j (one sequential map; for i, j over a grid when `grid`): acc += X[...] * X[...] (+ acc
    when `reads_acc`), and `write` (B[...] += X[...], or nothing); S[0] = acc. The accumulator is a
    one-element register array, or a register scalar (as `register_scalar_sums` makes it) when `scalar`."""
    sdfg = dace.SDFG("simd_" + re.sub(r"\W", "_", str(write)) + ("_reads" if reads_acc else "")
                     + ("_grid" if grid else "") + ("_scalar" if scalar else ""))
    shape, element, ranges = ([N, N], "X[i, j]", {"i": "0:N", "j": "0:N"}) if grid else ([N], "X[j]", {"j": "0:N"})
    sdfg.add_array("X", shape, dace.float64)
    sdfg.add_array("B", shape, dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    if scalar:
        sdfg.add_scalar("acc", dace.float64, transient=True, storage=dace.StorageType.Register)
    else:
        sdfg.add_array("acc", [1], dace.float64, transient=True, storage=dace.StorageType.Register)
    state = sdfg.add_state()
    zero = state.add_tasklet("zero", {}, {"o"}, "o = 0")
    start = state.add_access("acc")
    state.add_edge(zero, "o", start, None, dace.Memlet("acc[0]"))
    entry, exit_ = state.add_map("loop", ranges, schedule=dace.ScheduleType.Sequential)
    state.add_nedge(start, entry, dace.Memlet())
    inputs = {"x"} | ({"a"} if reads_acc else set())
    outputs = {"s"} | ({"b"} if write else set())
    code = "s = x * x" + (" + a" if reads_acc else "") + ("\nb = x" if write else "")
    task = state.add_tasklet("body", inputs, outputs, code)
    state.add_memlet_path(state.add_read("X"), entry, task, memlet=dace.Memlet(element), dst_conn="x")
    if reads_acc:
        state.add_memlet_path(state.add_read("acc"), entry, task, memlet=dace.Memlet("acc[0]"), dst_conn="a")
    total = state.add_access("acc")
    state.add_memlet_path(task, exit_, total, memlet=dace.Memlet("acc[0]", wcr="lambda a, b: a + b"), src_conn="s")
    if write:
        state.add_memlet_path(task, exit_, state.add_access("B"), memlet=dace.Memlet(write, wcr="lambda a, b: a + b"),
                              src_conn="b")
    fold = state.add_tasklet("fold", {"a"}, {"o"}, "o = a")
    state.add_edge(total, None, fold, "a", dace.Memlet("acc[0]"))
    state.add_edge(fold, "o", state.add_write("S"), None, dace.Memlet("S[0]"))
    return sdfg


def _entry(sdfg: dace.SDFG):
    return next((s, n) for s in sdfg.states() for n in s.nodes() if isinstance(n, dace.nodes.MapEntry))


@pytest.mark.parametrize("write", [None, "B[j]", "B[N - 1 - j]"])
def test_loops_summing_into_registers_are_marked(write) -> None:
    sdfg = _loop(write)
    assert reductions(sdfg, *_entry(sdfg)) == {"acc": "+"}
    marked = SimdRegisterSums()(Graph.of(sdfg)).unwrap().sdfg
    assert _entry(marked)[1].map.instrument == SIMD_SUMS
    assert _entry(sdfg)[1].map.instrument != SIMD_SUMS  # the input is untouched
    code = marked.generate_code()[0].clean_code
    assert "#pragma omp simd reduction(+: acc[0:1])\n" in code.replace("\r", "")


@pytest.mark.parametrize("write, reads_acc", [("B[j // 2]", False), ("B[0]", False), (None, True)])
def test_loops_that_may_meet_or_read_the_accumulator_are_not(write, reads_acc) -> None:
    sdfg = _loop(write, reads_acc)
    assert reductions(sdfg, *_entry(sdfg)) is None
    assert SimdRegisterSums()(Graph.of(sdfg)).unwrap().sdfg.hash_sdfg() == sdfg.hash_sdfg()


def test_a_marked_loop_sums_right() -> None:
    marked = SimdRegisterSums()(Graph.of(_loop("B[j]"))).unwrap().sdfg
    x = np.random.default_rng(3).standard_normal(1001)
    b, s = np.zeros(1001), np.zeros(1)
    compile_sdfg(marked)(X=x, B=b, S=s, N=1001)
    np.testing.assert_allclose(s[0], np.dot(x, x), rtol=1e-13)
    np.testing.assert_array_equal(b, x)


def test_a_loop_that_also_assigns_its_accumulator_is_not_marked() -> None:
    sdfg = _loop(None)
    state, entry = _entry(sdfg)
    task = next(n for n in state.nodes() if isinstance(n, dace.nodes.Tasklet) and n.label == "body")
    task.add_out_connector("t")
    task.code.as_string = "s = x * x\nt = x"
    total = next(e.dst for e in state.out_edges(state.exit_node(entry)))
    state.add_memlet_path(task, state.exit_node(entry), total, memlet=dace.Memlet("acc[0]"), src_conn="t")
    assert reductions(sdfg, state, entry) is None


@pytest.mark.parametrize("write, marked", [(None, True), ("B[i, j]", True), ("B[j, i + j]", True),
                                           ("B[i + j, 0]", False), ("B[i, 0]", False)])
def test_two_dimensional_loops_are_marked_when_no_two_iterations_meet(write, marked) -> None:
    sdfg = _loop(write, grid=True, scalar=True)
    assert (reductions(sdfg, *_entry(sdfg)) == {"acc": "+"}) is marked


def test_a_scalar_accumulator_is_its_own_reduction_item_and_a_grid_collapses() -> None:
    """A scalar, not an array section: GCC 12 keeps a section's sum as one chain of scalar adds."""
    marked = SimdRegisterSums()(Graph.of(_loop("B[i, j]", grid=True, scalar=True))).unwrap().sdfg
    code = marked.generate_code()[0].clean_code.replace("\r", "")
    assert "#pragma omp simd collapse(2) reduction(+: acc)\n" in code
    x = np.random.default_rng(4).standard_normal((37, 37))
    b, s = np.zeros((37, 37)), np.zeros(1)
    compile_sdfg(marked)(X=x, B=b, S=s, N=37)
    np.testing.assert_allclose(s[0], np.sum(x * x), rtol=1e-13)
    np.testing.assert_array_equal(b, x)


def test_register_scalar_sums_accumulates_in_a_scalar() -> None:
    from gradflow.optimize.scalar_sums import RegisterScalarSums

    # the sum goes into S directly, as reverse mode writes it; the pass gives it a local accumulator
    sdfg = dace.SDFG("simd_grid_into_S")
    sdfg.add_array("X", [N, N], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    st = sdfg.add_state()
    entry, exit_ = st.add_map("grid", {"i": "0:N", "j": "0:N"}, schedule=dace.ScheduleType.Sequential)
    task = st.add_tasklet("body", {"x"}, {"s"}, "s = x * x")
    st.add_memlet_path(st.add_read("X"), entry, task, memlet=dace.Memlet("X[i, j]"), dst_conn="x")
    st.add_memlet_path(task, exit_, st.add_write("S"), memlet=dace.Memlet("S[0]", wcr="lambda a, b: a + b"),
                       src_conn="s")
    summed = RegisterScalarSums()(Graph.of(sdfg)).unwrap().sdfg
    accs = [n for n, d in summed.arrays.items() if n.startswith("gradflow_acc")]
    assert len(accs) == 1 and isinstance(summed.arrays[accs[0]], dace.data.Scalar)
    marked = SimdRegisterSums()(Graph.of(summed)).unwrap().sdfg
    assert f"reduction(+: {accs[0]})" in marked.generate_code()[0].clean_code
    x = np.random.default_rng(5).standard_normal((21, 21))
    s = np.full(1, 0.5)
    compile_sdfg(marked)(X=x, S=s, N=21)
    np.testing.assert_allclose(s[0], 0.5 + np.sum(x * x), rtol=1e-13)
