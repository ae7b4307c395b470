"""A loop's first iteration keeps no copy of what it overwrites of a temporary that nothing wrote before
(`Reversal.first_run_guard`): the tape push before the overwrite, and the restore after its reverse, run only
where the loop variable is past its start. Each program is checked against `torch.autograd` in float64 with
the trip count an argument (1, where the loop keeps nothing, to 3), and in its structure: where the proof
holds the push of more than one element is guarded, and where it fails (a temporary set before the loop, a
loop inside a loop, an element the body wrote earlier in the iteration) it is not, and the gradient is still
torch's. One build per program and route; hypothesis varies the data and the trip count.
"""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from dace.sdfg.state import ConditionalBlock
from hypothesis import given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.api import grad_graph
from gradflow.verify.routes import gradient

N, T = dace.symbol("N"), dace.symbol("T")
RTOL = 1e-10


@dace.program
def stages(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    k = np.ndarray([N], dtype=np.float64)
    m = np.ndarray([N], dtype=np.float64)
    for _ in range(T):
        k[:] = np.sin(y) * x
        m[0] = x[0]
        m[1:] = k[:-1] * y[1:]
        y[:] = y + 0.5 * k * m
    S[0] = np.sum(y * y)


def t_stages(x, y, t):
    for _ in range(t):
        k = torch.sin(y) * x
        m = torch.cat([x[:1], k[:-1] * y[1:]])
        y = y + 0.5 * k * m
    return (y * y).sum()


@dace.program
def initialized(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    t = np.zeros([N], dtype=np.float64)
    for _ in range(T):
        y[:] = y + t * x  # the first iteration reads the zeros
        t[:] = np.sin(y)
    S[0] = np.sum(y * y)


def t_initialized(x, y, trips):
    t = torch.zeros_like(x)
    for _ in range(trips):
        y = y + t * x
        t = torch.sin(y)
    return (y * y).sum()


@dace.program
def nested(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    t = np.ndarray([N], dtype=np.float64)
    for j in range(2):
        for i in range(T):
            if i + j > 0:  # from the second outer iteration on, the inner loop's first reads the last t
                y[:] = y + t * x
            t[:] = np.sin(y)
    S[0] = np.sum(y * y)


def t_nested(x, y, trips):
    t = None
    for j in range(2):
        for i in range(trips):
            if i + j > 0:
                y = y + t * x
            t = torch.sin(y)
    return (y * y).sum()


@dace.program
def rewritten(x: dace.float64[N], y: dace.float64[N], S: dace.float64[1]):
    t = np.ndarray([N], dtype=np.float64)
    for _ in range(T):
        t[:] = x * y
        y[:] = y + np.sin(t)
        t[:] = np.cos(t) * y  # overwrites what this iteration wrote: its old value is read
        y[:] = y * t
    S[0] = np.sum(y)


def t_rewritten(x, y, trips):
    for _ in range(trips):
        t = x * y
        y = y + torch.sin(t)
        t = torch.cos(t) * y
        y = y * t
    return y.sum()


CASES = {"stages": (stages, t_stages), "initialized": (initialized, t_initialized), "nested": (nested, t_nested),
         "rewritten": (rewritten, t_rewritten)}
#: the guarded program on both routes, both policies, optimized and not; where the guard is refused, one route
CHECKS = ([("stages", "grad", gradflow.STORE_ALL, True), ("stages", "grad", gradflow.STORE_ALL, False),
           ("stages", "vjp", gradflow.STORE_ALL, True), ("stages", "vjp", gradflow.RECOMPUTE_ALL, False)]
          + [(name, "grad", gradflow.STORE_ALL, True) for name in ("initialized", "nested", "rewritten")])


@pytest.mark.parametrize("name, route, policy, optimize", CHECKS,
                         ids=[f"{n}-{r}-{p.name}{'-optimized' if o else ''}" for n, r, p, o in CHECKS])
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), trips=st.integers(1, 3))
def test_the_gradient_is_torchs_for_any_trip_count(name, route, policy, optimize, seed, trips) -> None:
    program, reference = CASES[name]
    rng = np.random.default_rng(seed)
    n = 6
    arrays = {"x": rng.uniform(-1.0, 1.0, n), "y": rng.uniform(-1.0, 1.0, n), "S": np.zeros(1)}
    after, grads = gradient(program, ("x", "y"), "S", {k: v.copy() for k, v in arrays.items()},
                            {"N": n, "T": trips}, route=route, forwarding=policy, optimize=optimize)
    x, y = (torch.tensor(arrays[k], dtype=torch.float64, requires_grad=True) for k in ("x", "y"))
    value = reference(x, y, trips)
    expected = torch.autograd.grad(value, [x, y])
    np.testing.assert_allclose(after["S"][0], value.item(), rtol=RTOL)
    for name_, g in zip(("x", "y"), expected):
        np.testing.assert_allclose(grads[name_], g.numpy(), rtol=RTOL, atol=1e-13, err_msg=f"d S / d {name_}")


def _pushes(program) -> dict[str, list[bool]]:
    """Per forward array the tape saves: for each of its stacks, whether its push is guarded."""
    graph = grad_graph(program, ["x", "y"], "S", "grad_", None, gradflow.STORE_ALL, False)
    sdfg = graph.to_sdfg()
    labels = {node.label for node, _ in sdfg.all_nodes_recursive() if isinstance(node, ConditionalBlock)}
    found: dict[str, list[bool]] = {}
    for stack, array in graph.meta["ad"].stores.items():
        found.setdefault(array, []).append(f"guard_{stack}" in labels)
    return found


def test_temporaries_written_first_in_the_loop_are_saved_from_the_second_iteration_on() -> None:
    pushes = _pushes(stages)
    # m[0], then m[1:]: elements apart, so m[1:] is guarded; a single element never is (the branch in
    # every iteration would cost what the one copy saves)
    assert pushes["k"] == [True] and sorted(pushes["m"]) == [False, True]
    assert pushes["y"] == [False]  # an argument: its value before the loop is the caller's


def test_where_the_value_before_the_first_overwrite_may_be_read_every_push_stays() -> None:
    assert _pushes(initialized)["t"] == [False]  # the zeros written before the loop
    assert _pushes(nested)["t"] == [False]  # the inner loop starts again with the last t
    # the first write of an iteration is saved from the second on; the second write, which overwrites what
    # the first wrote in the same iteration, always
    assert sorted(_pushes(rewritten)["t"]) == [False, True]
