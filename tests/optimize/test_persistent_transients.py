"""`persistent_transients`: the top-level temporaries whose value on entry no call reads are allocated once per
handle (set of sizes), not per call. `Runner` compiles every program with it; repeated calls, calls at other
sizes and calls back at sizes whose handle was finalized give what the plain build gives."""

from __future__ import annotations

import dace
import numpy as np

import gradflow
from benchmarks.gradbench.programs.kmeans import kmeans as nearest  # all-pairs distances and their minimum
from gradflow.optimize import OPTIMIZE, PersistentTransients
from gradflow.optimize.persistent_transients import candidates
from gradflow.runtime import calling
from gradflow.runtime.calling import Runner, is_stateful
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


@dace.program
def accumulates_into_a_fresh_array(x: dace.float64[N], S: dace.float64[1]):
    t = np.ndarray([N], dtype=np.float64)  # never initialised: its value on entry is read
    t[:] += x
    S[0] = np.sum(t)


def _optimized() -> gradflow.Graph:
    return gradflow.optimize.optimized(nearest)


def _call(call, n: int, k: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    S = np.full(1, np.nan)
    call(points=rng.uniform(-1, 1, (n, d)), centroids=rng.uniform(-1, 1, (k, d)), S=S, N=n, K=k, D=d)
    return S


def test_the_product_is_persistent_in_what_runner_compiles_and_calls_agree() -> None:
    graph = _optimized()
    product = [n for n, d in graph.sdfg.arrays.items() if d.transient and len(d.shape) == 2 and "matmul" in n]
    assert product and set(product) <= set(candidates(graph.sdfg))
    runner = Runner(graph)
    compiled = runner.kernel.compiled.sdfg
    assert all(compiled.arrays[n].lifetime == dace.AllocationLifetime.Persistent for n in product)
    assert all(graph.sdfg.arrays[n].lifetime == dace.AllocationLifetime.Scope for n in product)  # untouched
    assert runner.kernel.stateful and is_stateful(compiled)
    plain = compile_sdfg(graph)
    # the same sizes twice (the second call sees the first one's temporaries), others, then back
    for seed, (n, k, d) in enumerate([(40, 7, 3), (40, 7, 3), (90, 11, 2), (40, 7, 3)]):
        np.testing.assert_allclose(_call(runner, n, k, d, seed), _call(plain, n, k, d, seed), rtol=1e-13)


def test_a_temporary_whose_value_on_entry_is_read_keeps_its_lifetime() -> None:
    sdfg = accumulates_into_a_fresh_array.to_sdfg()
    transients = [n for n, d in sdfg.arrays.items() if d.transient and type(d) is dace.data.Array
                  and d.shape == (N,)]
    assert transients and not set(transients) & set(candidates(sdfg))
    out = PersistentTransients()(gradflow.Graph.of(sdfg)).unwrap()
    assert all(out.sdfg.arrays[n].lifetime == dace.AllocationLifetime.Scope for n in transients)


def test_runner_keeps_the_handles_of_the_last_sizes_only() -> None:
    runner = Runner(_optimized())
    plain = compile_sdfg(_optimized())
    sizes = [(10 + i, 3, 2) for i in range(calling.MAX_HANDLES + 3)]
    for seed, size in enumerate(sizes + sizes[:2]):  # the first two were finalized: made again
        np.testing.assert_allclose(_call(runner, *size, seed), _call(plain, *size, seed), rtol=1e-13)
        assert len(runner.kernel._handles) <= calling.MAX_HANDLES  # noqa: SLF001
    order = runner.plan.init_args
    recent = [tuple({"N": n, "K": k, "D": d}[s] for s in order) for n, k, d in sizes[2:] + sizes[:2]]
    assert list(runner.kernel._handles) == recent[-calling.MAX_HANDLES:]  # noqa: SLF001 - least recent first


def test_the_pass_composes_with_optimize_for_a_gradient() -> None:
    """A differentiated program through `OPTIMIZE + PersistentTransients()`, called through `Runner` at two
    sizes and back, gives the gradients of the default build."""
    with_pass = gradflow.grad(nearest, wrt="centroids", of="S", optimize=OPTIMIZE + PersistentTransients())
    without = gradflow.grad(nearest, wrt="centroids", of="S")
    assert any(d.lifetime == dace.AllocationLifetime.Persistent for d in with_pass.arrays.values())
    runner, plain = Runner(with_pass), compile_sdfg(without)
    for seed, (n, k, d) in enumerate([(30, 5, 3), (30, 5, 3), (50, 4, 3), (30, 5, 3)]):
        rng = np.random.default_rng(seed)
        points, centroids = rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, (k, d))
        got = {"grad_centroids": np.full((k, d), np.nan), "S": np.zeros(1)}
        want = {"grad_centroids": np.full((k, d), np.nan), "S": np.zeros(1)}
        runner(points=points, centroids=centroids, **got, N=n, K=k, D=d)
        plain(points=points, centroids=centroids, **want, N=n, K=k, D=d)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-12, err_msg=name)
