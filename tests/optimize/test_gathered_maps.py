"""`gather_element_maps` and its proof (`analysis.effects`): map states of a straight run move together
past what they commute with, so that `tile_element_chains` tiles one longer chain.

The program is GradBench's ode as its gradflow tool writes it (`benchmarks/gradbench/programs/ode.py`: a
fourth-order Runge-Kutta step, a helper for the rate, four stages through it, a trip count as an argument);
its gradient interleaves the maps with tape pops under `if _ != 0`, stack-pointer decrements and
single-element adjoints. Gradients must equal torch's and
those of OPTIMIZE without the pass at sizes around the block edges, with one OpenMP thread (tiled) and two.
The analysis is checked on hand-made pairs of states that touch the same array apart, overlapping, through
symbols, and opaquely."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from benchmarks.gradbench.programs.ode import ode as rk4  # GradBench's ode, as its tool differentiates it
from gradflow.analysis.effects import assignment_effects, commute, effects
from gradflow.api import grad_graph
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE
from gradflow.optimize.gathered_maps import GatherElementMaps, plans
from gradflow.optimize.tiled_chains import _chains, _runs
from tests.optimize.test_tiled_chains import _set_threads

N = dace.symbol("N")
UPTO = Pipeline(OPTIMIZE.steps[:[s.name for s in OPTIMIZE.steps].index("gather_element_maps")])
WITHOUT = OPTIMIZE.without("gather_element_maps")


def rk4_torch(x: torch.Tensor, s: int) -> torch.Tensor:
    def rate(y):
        return torch.cat([x[:1], x[1:] * y[:-1]])

    h, y = 2.0 / s, torch.zeros_like(x)
    for _ in range(s):
        k1 = rate(y)
        k2 = rate(y + h / 2 * k1)
        k3 = rate(y + h / 2 * k2)
        k4 = rate(y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y[-1]


def _maps(state: dace.SDFGState) -> int:
    return sum(isinstance(n, dace.nodes.MapEntry) and state.entry_node(n) is None for n in state.nodes())


def _tiled_maps(g: Graph) -> list[int]:
    """Per chain `tile_element_chains` would tile: its number of tiled maps."""
    return sorted(sum(p.tiled for p in chain.pieces) for region, states, pieces in _runs(g.sdfg)
                  for chain in _chains(region, states, pieces, 512))


def test_the_loops_maps_gather_into_one_chain_each() -> None:
    before = grad_graph(rk4, "x", "last", None, optimize=UPTO)
    after = GatherElementMaps()(before).unwrap()
    after.sdfg.validate()
    found = plans(before.sdfg)
    assert len(found) == 2 and not plans(after.sdfg)  # the forward's loop body and the backward's, once
    # each loop body's chain now holds every map state of the body (the stages and the push of y forward;
    # the pop of y and the adjoints of the stages and the update backward); before, the pushes, pops and
    # single-element adjoints between them split the chains
    maps = sorted(sum(_maps(item.block) for item in order if item.big) for _, order in found)
    assert _tiled_maps(after) == maps and min(maps) >= 5
    assert all(k < m for k, m in zip(sorted(_tiled_maps(before))[-2:], maps))


@pytest.fixture
def threads():
    yield _set_threads
    _set_threads(1)


def test_gradients_equal_torchs_and_those_without_the_pass(threads) -> None:
    with_pass = gradflow.value_and_grad(rk4, wrt="x", of="last")
    without = gradflow.value_and_grad(rk4, wrt="x", of="last", optimize=WITHOUT)
    rng = np.random.default_rng(11)
    for count in (1, 2):
        threads(count)
        for n, s in ((2, 1), (17, 3), (1023, 2), (1025, 1), (3000, 4), (600, 0)):
            x = rng.uniform(-1.0, 1.0, n)
            value, grad = with_pass(x=x.copy(), S=s)
            value_without, grad_without = without(x=x.copy(), S=s)
            xt = torch.tensor(x, requires_grad=True)
            loss = rk4_torch(xt, s) if s else xt[-1] * 0.0
            want = torch.autograd.grad(loss, xt)[0].numpy()
            np.testing.assert_allclose(value, value_without, rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(grad, grad_without, rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(value, loss.item(), rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-14)


def _state(sdfg: dace.SDFG, label: str, reads: dict, writes: dict, wcr: bool = False, side_effects=False):
    """A state of one mapped tasklet over `i` in 0:N (or one tasklet where no memlet names `i`)."""
    state = sdfg.add_state(label)
    code = "__out = " + (" + ".join(reads) or "1.0")
    inputs = {k: dace.Memlet(v) for k, v in reads.items()}
    outputs = {"__out": dace.Memlet(writes["__out"], wcr="lambda x, y: x + y" if wcr else None)}
    if any("i" in m for m in (*reads.values(), *writes.values())):
        state.add_mapped_tasklet(label, {"i": "0:N"}, inputs, code, outputs, external_edges=True)
    else:
        tasklet = state.add_tasklet(label, set(inputs), {"__out"}, code, side_effects=side_effects)
        for k, m in inputs.items():
            state.add_edge(state.add_read(m.data), None, tasklet, k, m)
        state.add_edge(tasklet, "__out", state.add_write(outputs["__out"].data), None, outputs["__out"])
    return state


def _effects_of(**states):
    sdfg = dace.SDFG("pairs")
    sdfg.add_symbol("N", dace.int64)
    sdfg.add_symbol("k", dace.int64)
    for name in "abc":
        sdfg.add_array(name, [N + 2], dace.float64)
    return {label: effects(_state(sdfg, label, *spec)) for label, spec in states.items()}


def test_blocks_commute_exactly_when_they_touch_apart_elements_or_only_read() -> None:
    e = _effects_of(
        shifted=({"x": "b[i]"}, {"__out": "a[i + 1]"}),           # writes a[1], ..., a[N]
        first=({"x": "c[0]"}, {"__out": "a[0]"}),                   # writes a[0]
        reader=({"x": "a[i + 1]"}, {"__out": "c[i + 1]"}),          # reads a[1..N], writes c[1..N]
        last=({"x": "a[N]"}, {"__out": "b[N + 1]"}),                # reads a[N]: written by shifted
        after=({"x": "a[N + 1]"}, {"__out": "b[N + 1]"}),           # reads a[N + 1]: written by none
        at_k=({"x": "b[0]"}, {"__out": "a[k]"}),                    # writes a[k]: k unknown
        summed=({"x": "b[0]"}, {"__out": "a[0]"}, True),            # a sum into a[0]
        summed_too=({"x": "c[1]"}, {"__out": "a[0]"}, True),
        loud=({"x": "b[0]"}, {"__out": "c[0]"}, False, True),       # a tasklet with side effects
    )
    assert commute(e["shifted"], e["first"]) and commute(e["first"], e["shifted"])  # a[1:] and a[0] apart
    assert commute(e["first"], e["reader"])          # c[0] read, c[1..N] written; a[0] written, a[1..N] read
    assert not commute(e["shifted"], e["reader"])    # reader reads what shifted writes
    assert not commute(e["last"], e["shifted"]) and commute(e["after"], e["shifted"])
    assert not commute(e["at_k"], e["shifted"]) and not commute(e["at_k"], e["first"])  # a[k] may be any
    step = assignment_effects(dace.SDFG("edge"), dace.InterstateEdge(assignments={"k": "k + 1"}))
    assert not commute(step, e["at_k"]) and not commute(e["at_k"], step)  # it moves a[k]
    assert commute(step, e["shifted"])
    assert not commute(e["summed"], e["summed_too"])  # two sums into a[0]: the rounding's order is kept
    assert not commute(e["loud"], e["reader"]) and not commute(e["reader"], e["loud"])
    assert e["loud"] is None
