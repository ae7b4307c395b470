"""`persistent_tapes`: the top-level tape stacks of a differentiated program are allocated once per handle
(sizes), not per call. Not in the default pipeline (DaCe's `CompiledSDFG` keeps one state, sized by its
first call), but applied by gradflow's `Runner`, which keeps one handle per set of sizes: repeated calls
with other values and calls at other sizes give the gradients of the default pipeline's build."""

from __future__ import annotations

import dace
import numpy as np

import gradflow
from gradflow.optimize import OPTIMIZE, PersistentTapes
from gradflow.runtime.calling import Runner, is_stateful
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


@dace.program
def running_product(x: dace.float64[N], w: dace.float64[N], S: dace.float64[1]):
    p = 1.0
    for i in range(N):
        p = p * np.tanh(x[i]) + w[i]  # p is overwritten every iteration: pushed on the tape
        S[0] += p


def _same_gradients(runner, reference) -> None:
    rng = np.random.default_rng(12)
    for n in (7, 7, 31, 7):  # a second call on one handle, another size, back to the first handle
        x, w = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
        got = {"grad_x": np.full(n, np.nan), "grad_w": np.full(n, np.nan), "S": np.zeros(1)}
        want = {"grad_x": np.full(n, np.nan), "grad_w": np.full(n, np.nan), "S": np.zeros(1)}
        runner(x=x.copy(), w=w.copy(), **got, N=n)
        reference(x=x.copy(), w=w.copy(), **want, N=n)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-13, atol=1e-15, err_msg=k)


def test_runner_makes_the_default_build_s_tapes_persistent() -> None:
    """`Runner` compiles a program with its stacks persistent; the graph it was given is left as it was."""
    graph = gradflow.grad(running_product, wrt=["x", "w"], of="S")
    before = {n: d.lifetime for n, d in graph.arrays.items()}
    runner = Runner(graph)
    assert runner.kernel.stateful and is_stateful(runner.kernel.compiled.sdfg)
    assert {n: d.lifetime for n, d in graph.arrays.items()} == before
    _same_gradients(runner, compile_sdfg(graph))


def test_tapes_are_persistent_and_calls_do_not_see_earlier_ones() -> None:
    with_pass = gradflow.grad(running_product, wrt=["x", "w"], of="S", optimize=OPTIMIZE + PersistentTapes())
    without = gradflow.grad(running_product, wrt=["x", "w"], of="S")
    tapes = [n for n, d in with_pass.arrays.items() if n.startswith("gradflow_tape_") and d.transient]
    assert tapes and all(with_pass.arrays[n].lifetime == dace.AllocationLifetime.Persistent for n in tapes)
    assert all(without.arrays[n].lifetime != dace.AllocationLifetime.Persistent for n in without.arrays
               if n.startswith("gradflow_tape_"))
    assert is_stateful(with_pass)
    _same_gradients(Runner(with_pass), compile_sdfg(without))
