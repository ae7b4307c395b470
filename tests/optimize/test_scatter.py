"""`own_scatter_writes`: sums of one map into one array that neighbouring iterations may both hit are split
into maps whose writes each iteration owns; sums that can never meet stay in one map (copying the body
for them would repeat its work once per block). What the pass builds, and that the numbers stay."""

from __future__ import annotations

import copy

import dace
import numpy as np
from dace.sdfg import nodes as nd

from gradflow.core.graph import Graph
from gradflow.optimize.scatter import OwnScatterWrites
from gradflow.runtime.compile import compile_sdfg

N = 9  # concrete: with a symbolic size, ranges like [0, N) and [2N, 3N) are not provably disjoint


@dace.program
def blocks(a: dace.float64[9], g: dace.float64[27]):
    # the three writes of iteration i fill three disjoint blocks of g, like the gate blocks of an LSTM row
    for i in dace.map[0:N]:
        with dace.tasklet:
            x << a[i]
            o0 >> g(1, lambda p, q: p + q)[i]
            o1 >> g(1, lambda p, q: p + q)[i + N]
            o2 >> g(1, lambda p, q: p + q)[i + 2 * N]
            o0 = x
            o1 = 2 * x
            o2 = 3 * x


@dace.program
def stencil_and_block(a: dace.float64[9], g: dace.float64[20]):
    # g[i] and g[i + 1] meet between neighbours; g[i + N + 2] meets neither
    for i in dace.map[0:N]:
        with dace.tasklet:
            x << a[i]
            o0 >> g(1, lambda p, q: p + q)[i]
            o1 >> g(1, lambda p, q: p + q)[i + 1]
            o2 >> g(1, lambda p, q: p + q)[i + N + 2]
            o0 = x
            o1 = 2 * x
            o2 = 3 * x


def _maps(graph: Graph) -> list[nd.MapEntry]:
    return [n for s in graph.sdfg.states() for n in s.nodes() if isinstance(n, nd.MapEntry)]


def _run(graph: Graph, a: np.ndarray, size: int) -> np.ndarray:
    g = np.full(size, 0.25)  # the sums add to what g holds
    compile_sdfg(graph)(a=a, g=g)
    return g


def test_writes_that_never_meet_stay_in_one_map() -> None:
    plain = Graph.of(blocks.to_sdfg())
    assert OwnScatterWrites()(plain).unwrap().fingerprint == plain.fingerprint
    # and DaCe's code generator, from the same propagated ranges, makes none of the sums atomic
    code = "".join(obj.clean_code for obj in copy.deepcopy(plain.sdfg).generate_code())
    assert "wcr_fixed" in code and "reduce_atomic" not in code
    a = np.random.default_rng(0).standard_normal(N)
    np.testing.assert_allclose(_run(plain, a, 3 * N), 0.25 + np.concatenate([a, 2 * a, 3 * a]), rtol=1e-15)


def test_meeting_writes_get_maps_of_their_own_and_disjoint_ones_share() -> None:
    plain = Graph.of(stencil_and_block.to_sdfg())
    split = OwnScatterWrites()(plain).unwrap()
    # g[i] and g[i + N + 2] stay together, g[i + 1] moves to a copy: two maps, not three
    assert len(_maps(plain)) == 1 and len(_maps(split)) == 2
    a = np.random.default_rng(0).standard_normal(N)
    want = np.full(20, 0.25)
    want[:9] += a
    want[1:10] += 2 * a
    want[11:20] += 3 * a
    np.testing.assert_allclose(_run(plain, a, 20), want, rtol=1e-15)
    np.testing.assert_allclose(_run(split, a, 20), want, rtol=1e-15)


@dace.program
def two_sums_per_element(a: dace.float64[9], b: dace.float64[9], g: dace.float64[9]):
    # both writes of iteration i go to g[i] (the adjoints of two reads of one element)
    for i in dace.map[0:N]:
        with dace.tasklet:
            x << a[i]
            y << b[i]
            o0 >> g(1, lambda p, q: p + q)[i]
            o1 >> g(1, lambda p, q: p + q)[i]
            o0 = x * y
            o1 = 3 * x


def test_sums_into_the_same_element_of_each_iteration_are_added_in_the_body() -> None:
    """One write per element: two writes into one element from one map would be atomic, and splitting
    the map would run its body twice."""
    plain = Graph.of(two_sums_per_element.to_sdfg())
    out = OwnScatterWrites()(plain).unwrap()
    [entry] = _maps(out)
    state = next(s for s in out.sdfg.states() if entry in s.nodes())
    writes = [e for e in state.in_edges(state.exit_node(entry)) if e.data.data == "g"]
    assert len(writes) == 1 and writes[0].data.wcr is not None
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(9), rng.standard_normal(9)
    results = []
    for graph in (plain, out):
        g = np.full(9, 0.25)
        compile_sdfg(graph)(a=a, b=b, g=g)
        results.append(g)
    np.testing.assert_allclose(results[1], 0.25 + a * b + 3 * a, rtol=1e-14)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-14)


def _stencil_through_a_local(write_out: bool = False) -> dace.SDFG:
    """A stencil adjoint's shape with a scope-local scalar between two tasklets: g[i] += y, g[i + 1] += 3 y
    with y = 2 a[i] held in `t`; `write_out`: `t` also leaves the map into w[i] (as a fused map writes out a
    temporary that a later state reads)."""
    sdfg = dace.SDFG(f"stencil_through_a_local_{int(write_out)}")
    sdfg.add_array("a", [N], dace.float64)
    sdfg.add_array("g", [N + 1], dace.float64)
    sdfg.add_scalar("t", dace.float64, transient=True)
    state = sdfg.add_state()
    entry, exit_ = state.add_map("stencil", {"i": f"0:{N}"})
    first = state.add_tasklet("double", {"x"}, {"y"}, "y = 2 * x")
    second = state.add_tasklet("scatter", {"y"}, {"o0", "o1"}, "o0 = y\no1 = 3 * y")
    local = state.add_access("t")
    state.add_memlet_path(state.add_read("a"), entry, first, dst_conn="x", memlet=dace.Memlet("a[i]"))
    state.add_edge(first, "y", local, None, dace.Memlet("t[0]"))
    state.add_edge(local, None, second, "y", dace.Memlet("t[0]"))
    g = state.add_write("g")
    for k, (conn, index) in enumerate((("o0", "i"), ("o1", "i + 1"))):
        exit_.add_in_connector(f"IN_g{k}")
        exit_.add_out_connector(f"OUT_g{k}")
        state.add_edge(second, conn, exit_, f"IN_g{k}", dace.Memlet(f"g[{index}]", wcr="lambda p, q: p + q"))
        state.add_edge(exit_, f"OUT_g{k}", g, None, dace.Memlet(f"g[{k}:{N + k}]", wcr="lambda p, q: p + q"))
    if write_out:
        sdfg.add_array("w", [N], dace.float64)
        exit_.add_in_connector("IN_w")
        exit_.add_out_connector("OUT_w")
        state.add_edge(local, None, exit_, "IN_w", dace.Memlet(data="w", subset="i", other_subset="0"))
        state.add_edge(exit_, "OUT_w", state.add_write("w"), None, dace.Memlet(f"w[0:{N}]"))
    return sdfg


def test_a_split_copy_has_its_own_scope_local_data() -> None:
    """Shared by the two maps, DaCe would declare `t` once outside them: one variable for every thread."""
    plain = Graph.of(_stencil_through_a_local())
    split = OwnScatterWrites()(plain).unwrap()
    entries = _maps(split)
    assert len(entries) == 2
    state = next(s for s in split.sdfg.states() if entries[0] in s.nodes())
    local = [{n.data for n in state.scope_subgraph(e).nodes() if isinstance(n, nd.AccessNode)
              and split.sdfg.arrays[n.data].transient} for e in entries]
    assert all(local) and not local[0] & local[1]
    a = np.random.default_rng(4).standard_normal(N)
    want = np.full(N + 1, 0.25)
    want[:N] += 2 * a
    want[1:] += 6 * a
    for graph in (plain, split):
        g = np.full(N + 1, 0.25)
        compile_sdfg(graph)(a=a, g=g)
        np.testing.assert_allclose(g, want, rtol=1e-14)


def test_a_local_the_map_also_writes_out_is_written_by_the_original_only() -> None:
    """The copy keeps its sums and drops the write-out (routed into a sink scalar, the copy's temporary was
    declared where its code could not see it: a build error)."""
    plain = Graph.of(_stencil_through_a_local(write_out=True))
    split = OwnScatterWrites()(plain).unwrap()
    assert len(_maps(split)) == 2
    a = np.random.default_rng(5).standard_normal(N)
    want = np.full(N + 1, 0.25)
    want[:N] += 2 * a
    want[1:] += 6 * a
    for graph in (plain, split):
        g, w = np.full(N + 1, 0.25), np.zeros(N)
        compile_sdfg(graph)(a=a, g=g, w=w)
        np.testing.assert_allclose(g, want, rtol=1e-14)
        np.testing.assert_allclose(w, 2 * a, rtol=1e-15)
