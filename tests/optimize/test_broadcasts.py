"""`forward_broadcasts`: a map that only repeats elements of another array (the reverse of a sum spreading
its gradient) is not materialized; its readers read the repeated element. Not where the repeated array
changes between the broadcast and a reader. The gradients stay those of the unoptimized route (here, and
on every corpus program in test_two_routes.py)."""

from __future__ import annotations

import dace
import numpy as np
from dace import Memlet

import gradflow
from gradflow.core.graph import Graph
from gradflow.optimize.broadcasts import ForwardBroadcasts, _candidates
from gradflow.runtime.compile import compile_sdfg
from tests.corpus import npbench

N, M = 6, 4


def _broadcast_program(row: bool, rewrite_source: bool = False) -> dace.SDFG:
    """T[i, j] = s[0] (or s[i]); then, in a later state, out = T * x and, in the one after, out2 = T + 1."""
    sdfg = dace.SDFG(f"broadcast_{'row' if row else 'scalar'}_{int(rewrite_source)}")
    sdfg.add_array("s", [N] if row else [1], dace.float64)
    for name in ("x", "out", "out2"):
        sdfg.add_array(name, [N, M], dace.float64)
    sdfg.add_transient("T", [N, M], dace.float64)
    produce = sdfg.add_state("produce", is_start_block=True)
    produce.add_mapped_tasklet("spread", {"i": f"0:{N}", "j": f"0:{M}"}, {"__g": Memlet("s[i]" if row else "s[0]")},
                               "__o = __g", {"__o": Memlet("T[i, j]")}, external_edges=True)
    last = produce
    if rewrite_source:
        last = sdfg.add_state_after(produce, "rewrite")
        t = last.add_tasklet("zero", {}, {"o"}, "o = 0")
        last.add_edge(t, "o", last.add_write("s"), None, Memlet("s[0]"))
    use = sdfg.add_state_after(last, "use")
    use.add_mapped_tasklet("times", {"i": f"0:{N}", "j": f"0:{M}"}, {"__t": Memlet("T[i, j]"), "__x": Memlet("x[i, j]")},
                           "__o = __t * __x", {"__o": Memlet("out[i, j]")}, external_edges=True)
    again = sdfg.add_state_after(use, "again")
    again.add_mapped_tasklet("plus", {"i": f"0:{N}", "j": f"0:{M}"}, {"__t": Memlet("T[i, j]")},
                             "__o = __t + 1", {"__o": Memlet("out2[i, j]")}, external_edges=True)
    return sdfg


def test_readers_read_the_repeated_element() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, M))
    for row in (False, True):
        graph = Graph.of(_broadcast_program(row))
        assert sum(len(list(_candidates(s))) for s in graph.sdfg.all_sdfgs_recursive()) == 1
        out_graph = ForwardBroadcasts()(graph).unwrap()
        assert "T" not in out_graph.sdfg.arrays
        out_graph.sdfg.validate()
        s = rng.standard_normal(N if row else 1)
        out, out2 = np.zeros((N, M)), np.zeros((N, M))
        compile_sdfg(out_graph)(s=s, x=x, out=out, out2=out2)
        spread = np.broadcast_to(s[:, None] if row else s[0], (N, M))
        np.testing.assert_allclose(out, spread * x, rtol=1e-15)
        np.testing.assert_allclose(out2, spread + 1, rtol=1e-15)


def test_not_across_a_write_of_the_repeated_array() -> None:
    graph = Graph.of(_broadcast_program(row=False, rewrite_source=True))
    assert sum(len(list(_candidates(s))) for s in graph.sdfg.all_sdfgs_recursive()) == 0
    assert ForwardBroadcasts()(graph).unwrap() is graph


def test_the_gradient_of_a_final_sum_is_not_spread() -> None:
    """nb_go_fast (`S = sum((a + trace) * ct)`): no matrix holds copies of the sum's gradient."""
    plain = gradflow.grad(npbench.nb_go_fast, wrt="a", of="S", optimize=False)
    fast = gradflow.grad(npbench.nb_go_fast, wrt="a", of="S")

    def spread(sdfg) -> int:
        return sum(1 for name, d in sdfg.arrays.items() if d.transient and len(d.shape) == 2 and "g_res" in name)

    assert spread(plain) == 1 and spread(fast) == 0
    rng = np.random.default_rng(3)
    n = 5
    a, ct = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    grads = [np.full((n, n), np.nan), np.full((n, n), np.nan)]
    for sdfg, g in zip((plain, fast), grads):
        compile_sdfg(sdfg)(a=a.copy(), ct_res=ct, S=np.zeros(1), grad_a=g, N=n)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-13)
    np.testing.assert_allclose(grads[1], ct + np.diag((1 - np.tanh(np.diag(a)) ** 2) * ct.sum()), rtol=1e-12)


def _added_broadcast_program() -> dace.SDFG:
    """T = 2 x; T[i, j] += s[i] (a sum's gradient added to its summands'); out = T * y."""
    sdfg = dace.SDFG("broadcast_added")
    sdfg.add_array("s", [N], dace.float64)
    for name in ("x", "y", "out"):
        sdfg.add_array(name, [N, M], dace.float64)
    sdfg.add_transient("T", [N, M], dace.float64)
    first = sdfg.add_state("first", is_start_block=True)
    first.add_mapped_tasklet("twice", {"i": f"0:{N}", "j": f"0:{M}"}, {"__x": Memlet("x[i, j]")}, "__o = 2 * __x",
                             {"__o": Memlet("T[i, j]")}, external_edges=True)
    spread = sdfg.add_state_after(first, "spread")
    spread.add_mapped_tasklet("spread", {"i": f"0:{N}", "j": f"0:{M}"}, {"__g": Memlet("s[i]")}, "__o = __g",
                              {"__o": Memlet("T[i, j]", wcr="lambda a, b: a + b")}, external_edges=True)
    use = sdfg.add_state_after(spread, "use")
    use.add_mapped_tasklet("times", {"i": f"0:{N}", "j": f"0:{M}"}, {"__t": Memlet("T[i, j]"), "__y": Memlet("y[i, j]")},
                           "__o = __t * __y", {"__o": Memlet("out[i, j]")}, external_edges=True)
    return sdfg


def test_an_added_broadcast_is_added_by_its_readers() -> None:
    graph = Graph.of(_added_broadcast_program())
    [found] = _candidates(graph.sdfg)
    assert found.adds
    out_graph = ForwardBroadcasts()(graph).unwrap()
    assert not any(s.label == "spread" and s.nodes() for s in out_graph.sdfg.states())
    out_graph.sdfg.validate()
    rng = np.random.default_rng(8)
    s, x, y = rng.standard_normal(N), rng.standard_normal((N, M)), rng.standard_normal((N, M))
    out = np.zeros((N, M))
    compile_sdfg(out_graph)(s=s, x=x, y=y, out=out)
    np.testing.assert_allclose(out, (2 * x + s[:, None]) * y, rtol=1e-15)
