"""`loops_to_maps`: counted loops with independent iterations and one-state bodies become maps, so reverse
mode needs no tape for them. Here: what converts, what must stay a loop, and that the converted program
computes what the loop did. The gradients of every corpus program through `NORMALIZE` (which runs this
pass) are checked against torch.autograd by the corpus tests."""

from __future__ import annotations

import dace
import numpy as np
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion

from gradflow.api import grad_graph
from gradflow.transforms.parallel_loops import LoopsToMaps
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg

N = dace.symbol("N")


@dace.program
def weighted_sum(A: dace.float64[N, N], B: dace.float64[N, N], S: dace.float64[1]):
    """go_fast's second loop nest: every iteration adds into S."""
    for i in range(N):
        for j in range(N):
            S[0] += B[i, j] * B[i, j] * A[j, i]


@dace.program
def prefix_sum(x: dace.float64[N], S: dace.float64[1]):
    """Iteration i reads what iteration i - 1 wrote: not a map."""
    for i in range(1, N):
        x[i] = x[i] + x[i - 1]
    S[0] = np.sum(x)


def _loops(sdfg: dace.SDFG) -> list[LoopRegion]:
    return [r for r in sdfg.all_control_flow_regions(recursive=True) if isinstance(r, LoopRegion)]


def test_a_loop_nest_summing_into_one_element_becomes_a_map_with_a_sum() -> None:
    plain = Graph.of(weighted_sum.to_sdfg())
    mapped = LoopsToMaps()(plain).unwrap()
    assert _loops(plain.sdfg) and not _loops(mapped.sdfg)
    assert not any(isinstance(n, nd.NestedSDFG) for n, _ in mapped.sdfg.all_nodes_recursive())
    sums = [e for e, _ in mapped.sdfg.all_edges_recursive()
            if isinstance(e.data, dace.Memlet) and e.data.data == "S" and e.data.wcr is not None]
    assert sums
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((9, 9)), rng.standard_normal((9, 9))
    results = []
    for graph in (plain, mapped):
        S = np.full(1, 0.25)
        compile_sdfg(graph)(A=A, B=B, S=S, N=9)
        results.append(S[0])
    expected = 0.25 + np.sum(B * B * A.T)
    np.testing.assert_allclose(results, [expected, expected], rtol=1e-12)


def test_the_gradient_of_the_converted_nest_needs_no_tape() -> None:
    graph = grad_graph(weighted_sum.to_sdfg(), ["A", "B"], "S")
    assert not [name for name in graph.sdfg.arrays if name.startswith("gradflow_tape")]
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((7, 7)), rng.standard_normal((7, 7))
    grads = {"grad_A": np.zeros((7, 7)), "grad_B": np.zeros((7, 7))}
    compile_sdfg(graph)(A=A, B=B, S=np.zeros(1), **grads, N=7)
    np.testing.assert_allclose(grads["grad_A"], (B * B).T, rtol=1e-12)
    np.testing.assert_allclose(grads["grad_B"], 2 * B * A.T, rtol=1e-12)


def test_a_loop_carrying_a_dependence_stays_a_loop() -> None:
    plain = Graph.of(prefix_sum.to_sdfg())
    assert LoopsToMaps()(plain).unwrap() is plain


def test_a_loop_whose_body_has_several_states_stays_a_loop() -> None:
    @dace.program
    def branchy(x: dace.float64[N], S: dace.float64[1]):
        for i in range(N):
            if x[i] > 0:
                x[i] = 2.0 * x[i]
        S[0] = np.sum(x)

    plain = Graph.of(branchy.to_sdfg())
    assert LoopsToMaps()(plain).unwrap() is plain


def test_a_converted_inner_loop_tapes_only_what_its_map_writes() -> None:
    """softmax's `for j: P[i, j] = P[i, j] / s` inside the loop over rows: the map writes row i, so the
    tape saves that row per iteration, not all of P (unpropagated memlets made it 2 GB at 256 x 512)."""
    from gradflow.verify.corpus import loops

    graph = grad_graph(loops.lp_softmax.to_sdfg(), ["X"], "S")
    tapes = {name: desc.total_size for name, desc in graph.sdfg.arrays.items() if name.startswith("gradflow_tape")}
    assert tapes
    sizes = {name: int(dace.symbolic.evaluate(size, {"N": 7, "M": 5})) for name, size in tapes.items()}
    assert max(sizes.values()) <= 7 * 5, sizes


def test_loops_named_to_keep_stay_loops() -> None:
    """A checkpointing policy names loops by label; `ad_pipeline` passes them as `keep`."""
    plain = Graph.of(weighted_sum.to_sdfg())
    outer = next(r for r in _loops(plain.sdfg) if r.parent_graph is plain.sdfg)
    kept = LoopsToMaps(keep={outer.label})(plain).unwrap()
    assert [r.label for r in _loops(kept.sdfg)] == [outer.label]
    assert any(isinstance(n, nd.MapEntry) for n, _ in kept.sdfg.all_nodes_recursive())


@dace.program
def lower_triangle(A: dace.float64[N, N], S: dace.float64[1]):
    """A triangle of independent terms: `for i: for j in range(i + 1): s += ...`."""
    s = 0.0
    for i in range(N):
        for j in range(i + 1):
            s += A[i, j] * A[j, i]
    S[0] = s


def test_a_loop_around_a_ragged_map_stays_a_loop_before_reverse_mode() -> None:
    """The inner loop's map ranges over `0:i + 1`: a map over i around it is a nest `collapse_maps` cannot
    merge, which reverse mode does not differentiate (refused until 2026-12-05). `OPTIMIZE` keeps the nest;
    reverse mode's `NORMALIZE` leaves the outer loop a loop, and the gradient is the triangle's."""
    plain = Graph.of(lower_triangle.to_sdfg())
    nested = LoopsToMaps()(plain).unwrap()
    assert not _loops(nested.sdfg)
    kept = LoopsToMaps(ragged=False)(plain).unwrap()
    assert [r.loop_variable for r in _loops(kept.sdfg)] == ["i"]
    assert any(isinstance(n, nd.MapEntry) for n, _ in kept.sdfg.all_nodes_recursive())
    graph = grad_graph(lower_triangle.to_sdfg(), ["A"], "S")
    A = np.random.default_rng(4).standard_normal((6, 6))
    grads = {"grad_A": np.zeros((6, 6))}
    compile_sdfg(graph)(A=A, S=np.zeros(1), **grads, N=6)
    lower = np.tril(np.ones((6, 6)))
    np.testing.assert_allclose(grads["grad_A"], lower * A.T + (lower * A).T, rtol=1e-12)


def test_a_loop_body_written_as_several_statements_converts() -> None:
    """softmax's `for j: P[i, j] = np.exp(X[i, j] - m); s += P[i, j]`: the frontend makes the body a chain
    of states and reads P[i, j] back; merged and passed through a temporary, the loop is a map whose sum
    into `s` is a write-conflict sum. The max loop (`m = max(m, X[i, j])`) carries m: it stays a loop."""
    from gradflow.verify.corpus import loops

    plain = Graph.of(loops.lp_softmax.to_sdfg())
    mapped = LoopsToMaps()(plain).unwrap()
    before, after = len(_loops(plain.sdfg)), len(_loops(mapped.sdfg))
    assert after < before
    assert any(r.loop_variable == "j" for r in _loops(mapped.sdfg))  # the max loop
    sums = [e for e, _ in mapped.sdfg.all_edges_recursive()
            if isinstance(e.data, dace.Memlet) and e.data.data == "s" and e.data.wcr is not None]
    assert sums
    rng = np.random.default_rng(3)
    X, W = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    results = []
    for graph in (plain, mapped):
        P, S = np.zeros((4, 6)), np.zeros(1)
        compile_sdfg(graph)(X=X, W=W, P=P, S=S, N=4, M=6)
        results.append((P, S))
    softmax = np.exp(X - X.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    for P, S in results:
        np.testing.assert_allclose(P, softmax, rtol=1e-13)
        np.testing.assert_allclose(S, [np.sum(softmax * W)], rtol=1e-13)


def test_a_row_each_iteration_writes_before_reading_it_is_not_pushed() -> None:
    """In lp_softmax's loop over rows, `P[i, :] = exp(..)` overwrites row i and only later operations of
    the same iteration read it (`P[i, :] /= s`): the old row is never read, so only the division's
    overwrite (whose reverse reads the exp values) is pushed. The gradient is checked against torch with
    the corpus."""
    from gradflow.verify.corpus import loops

    graph = grad_graph(loops.lp_softmax.to_sdfg(), ["X"], "S")
    row_tapes = [name for name in graph.sdfg.arrays if name.startswith("gradflow_tape_P")]
    assert len(row_tapes) == 1, row_tapes


@dace.program
def set_then_add(x: dace.float64[N], S: dace.float64[1]):
    """`gradflow fuzz --seed 31236`, programs 27-28, shrunk: a one-state loop body writes S[0], reads it
    back and writes it again. The first nest carries S (it stays a loop); the second sums into it."""
    for i in range(0, N - 2):
        for j in range(1, N - 1):
            S[0] = 2.0
            S[0] = S[0] + 2.0
    for k in range(2, N - 1, 2):
        for m in range(0, N - 2):
            S[0] += 1.0
    S[0] += np.sum(x)


def _set_then_add(x: np.ndarray) -> float:
    n, S = len(x), 0.0
    for _ in range(0, n - 2):
        for _ in range(1, n - 1):
            S = 2.0
            S = S + 2.0
    S += len(range(2, n - 1, 2)) * (n - 2)
    return S + float(np.sum(x))


def test_a_write_read_back_and_written_again_keeps_its_order() -> None:
    """Routing the first write through the one-element temporary that read it back made the copy into S
    and the second write two unordered writes of S[0]: S came out 2 short (the copy ran last). The rewrite
    is skipped when a later node of the same array follows the read."""
    graph = LoopsToMaps()(Graph.of(set_then_add.to_sdfg())).unwrap()
    program = compile_sdfg(graph)
    rng = np.random.default_rng(5)
    for n in (3, 4, 7):
        x, S = rng.standard_normal(n), np.zeros(1)
        program(x=x, S=S, N=n)
        np.testing.assert_allclose(S, [_set_then_add(x)], rtol=1e-14)


M = dace.symbol("M")


@dace.program
def rows_and_a_fixed_element(x: dace.float64[N, M]):
    """A nest adding into a row per outer iteration and into one fixed element (fuzz seed 10467, program 17)."""
    for i in range(0, N, 3):
        for j in range(0, N - 1, 2):
            x[i, M - 2] += 1.0
            x[1, 2] += 1.0


def test_the_converted_nests_memlets_hold_every_element_its_iterations_write() -> None:
    # DaCe's union of the rows {i} and {1} is `1:i + 1` unless told not to take symbols as positive: the
    # map's memlet then left out row 0, and reverse mode did not keep what the nest overwrote there
    mapped = LoopsToMaps()(Graph.of(rows_and_a_fixed_element.to_sdfg())).unwrap()
    assert not _loops(mapped.sdfg)
    outer = [e.data.subset for state in mapped.sdfg.states() for n in state.nodes()
             if isinstance(n, nd.MapExit) and state.entry_node(n) in state.scope_children()[None]
             for e in state.out_edges(n)]
    assert len(outer) == 1
    for sizes in ({"N": 5, "M": 4}, {"N": 7, "M": 6}, {"N": 3, "M": 5}, {"N": 10, "M": 3}):
        written = {(i, sizes["M"] - 2) for i in range(0, sizes["N"], 3)} | {(1, 2)}
        box = [(int(dace.symbolic.evaluate(b, sizes)), int(dace.symbolic.evaluate(e, sizes))) for b, e, _ in outer[0]]
        assert all(lo <= k <= hi for element in written for k, (lo, hi) in zip(element, box)), (sizes, box)
