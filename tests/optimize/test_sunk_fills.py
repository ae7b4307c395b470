"""`sink_fills`: a constant fill of a transient moves to just before the array's next touch, only where the
pass can show that nothing touches the array between the two places, and the program computes the same."""

from __future__ import annotations

import dace
import numpy as np
from dace.sdfg.state import LoopRegion

import gradflow
from gradflow.core.graph import Graph
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.sunk_fills import SinkFills, moves
from gradflow.runtime.compile import compile_sdfg
from gradflow.verify.corpus import dataflow

N = dace.symbol("N")


def _program(kind: str) -> dace.SDFG:
    """T = 0 (with other work beside it), three states that do not touch T, then T += x; y = T * 2.
    `kind` breaks one condition of the rewrite, or puts the accumulation in a loop."""
    sdfg = dace.SDFG(f"early_fill_{kind}")
    for name in ("x", "y", "z"):
        sdfg.add_array(name, [N], dace.float64)
    sdfg.add_transient("T", [N], dace.float64)
    sdfg.add_symbol("k", dace.int64)  # set after the fill (read by it in "reads_a_varying_symbol")
    init = sdfg.add_state("init", is_start_block=True)
    value = "k" if kind == "reads_a_varying_symbol" else "0.0"
    fill_range = "0:N" if kind != "partial" else "0:N-1"
    init.add_mapped_tasklet("fill_T", {"i": fill_range}, {}, f"v = {value}", {"v": dace.Memlet("T[i]")},
                            external_edges=True)
    init.add_mapped_tasklet("fill_z", {"i": "0:N"}, {}, "v = 1.0", {"v": dace.Memlet("z[i]")}, external_edges=True)
    state = init
    for k in range(3):
        after = sdfg.add_state_after(state, f"work_{k}", assignments={"k": str(k + 1)} if k == 0 else None,
                                     condition="N > 3" if k == 1 and kind == "behind_a_condition" else None)
        after.add_mapped_tasklet(f"w{k}", {"i": "0:N"}, {"u": dace.Memlet("z[i]")}, "v = u * 1.5",
                                 {"v": dace.Memlet("z[i]")}, external_edges=True)
        state = after
    if kind == "in_a_loop":
        loop = LoopRegion("twice", "j < 2", "j", "j = 0", "j = j + 1")
        sdfg.add_node(loop)
        sdfg.add_edge(state, loop, dace.InterstateEdge())
        use = loop.add_state("accumulate", is_start_block=True)
    else:
        use = sdfg.add_state_after(state, "accumulate")
    use.add_mapped_tasklet("acc", {"i": "0:N"}, {"u": dace.Memlet("x[i]")}, "v = u",
                           {"v": dace.Memlet("T[i]", wcr="lambda a, b: a + b")}, external_edges=True)
    read = sdfg.add_state_after(loop if kind == "in_a_loop" else use, "read")
    read.add_mapped_tasklet("out", {"i": "0:N"}, {"u": dace.Memlet("T[i]")}, "v = u * 2", {"v": dace.Memlet("y[i]")},
                            external_edges=True)
    return sdfg


def _run(sdfg: dace.SDFG) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(1, 7, dtype=np.float64)
    y, z = np.zeros(6), np.zeros(6)
    compile_sdfg(sdfg)(x=x, y=y, z=z, N=6)
    return y, z


def _fill_state(sdfg: dace.SDFG) -> str:
    return next(s.label for s in sdfg.states() for n in s.data_nodes() if n.data == "T" and s.out_degree(n) == 0
                and any(e.data.wcr is None for e in s.in_edges(n)))


def test_a_fill_moves_to_its_next_touch_and_the_program_computes_the_same():
    for kind in ("plain", "in_a_loop"):
        sdfg = _program(kind)
        assert [(m.state.label, len(m.components)) for m in moves(sdfg)] == [("init", 1)], kind
        after = SinkFills()(Graph.of(sdfg)).unwrap().sdfg
        after.validate()
        assert _fill_state(after).startswith("fill_before_"), kind
        assert moves(after) == [], kind
        # the other fill, z's, stays where it was (z is an argument)
        assert any(n.data == "z" for s in after.states() if s.label == "init" for n in s.data_nodes())
        for got, want in zip(_run(after), _run(sdfg)):
            np.testing.assert_array_equal(got, want)


def test_nothing_moves_where_it_cannot_be_shown():
    # a fill of part of T (the rest is what T held), a fill reading a symbol the program sets after it, a
    # conditional edge on the way (a region may end there, and what follows it would miss the fill)
    for kind in ("partial", "reads_a_varying_symbol", "behind_a_condition"):
        assert moves(_program(kind)) == [], kind


def test_sunk_gradient_buffers_share_and_the_gradients_stay():
    # the reverse zero-fills every gradient buffer at its start; sunk, their live ranges are apart
    def transient_bytes(sdfg):
        return sum(int(dace.symbolic.evaluate(d.total_size, {N: 8})) * d.dtype.bytes
                   for d in sdfg.arrays.values() if d.transient and type(d) is dace.data.Array)

    program, kept = dataflow.df_states_sequence, OPTIMIZE.without("sink_fills")
    sunk = gradflow.grad(program, wrt="X", of="S")
    unsunk = gradflow.grad(program, wrt="X", of="S", optimize=kept)
    assert transient_bytes(sunk) < transient_bytes(unsunk)
    rng = np.random.default_rng(5)
    args = {"X": rng.uniform(-1, 1, 8), "Y": np.zeros(8), "s": np.zeros(1), "S": np.zeros(1)}
    grads = [gradflow.value_and_grad(program, wrt="X", of="S", optimize=o)(**{k: v.copy() for k, v in args.items()})[1]
             for o in (True, kept)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-13, atol=1e-15)  # d S / d X (one wrt)
