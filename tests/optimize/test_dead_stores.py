"""`drop_dead_stores`: a plain write into a transient that nothing reads afterwards goes (the resets of
consumed gradients and the zeroing of buffers nothing reads, in reverse mode's output); a write that a
later state, a later node of its state or another iteration of a loop may read stays. Every corpus
program's gradients stay those of the unoptimized route (test_two_routes.py)."""

from __future__ import annotations

import dace
import numpy as np
from dace.sdfg import nodes as nd

from gradflow.core.graph import Graph
from gradflow.optimize.dead_stores import DropDeadStores
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


def _unread_transient() -> dace.SDFG:
    """One map writing y and a transient tmp that nothing reads (built directly: DaCe's simplify would
    remove tmp itself, and without it the tasklet sits in a nested SDFG)."""
    sdfg = dace.SDFG("unread_transient")
    sdfg.add_array("x", [N], dace.float64)
    sdfg.add_array("y", [N], dace.float64)
    sdfg.add_transient("tmp", [N], dace.float64)
    sdfg.add_state().add_mapped_tasklet("both", {"i": "0:N"}, {"a": dace.Memlet("x[i]")}, "o = 2 * a\nt = a + 1",
                                        {"o": dace.Memlet("y[i]"), "t": dace.Memlet("tmp[i]")}, external_edges=True)
    return sdfg


@dace.program
def read_next_iteration(x: dace.float64[N], y: dace.float64[N]):
    tmp = np.zeros_like(x)
    for k in range(3):
        for i in dace.map[0:N]:
            with dace.tasklet:
                a << x[i]
                b << tmp[i]
                o >> y[i]
                o = a + b
        for i in dace.map[0:N]:
            with dace.tasklet:
                a << x[i]
                t >> tmp[i]
                t = a * (k + 1)


@dace.program
def read_after_the_write(x: dace.float64[N], y: dace.float64[N], s: dace.float64[1]):
    tmp = np.empty_like(x)
    for i in dace.map[0:N]:
        with dace.tasklet:
            a << x[i]
            t >> tmp[i]
            t = a * a
    s[0] = 1.0
    y[:] = tmp + s[0]


def _accesses(graph: Graph, name: str) -> int:
    return sum(1 for n, _ in graph.sdfg.all_nodes_recursive() if isinstance(n, nd.AccessNode) and n.data == name)


def _run(graph: Graph, n: int = 9) -> np.ndarray:
    x = np.linspace(-1.0, 2.0, n).copy()  # linspace returns a view
    y = np.zeros(n)
    args = {"s": np.zeros(1)} if "s" in graph.sdfg.arrays else {}
    compile_sdfg(graph)(x=x, y=y, N=n, **args)
    return y


def test_a_transient_nothing_reads_is_not_written() -> None:
    plain = Graph.of(_unread_transient())
    assert _accesses(plain, "tmp") > 0
    dropped = DropDeadStores()(plain).unwrap()
    assert _accesses(dropped, "tmp") == 0 and "tmp" not in dropped.sdfg.arrays
    np.testing.assert_array_equal(_run(dropped), _run(plain))


def test_writes_read_later_stay() -> None:
    for program in (read_next_iteration, read_after_the_write):
        plain = Graph.of(program.to_sdfg())
        assert DropDeadStores()(plain).unwrap().fingerprint == plain.fingerprint, program.name


def test_values_read_by_a_later_iteration_are_right() -> None:
    # the last iteration adds the tmp the one before wrote (2 x): y = 3 x
    graph = DropDeadStores()(Graph.of(read_next_iteration.to_sdfg())).unwrap()
    x = np.linspace(-1.0, 2.0, 9).copy()
    np.testing.assert_allclose(_run(graph), x + 2 * x, rtol=1e-15)
