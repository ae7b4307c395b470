"""Loop-corpus cases built with DaCe's SDFG API in the unstructured style: loops and branches written as
conditional interstate edges (a guard block, a back edge, a diamond), symbols assigned on interstate edges
and read by the differentiated code, and a while loop whose trip count depends on the data. Part of
`loops.CASES` (see `case.py` for the conventions); each builder returns a fresh SDFG.
"""

from __future__ import annotations

import dace
import numpy as np
import torch
from dace import InterstateEdge

from .case import BuiltProgram, Case, setitem
from .case import normal_inputs as _inputs

N = dace.symbol("N")
M = dace.symbol("M")
f64 = dace.float64


def _z(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float64)


def _arrays(sdfg: dace.SDFG, **shapes) -> None:
    for name, shape in shapes.items():
        sdfg.add_array(name, shape, f64)


def _tasklet(state: dace.SDFGState, ins: dict[str, str], outs: dict[str, str], code: str) -> None:
    """One tasklet in `state`: connector -> memlet for its inputs and outputs."""
    t = state.add_tasklet(f"{state.label}_t", set(ins), set(outs), code)
    for conn, memlet in ins.items():
        state.add_edge(state.add_read(memlet.split("[")[0]), None, t, conn, dace.Memlet(memlet))
    for conn, memlet in outs.items():
        state.add_edge(t, conn, state.add_write(memlet.split("[")[0]), None, dace.Memlet(memlet))


def _map(state: dace.SDFGState, ins: dict[str, str], outs: dict[str, str], code: str, wcr: str | None = None) -> None:
    """A map over j in [0, N) with one tasklet (memlets may use j and any symbol in scope)."""
    state.add_mapped_tasklet(
        f"{state.label}_m", {"j": "0:N"}, {c: dace.Memlet(m) for c, m in ins.items()}, code,
        {c: dace.Memlet(m, wcr=wcr) for c, m in outs.items()}, external_edges=True)


# ----------------------------------------------------------------------------------------------------------
# for i in range(N): if X[i] > 0 ... else ...: a loop of a guard and a back edge around a diamond


def lp_api_loop_branch() -> dace.SDFG:
    sdfg = dace.SDFG("lp_api_loop_branch")
    _arrays(sdfg, X=[N], Y=[N], S=[1])
    init = sdfg.add_state("init", is_start_block=True)
    check, then, other, join = (sdfg.add_state(s) for s in ("check", "then", "other", "join"))
    after = sdfg.add_state("after")
    sdfg.add_edge(check, then, InterstateEdge("X[i] > 0.0"))
    sdfg.add_edge(check, other, InterstateEdge("not (X[i] > 0.0)"))
    sdfg.add_edge(then, join, InterstateEdge())
    sdfg.add_edge(other, join, InterstateEdge())
    _tasklet(then, {"x": "X[i]", "s": "S[0]"}, {"y": "Y[i]", "t": "S[0]"}, "y = x * x\nt = s * 0.9 + x * x")
    _tasklet(other, {"x": "X[i]", "s": "S[0]"}, {"y": "Y[i]", "t": "S[0]"},
             "y = sin(x) * 3.0\nt = s * 0.8 + sin(x) * 3.0 * x")
    _tasklet(join, {"y": "Y[i]", "s": "S[0]"}, {"t": "S[0]"}, "t = s + 0.5 * y * y")
    sdfg.add_loop_state_machine(init, check, after, "i", "0", "i < N", "i + 1", loop_end_state=join)
    return sdfg


def _t_api_loop_branch(X, S, **_):
    s = S[0]
    for i in range(X.shape[0]):
        if X[i] > 0.0:
            y = X[i] * X[i]
            s = s * 0.9 + y
        else:
            y = torch.sin(X[i]) * 3.0
            s = s * 0.8 + y * X[i]
        s = s + 0.5 * y * y
    return s


def _i_api_loop_branch(rng):
    n = 8
    X = rng.uniform(0.2, 1.5, n) * rng.permutation(np.tile([1.0, -1.0], n // 2))  # both signs, away from 0
    return {"X": X, "Y": _z(n), "S": rng.normal(size=1)}


# ----------------------------------------------------------------------------------------------------------
# a while loop of a guard and a back edge whose trip count depends on the data (T grows until it reaches
# 3), accumulating into A at j = k % N; k counts iterations on the back edge, j is assigned on an edge


def lp_api_while_accumulate() -> dace.SDFG:
    sdfg = dace.SDFG("lp_api_while_accumulate")
    _arrays(sdfg, X=[N], W=[N], A=[N], T=[1], S=[1])
    init = sdfg.add_state("init", is_start_block=True)
    guard, enter, grow, step = (sdfg.add_state(s) for s in ("guard", "enter", "grow", "step"))
    after = sdfg.add_state("after")
    sdfg.add_edge(init, guard, InterstateEdge(assignments={"k": "0"}))
    sdfg.add_edge(guard, enter, InterstateEdge("T[0] < 3.0"))
    sdfg.add_edge(guard, after, InterstateEdge("not (T[0] < 3.0)"))
    sdfg.add_edge(enter, grow, InterstateEdge(assignments={"j": "k % N"}))
    sdfg.add_edge(grow, step, InterstateEdge())
    sdfg.add_edge(step, guard, InterstateEdge(assignments={"k": "k + 1"}))
    _tasklet(grow, {"a": "A[j]", "t": "T[0]", "x": "X[j]"}, {"o": "A[j]"}, "o = a + t * x")
    _tasklet(step, {"t": "T[0]", "x": "X[j]"}, {"o": "T[0]"}, "o = t + 0.3 * x * x")
    _map(after, {"a": "A[j]", "w": "W[j]"}, {"s": "S[0]"}, "s = a * w", wcr="lambda p, q: p + q")
    return sdfg


def _t_api_while_accumulate(X, W, A, T, S, **_):
    n = X.shape[0]
    a = list(A.unbind())
    t = T[0]
    k = 0
    while t.item() < 3.0:  # the condition reads data: not differentiated
        j = k % n
        a[j] = a[j] + t * X[j]
        t = t + 0.3 * X[j] * X[j]
        k += 1
    return S[0] + sum(a[j] * W[j] for j in range(n))


def _i_api_while_accumulate(rng):
    n = 5
    return {"X": rng.uniform(0.5, 1.5, n), "W": rng.normal(size=n), "A": rng.normal(size=n),
            "T": rng.uniform(0.0, 0.5, 1), "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# a do-while loop: the body runs before the first test; the back edge tests the data and increments k


def lp_api_do_while() -> dace.SDFG:
    sdfg = dace.SDFG("lp_api_do_while")
    _arrays(sdfg, X=[N], S=[1])
    init = sdfg.add_state("init", is_start_block=True)
    body, after = sdfg.add_state("body"), sdfg.add_state("after")
    sdfg.add_edge(init, body, InterstateEdge(assignments={"k": "0"}))
    sdfg.add_edge(body, body, InterstateEdge("S[0] < 4.0", assignments={"k": "k + 1"}))
    sdfg.add_edge(body, after, InterstateEdge("not (S[0] < 4.0)"))
    _tasklet(body, {"s": "S[0]", "x": "X[k % N]"}, {"o": "S[0]"}, "o = s * 0.9 + x * x + 0.1 * sin(s)")
    return sdfg


def _t_api_do_while(X, S, **_):
    n = X.shape[0]
    s = S[0]
    k = 0
    while True:
        x = X[k % n]
        s = s * 0.9 + x * x + 0.1 * torch.sin(s)
        if not s.item() < 4.0:  # the condition reads data: not differentiated
            return s
        k += 1


def _i_api_do_while(rng):
    n = 4
    S = rng.uniform(0.0, 1.0, 1) if rng.uniform() < 0.7 else rng.uniform(4.5, 5.0, 1)  # sometimes one pass only
    # x >= 0.8 makes the loop end: s -> 0.9 s + x^2 + 0.1 sin(s) has its fixed point above 5.4 > 4. (With
    # x down to 0.4 some draws never ended: the forward ran until its growable tape exhausted memory.)
    return {"X": rng.uniform(0.8, 1.2, n), "S": S}


# ----------------------------------------------------------------------------------------------------------
# a symbol assigned twice per iteration on interstate edges and read by maps: before its first assignment
# in an iteration (the value of the previous iteration, or of the assignment before the loop), between the
# two, and after the second, where it indexes an in-place update


def lp_api_edge_symbols() -> dace.SDFG:
    sdfg = dace.SDFG("lp_api_edge_symbols")
    _arrays(sdfg, A=[N], B=[N], W=[N], S=[1])
    init = sdfg.add_state("init", is_start_block=True)
    first, second, third = (sdfg.add_state(s) for s in ("first", "second", "third"))
    after = sdfg.add_state("after")
    sdfg.add_edge(first, second, InterstateEdge(assignments={"k": "(3 * t + 1) % N"}))
    sdfg.add_edge(second, third, InterstateEdge(assignments={"k": "N - 1 - t % N"}))
    _map(first, {"b": "B[j]", "a": "A[k]", "w": "W[j]"}, {"o": "B[j]"}, "o = b * 0.5 + sin(a) * w")
    _map(second, {"b": "B[j]", "a": "A[k]", "c": "A[j]"}, {"o": "B[j]"}, "o = b + a * c")
    _tasklet(third, {"a": "A[k]", "b": "B[k]"}, {"o": "A[k]"}, "o = a * 0.9 + 0.1 * b")
    before = sdfg.add_state("before")
    sdfg.add_edge(init, before, InterstateEdge(assignments={"k": "2"}))
    sdfg.add_loop_state_machine(before, first, after, "t", "0", "t < N - 2", "t + 1", loop_end_state=third)
    _map(after, {"b": "B[j]", "a": "A[j]"}, {"s": "S[0]"}, "s = b * b + a", wcr="lambda p, q: p + q")
    return sdfg


def _t_api_edge_symbols(A, B, W, S, **_):
    n = A.shape[0]
    k = 2
    for t in range(n - 2):
        B = B * 0.5 + torch.sin(A[k]) * W
        k = (3 * t + 1) % n
        B = B + A[k] * A
        k = n - 1 - t % n
        A = setitem(A, k, A[k] * 0.9 + 0.1 * B[k])
    return S[0] + (B * B + A).sum()


# ----------------------------------------------------------------------------------------------------------
# a symbol read from data: DaCe's frontend turns `k = idx[i]` into an interstate assignment; the element
# it selects is updated in place, several times when idx repeats


@dace.program
def lp_symbol_from_data(X: f64[N], W: f64[M], idx: dace.int64[M], S: f64[1]):
    for i in range(M):
        k = idx[i]
        X[k] = X[k] * W[i] + np.sin(X[k])
        S[0] += X[k] * W[i]


def _t_symbol_from_data(X, W, idx, S, **_):
    x = list(X.unbind())
    s = S[0]
    for i in range(W.shape[0]):
        k = int(idx[i].item())
        x[k] = x[k] * W[i] + torch.sin(x[k])
        s = s + x[k] * W[i]
    return s


def _i_symbol_from_data(rng):
    n, m = 5, 9
    return {"X": rng.normal(size=n), "W": rng.normal(size=m), "idx": rng.integers(0, n, m).astype(np.int64),
            "S": _z(1)}


# ----------------------------------------------------------------------------------------------------------
# a loop bound read from data: `n = cnt[i]` (an interstate assignment) bounds the inner loop, so the tape
# inside it cannot be sized before the run (a growable stack), and the reversed inner loop needs n restored


@dace.program
def lp_bound_from_data(X: f64[M, N], cnt: dace.int64[M], S: f64[1]):
    for i in range(M):
        n = cnt[i]
        for j in range(n):
            S[0] = S[0] * 0.5 + np.sin(X[i, j]) * S[0] + X[i, j]


def _t_bound_from_data(X, cnt, S, **_):
    s = S[0]
    for i in range(X.shape[0]):
        for j in range(int(cnt[i].item())):
            s = s * 0.5 + torch.sin(X[i, j]) * s + X[i, j]
    return s


def _i_bound_from_data(rng):
    m, n = 4, 6
    return {"X": rng.normal(size=(m, n)) * 0.5, "cnt": rng.integers(0, n + 1, m).astype(np.int64),
            "S": rng.normal(size=1)}


CASES: list[Case] = [
    Case("lp_api_loop_branch", BuiltProgram(lp_api_loop_branch, ("X", "Y", "S")), _t_api_loop_branch, ("X", "S"),
         "S", _i_api_loop_branch, {"N": 8},
         "API-built: a loop of guard and back edge around an if/else diamond of conditional interstate edges"),
    Case("lp_api_while_accumulate", BuiltProgram(lp_api_while_accumulate, ("X", "W", "A", "T", "S")),
         _t_api_while_accumulate, ("X", "W", "A", "T"), "S", _i_api_while_accumulate, {"N": 5},
         "API-built: a data-dependent while loop (guard and back edge) accumulating into an array, no bound"),
    Case("lp_api_do_while", BuiltProgram(lp_api_do_while, ("X", "S")), _t_api_do_while, ("X", "S"), "S",
         _i_api_do_while, {"N": 4}, "API-built: a do-while loop (a self-loop whose back edge tests data), no bound"),
    Case("lp_api_edge_symbols", BuiltProgram(lp_api_edge_symbols, ("A", "B", "W", "S")),
         _t_api_edge_symbols, ("A", "B", "W"), "S", _inputs(A=(6,), B=(6,), W=(6,)), {"N": 6},
         "API-built: a symbol assigned twice per iteration on interstate edges, read by maps and an in-place update"),
    Case("lp_bound_from_data", lp_bound_from_data, _t_bound_from_data, ("X", "S"), "S", _i_bound_from_data,
         {"M": 4, "N": 6}, "n = cnt[i] bounds an inner loop: a growable tape without a while loop"),
    Case("lp_symbol_from_data", lp_symbol_from_data, _t_symbol_from_data, ("X", "W"), "S", _i_symbol_from_data,
         {"N": 5, "M": 9}, "k = idx[i] (a symbol read from data) selects the element updated in place"),
]
