"""`share_dead_buffers`: transient arrays whose live ranges are apart share one buffer, only where the pass
can show it (equal layouts, the earlier one dead, the later one written whole before it is read), and the
program computes what it computed before."""

from __future__ import annotations

import functools

import dace
import numpy as np
from dace.sdfg.state import LoopRegion
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.graph import Graph
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.shared_buffers import ShareDeadBuffers, candidates, plan, sharing
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


def _transient_bytes(sdfg: dace.SDFG, n: int) -> int:
    return sum(int(dace.symbolic.evaluate(d.total_size, {N: n})) * d.dtype.bytes
               for d in sdfg.arrays.values() if d.transient and isinstance(d, dace.data.Array))


@dace.program
def three_layers(x: dace.float64[N, N], w1: dace.float64[N, N], w2: dace.float64[N, N], w3: dace.float64[N, N],
                 S: dace.float64[1]):
    h1 = np.tanh(x @ w1)
    h2 = np.tanh(h1 @ w2)
    h3 = np.tanh(h2 @ w3)
    S[0] = np.sum(h3 * h3)


def _grads(optimize, args: dict) -> dict:
    f = gradflow.value_and_grad(three_layers, wrt=["x", "w1", "w2", "w3"], of="S", optimize=optimize)
    return f(**{k: v.copy() for k, v in args.items()})[1]



@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_backward_holds_fewer_buffers_and_computes_the_same_gradients(seed):
    rng = np.random.default_rng(seed)
    args = {k: rng.uniform(-1, 1, (8, 8)) for k in ("x", "w1", "w2", "w3")} | {"S": np.zeros(1)}
    without = OPTIMIZE.without("share_dead_buffers")
    shared = gradflow.grad(three_layers, wrt=["x", "w1", "w2", "w3"], of="S")
    plain = gradflow.grad(three_layers, wrt=["x", "w1", "w2", "w3"], of="S", optimize=without)
    assert _transient_bytes(shared, 8) < _transient_bytes(plain, 8)
    got, want = _grads(True, args), _grads(without, args)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-13, atol=1e-15)


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_budgets_reruns_share_buffers_and_compute_the_same_gradients(seed):
    # A budget reruns forward values inside the backward, so ranges of two arrays meet in one state (the
    # MLP of `benchmarks/memory_peak.py` got wrong gradients when the rewrite renamed one array after another).
    rng = np.random.default_rng(seed)
    args = {k: rng.uniform(-1, 1, (8, 8)) for k in ("x", "w1", "w2", "w3")} | {"S": np.zeros(1)}
    budget = gradflow.Forwarding.budget(8 * 8 * 8)  # one matrix of the four STORE_ALL keeps
    grads = []
    for optimize in (True, OPTIMIZE.without("share_dead_buffers")):
        f = gradflow.value_and_grad(three_layers, wrt=["x", "w1", "w2", "w3"], of="S", forwarding=budget,
                                    optimize=optimize)
        grads.append(f(**{k: v.copy() for k, v in args.items()})[1])
    got, want = grads
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-13, atol=1e-15)


def _program(kind: str) -> dace.SDFG:
    """x -> A -> y, then x -> B -> z, in four states; `kind` breaks one condition of the rewrite."""
    sdfg = dace.SDFG(f"two_temporaries_{kind}")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    size = N
    if kind == "sized_by_assigned":  # a size the program sets as it runs
        size = dace.symbol("M")
        sdfg.add_symbol("M", dace.int64)
    sdfg.add_transient("A", [size], dace.float64)
    if kind == "gapped":  # B's elements every other address: no View of A's N elements holds them
        sdfg.add_transient("B", [size], dace.float64, strides=(2,), total_size=2 * size)
    else:
        sdfg.add_transient("B", [size] if kind != "other_shape" else [N + 1], dace.float64)
    b_range = f"0:{size}" if kind != "partial" else "0:N-1"
    s0 = sdfg.add_state("write_a")
    if kind == "sized_by_assigned":
        sdfg.add_edge(sdfg.add_state("init", is_start_block=True), s0, dace.InterstateEdge(assignments={"M": "N"}))
    s0.add_mapped_tasklet("a", {"i": f"0:{size}"}, {"u": dace.Memlet("x[i]")}, "v = 2 * u", {"v": dace.Memlet("A[i]")},
                          external_edges=True)
    s1 = sdfg.add_state_after(s0, "read_a")
    s1.add_mapped_tasklet("ya", {"i": "0:N"}, {"u": dace.Memlet("A[i]")}, "v = u + 1", {"v": dace.Memlet("y[i]")},
                          external_edges=True)
    s2 = s1 if kind == "same_state" else sdfg.add_state_after(s1, "write_b")  # B written as A is last read
    s2.add_mapped_tasklet("b", {"i": b_range}, {"u": dace.Memlet("x[i]")}, "v = 3 * u", {"v": dace.Memlet("B[i]")},
                          external_edges=True)
    s3 = sdfg.add_state_after(s2, "read_b")
    s3.add_mapped_tasklet("zb", {"i": "0:N-1"}, {"u": dace.Memlet("B[i]")}, "v = u - 1", {"v": dace.Memlet("z[i]")},
                          external_edges=True)
    if kind == "overlap":  # A is read again after B is written
        s4 = sdfg.add_state_after(s3, "read_a_again")
        s4.add_mapped_tasklet("ya2", {"i": "0:N"}, {"u": dace.Memlet("A[i]")}, "v = u * 5",
                              {"v": dace.Memlet("y[i]")}, external_edges=True)
    return sdfg


def _outputs(program: dace.SDFG, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y, z) the program computes from x."""
    y, z = np.zeros(len(x)), np.zeros(len(x))
    compile_sdfg(program)(x=x, y=y, z=z, N=len(x))
    return y, z


def test_apart_ranges_of_one_layout_share_and_compute_the_same():
    sdfg = _program("plain")
    assert [(seg.array, buffer) for seg, buffer in sharing(sdfg)] == [("B", "A")]
    after = ShareDeadBuffers()(Graph.of(sdfg)).unwrap().sdfg
    assert "B" not in after.arrays
    outs = [_outputs(program, np.arange(6, dtype=np.float64)) for program in (sdfg, after)]
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1][:5], outs[1][1][:5])


def test_nothing_is_shared_where_it_cannot_be_shown():
    # written in part first (its other elements would be what A left), other sizes or a layout with gaps,
    # ranges that overlap or meet in one state (whose nodes DaCe may run in any order), a size set while
    # the program runs
    for kind in ("partial", "other_shape", "gapped", "overlap", "same_state", "sized_by_assigned"):
        assert sharing(_program(kind)) == [], kind


def _loop_program() -> dace.SDFG:
    """for k in range(3): a = x * (k + 1); y += a; b = sin(x) * k; y += b -- built with DaCe's API (the
    Python frontend's parse of a small program depended on what other tests had parsed before)."""
    sdfg = dace.SDFG("temporaries_in_a_loop")
    for name in ("x", "y"):
        sdfg.add_array(name, [N], dace.float64)
    for name in ("a", "b"):
        sdfg.add_transient(name, [N], dace.float64)
    loop = LoopRegion("steps", "k < 3", "k", "k = 0", "k = k + 1")
    sdfg.add_node(loop, is_start_block=True)
    state = None
    for label, inputs, code, out in [("make_a", ["x"], "v = u0 * (k + 1)", "a"),
                                     ("add_a", ["y", "a"], "v = u0 + u1", "y"),
                                     ("make_b", ["x"], "v = sin(u0) * k", "b"),
                                     ("add_b", ["y", "b"], "v = u0 + u1", "y")]:
        state = loop.add_state(label, is_start_block=True) if state is None else loop.add_state_after(state, label)
        state.add_mapped_tasklet(label, {"i": "0:N"}, {f"u{j}": dace.Memlet(f"{a}[i]") for j, a in enumerate(inputs)},
                                 code, {"v": dace.Memlet(f"{out}[i]")}, external_edges=True)
    return sdfg


def test_arrays_used_in_one_loop_do_not_share():
    # a loop is one position: what its body does across iterations is not followed (a and b could share
    # here; the pass does not claim it)
    sdfg = _loop_program()
    sdfg.validate()
    assert not {seg.array for seg, _ in sharing(sdfg)} & {"a", "b"}


def _swap_program() -> dace.SDFG:
    """A's first range ends, B takes A's buffer, A is written again (its own buffer now held by B), and one
    state reads A and B: the ranges of both arrays meet there and must move together."""
    sdfg = dace.SDFG("ranges_meet")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    for name in ("A", "B"):
        sdfg.add_transient(name, [N], dace.float64)

    def step(after, label, inputs, code, out):
        state = sdfg.add_state_after(after, label) if after is not None else sdfg.add_state(label)
        state.add_mapped_tasklet(label, {"i": "0:N"}, {f"u{k}": dace.Memlet(f"{a}[i]") for k, a in enumerate(inputs)},
                                 code, {"v": dace.Memlet(f"{out}[i]")}, external_edges=True)
        return state

    s = step(None, "write_a", ["x"], "v = 2 * u0", "A")
    s = step(s, "read_a", ["A"], "v = u0 + 1", "y")
    s = step(s, "write_b", ["x"], "v = 3 * u0", "B")
    s = step(s, "write_a_again", ["x"], "v = 5 * u0", "A")
    step(s, "read_both", ["A", "B"], "v = u0 + 7 * u1", "z")
    return sdfg


def test_ranges_meeting_in_one_state_are_renamed_together():
    sdfg = _swap_program()
    assert [(seg.array, seg.first, buffer) for seg, buffer in sharing(sdfg)] == [("B", 2, "A"), ("A", 3, "A_1")]
    after = ShareDeadBuffers()(Graph.of(sdfg)).unwrap().sdfg
    x = np.arange(1, 7, dtype=np.float64)
    outs = [_outputs(program, x)[1] for program in (sdfg, after)]
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[0], 5 * x + 21 * x)


def _reshape_program(one_state: bool, column_major: bool = False) -> dace.SDFG:
    """A[N, 2] written and read, then B[2N] written and read (in one state when `one_state`): B may take
    A's memory (row-major, or column-major as `transient_layouts` may leave it) through a View."""
    sdfg = dace.SDFG(f"reshaped_temporaries_{one_state}_{column_major}")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    sdfg.add_transient("A", [N, 2], dace.float64, strides=(1, N) if column_major else None)
    sdfg.add_transient("B", [2 * N], dace.float64)
    s0 = sdfg.add_state("write_a")
    s0.add_mapped_tasklet("a", {"i": "0:N", "j": "0:2"}, {"u": dace.Memlet("x[i]")}, "v = u * (j + 1)",
                          {"v": dace.Memlet("A[i, j]")}, external_edges=True)
    s1 = sdfg.add_state_after(s0, "read_a")
    s1.add_mapped_tasklet("ya", {"i": "0:N"}, {"u": dace.Memlet("A[i, 0]"), "w": dace.Memlet("A[i, 1]")},
                          "v = u + 3 * w", {"v": dace.Memlet("y[i]")}, external_edges=True)
    s2 = sdfg.add_state_after(s1, "write_b")
    b = s2.add_access("B")
    s2.add_mapped_tasklet("b", {"k": "0:2*N"}, {}, "v = k * 0.5", {"v": dace.Memlet("B[k]")}, external_edges=True,
                          output_nodes={"B": b})
    s3 = s2 if one_state else sdfg.add_state_after(s2, "read_b")
    s3.add_mapped_tasklet("zb", {"i": "0:N"}, {"u": dace.Memlet("B[i]"), "w": dace.Memlet("B[N + i]")},
                          "v = u - w * w", {"v": dace.Memlet("z[i]")}, external_edges=True,
                          input_nodes={"B": b} if one_state else None)
    return sdfg


def test_apart_ranges_of_other_shapes_share_through_a_view_and_compute_the_same():
    for one_state, column_major in ((False, False), (True, False), (False, True)):
        sdfg = _reshape_program(one_state, column_major)
        sdfg.validate()
        assert [(seg.array, buffer) for seg, buffer in sharing(sdfg)] == [("B", "A")]
        after = ShareDeadBuffers()(Graph.of(sdfg)).unwrap().sdfg
        after.validate()
        assert "B" not in after.arrays
        views = [name for name, desc in after.arrays.items() if isinstance(desc, dace.data.View)]
        assert len(views) == 1 and tuple(after.arrays[views[0]].shape) == (2 * N,)
        outs = [_outputs(program, np.arange(1, 7, dtype=np.float64)) for program in (sdfg, after)]
        np.testing.assert_array_equal(outs[1][0], outs[0][0])
        np.testing.assert_array_equal(outs[1][1], outs[0][1])
        np.testing.assert_array_equal(outs[0][1], np.arange(6) * 0.5 - (np.arange(6, 12) * 0.5) ** 2)


def _map_temporary_program() -> dace.SDFG:
    """y[i] = 2 x[i] + 1 through T[0] inside the map (a fused map's per-iteration temporary), then U = x[0]
    in a state of its own: U's range could take T's buffer, had T not been inside a map."""
    sdfg = dace.SDFG("map_temporary")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    for name in ("T", "U"):
        sdfg.add_transient(name, [1], dace.float64)
    state = sdfg.add_state("in_a_map")
    entry, exit_ = state.add_map("m", {"i": "0:N"})
    double = state.add_tasklet("double", {"u"}, {"v"}, "v = 2 * u")
    plus = state.add_tasklet("plus", {"u"}, {"v"}, "v = u + 1")
    temp = state.add_access("T")
    state.add_memlet_path(state.add_read("x"), entry, double, dst_conn="u", memlet=dace.Memlet("x[i]"))
    state.add_edge(double, "v", temp, None, dace.Memlet("T[0]"))
    state.add_edge(temp, None, plus, "u", dace.Memlet("T[0]"))
    state.add_memlet_path(plus, exit_, state.add_write("y"), src_conn="v", memlet=dace.Memlet("y[i]"))
    after = sdfg.add_state_after(state, "write_u")
    after.add_mapped_tasklet("u", {"k": "0:1"}, {"a": dace.Memlet("x[0]")}, "b = a", {"b": dace.Memlet("U[0]")},
                             external_edges=True)
    last = sdfg.add_state_after(after, "read_u")
    last.add_mapped_tasklet("z", {"k": "0:1"}, {"a": dace.Memlet("U[0]")}, "b = a * 3", {"b": dace.Memlet("z[0]")},
                            external_edges=True)
    return sdfg


def test_a_map_temporary_is_not_shared():
    # Found by the kernel benchmark: nb_softmax's one-element map-fusion temporary took other arrays' ranges;
    # allocated once for the whole call instead of per iteration, f+b went from 1.7 to 4.3 ms (one thread;
    # with threads, the map's iterations would share it)
    sdfg = _map_temporary_program()
    sdfg.validate()
    assert "T" not in candidates(sdfg) and "U" in candidates(sdfg)
    assert sharing(sdfg) == []


@dace.program
def posed_rotations(theta: dace.float64[4], base: dace.float64[N, 4, 4], out: dace.float64[N, 4, 4]):
    pose = np.zeros((N, 2))
    for f in range(2):
        pose[1 + 2 * f, 0] = theta[2 * f]
        pose[1 + 2 * f, 1] = theta[2 * f + 1]
    rotations = np.zeros((N, 4, 4))
    for b in dace.map[0:N]:  # rotations about z then x: 8 of the 16 entries, the others stay 0
        rotations[b, 0, 0] = np.cos(pose[b, 1])
        rotations[b, 0, 1] = -np.sin(pose[b, 1]) * np.cos(pose[b, 0])
        rotations[b, 1, 0] = np.sin(pose[b, 1])
        rotations[b, 1, 1] = np.cos(pose[b, 1]) * np.cos(pose[b, 0])
        rotations[b, 2, 1] = np.sin(pose[b, 0])
        rotations[b, 2, 2] = np.cos(pose[b, 0])
        rotations[b, 1, 2] = -np.sin(pose[b, 0])
        rotations[b, 3, 3] = 1.0
    relatives = np.zeros((N, 4, 4))
    for b in range(N):
        relatives[b] = base[b] @ rotations[b]
    chained = np.zeros((N, 4, 4))
    for b in range(N):
        if b == 0:
            chained[b] = relatives[b]
        else:
            chained[b] = chained[b - 1] @ relatives[b]
    out[:] = chained


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(4, 9))
def test_a_map_writing_part_of_each_block_does_not_start_a_range(seed, n):
    # Found writing GradBench's hand tracking: the map writes 8 of each block's 16 entries, but the memlet
    # out of it names the whole array (DaCe's bounding box), which the pass took for an overwrite: the
    # map's range moved into a fresh array, its zeros lost, and the program returned inf/nan
    rng = np.random.default_rng(seed)
    args = {"theta": rng.uniform(-1, 1, 4), "base": rng.uniform(-1, 1, (n, 4, 4))}
    graph = gradflow.Graph.of(posed_rotations)
    want, got = np.zeros((n, 4, 4)), np.zeros((n, 4, 4))
    gradflow.runtime.Runner(graph)(**args, out=want)
    gradflow.runtime.Runner(OPTIMIZE(graph).unwrap())(**args, out=got)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def _copy_program(kind: str) -> dace.SDFG:
    """A = 2 x; y = A + 1; B = A (a whole copy naming only its source, as the backward's working copies
    are made); z = B * 3 + x. `kind` "read_after": A is read again after the copy; "part": only part of A is
    copied; "written_in_copy_state": the copy's state also writes A."""
    sdfg = dace.SDFG(f"whole_copy_{kind}")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    for name in ("A", "B"):
        sdfg.add_transient(name, [N], dace.float64)
    s0 = sdfg.add_state("write_a")
    s0.add_mapped_tasklet("a", {"i": "0:N"}, {"u": dace.Memlet("x[i]")}, "v = 2 * u", {"v": dace.Memlet("A[i]")},
                          external_edges=True)
    s1 = sdfg.add_state_after(s0, "read_a")
    s1.add_mapped_tasklet("ya", {"i": "0:N"}, {"u": dace.Memlet("A[i]")}, "v = u + 1", {"v": dace.Memlet("y[i]")},
                          external_edges=True)
    s2 = sdfg.add_state_after(s1, "copy")
    a, b = s2.add_read("A"), s2.add_write("B")
    s2.add_nedge(a, b, dace.Memlet("A[0:N - 1]" if kind == "part" else "A[0:N]"))
    if kind == "part":
        s2.add_mapped_tasklet("b_last", {"i": "N - 1:N"}, {}, "v = 7", {"v": dace.Memlet("B[i]")},
                              external_edges=True, output_nodes={"B": b})
    if kind == "written_in_copy_state":
        s2.add_mapped_tasklet("a_again", {"i": "0:N"}, {"u": dace.Memlet("x[i]")}, "v = 5 * u",
                              {"v": dace.Memlet("A[i]")}, external_edges=True)
    s3 = sdfg.add_state_after(s2, "read_b")
    s3.add_mapped_tasklet("zb", {"i": "0:N"}, {"u": dace.Memlet("B[i]"), "w": dace.Memlet("x[i]")}, "v = u * 3 + w",
                          {"v": dace.Memlet("z[i]")}, external_edges=True)
    if kind == "read_after":
        s4 = sdfg.add_state_after(s3, "read_a_again")
        s4.add_mapped_tasklet("ya2", {"i": "0:N"}, {"u": dace.Memlet("A[i]"), "w": dace.Memlet("y[i]")},
                              "v = u * w", {"v": dace.Memlet("y[i]")}, external_edges=True)
    return sdfg


def test_a_whole_copy_of_a_dead_array_becomes_no_copy_and_computes_the_same():
    sdfg = _copy_program("plain")
    sdfg.validate()
    found = plan(sdfg)
    assert [(seg.array, buffer) for seg, buffer in found.placed] == [("B", "A")]
    assert [(state.label, src.data, dst.data) for state, src, dst in found.joined] == [("copy", "A", "B")]
    after = ShareDeadBuffers()(Graph.of(sdfg)).unwrap().sdfg
    after.validate()
    assert "B" not in after.arrays
    assert not any(isinstance(e.src, dace.nodes.AccessNode) and isinstance(e.dst, dace.nodes.AccessNode)
                   for state in after.states() for e in state.edges()), "the copy is still there"
    x = np.arange(1, 7, dtype=np.float64)
    outs = [_outputs(program, x) for program in (sdfg, after)]
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_array_equal(outs[1][1], outs[0][1])
    np.testing.assert_array_equal(outs[0][1], 6 * x + x)


def test_a_copy_stays_where_its_source_is_not_dead_or_not_copied_whole():
    for kind in ("read_after", "part", "written_in_copy_state"):
        sdfg = _copy_program(kind)
        sdfg.validate()
        assert plan(sdfg).joined == [], kind
        after = ShareDeadBuffers()(Graph.of(sdfg)).unwrap().sdfg
        x = np.arange(1, 7, dtype=np.float64)
        outs = [_outputs(program, x) for program in (sdfg, after)]
        np.testing.assert_array_equal(outs[1][0], outs[0][0])
        np.testing.assert_array_equal(outs[1][1], outs[0][1])


S = dace.symbol("S")


@dace.program
def euler_steps(x: dace.float64[N], y: dace.float64[N], out: dace.float64[1]):
    t = np.ndarray([N], dtype=np.float64)
    for _ in range(S):
        t[0] = x[0]
        t[1:] = np.sin(y[:-1]) * x[1:]
        y[:] = y + 0.1 * t * t
    out[0] = np.sum(y * y)


def _working_copies(sdfg: dace.SDFG) -> list[tuple[str, str]]:
    """The whole-array copies between two transients in the backward's first state."""
    init = next(s for s in sdfg.states() if s.label == "init_gradients")
    return [(e.src.data, e.dst.data) for e in init.edges()
            if isinstance(e.src, dace.nodes.AccessNode) and isinstance(e.dst, dace.nodes.AccessNode)
            and sdfg.arrays[e.src.data].transient and sdfg.arrays[e.dst.data].total_size != 1]


def test_the_backwards_working_copy_of_a_loop_temporary_is_dropped():
    with_copies = gradflow.grad(euler_steps, wrt=["x", "y"], of="out", optimize=OPTIMIZE.without("share_dead_buffers"))
    assert ("t", "gradflow_work_t") in _working_copies(with_copies)
    assert _working_copies(gradflow.grad(euler_steps, wrt=["x", "y"], of="out")) == []


@functools.cache
def _euler_grad():
    return gradflow.value_and_grad(euler_steps, wrt=["x", "y"], of="out")


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(0, 4))
def test_the_gradient_through_a_loop_temporary_without_its_working_copy_is_torchs(seed, steps):
    import torch

    rng = np.random.default_rng(seed)
    x, y = rng.uniform(-1, 1, 7), rng.uniform(-1, 1, 7)
    _, grads = _euler_grad()(x=x.copy(), y=y.copy(), out=np.zeros(1), S=steps)
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    v = ty
    for _ in range(steps):
        t = torch.cat([tx[:1], torch.sin(v[:-1]) * tx[1:]])
        v = v + 0.1 * t * t
    gx, gy = torch.autograd.grad((v * v).sum(), [tx, ty], allow_unused=True, materialize_grads=True)
    np.testing.assert_allclose(grads["x"], gx.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads["y"], gy.numpy(), rtol=1e-12, atol=1e-14)
