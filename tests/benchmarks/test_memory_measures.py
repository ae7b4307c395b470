"""The memory benchmark's measurements (`benchmarks/memorybench/allocation.py`), not its timings: the
transients counted from a compiled SDFG's descriptors, and the peak RSS of one call."""

from __future__ import annotations

import functools

import dace
import numpy as np
import pytest

import gradflow
from benchmarks.memorybench import allocation
from gradflow.autodiff.passes import forwarded_bytes
from gradflow.core.graph import Graph
from gradflow.runtime.calling import Runner
from gradflow.verify import programs

N = dace.symbol("N")


@dace.program
def doubled_sum(X: dace.float64[N], S: dace.float64[1]):
    tmp = np.empty_like(X)
    for i in range(N):
        tmp[i] = X[i] * 2.0
    S[0] = np.sum(tmp)


@functools.cache
def _runner() -> Runner:
    return Runner(Graph.of(doubled_sum))


@pytest.mark.parametrize("name", ["lp_softmax", "lp_recurrence"])
def test_what_is_forwarded_is_counted_as_allocated(name: str) -> None:
    sizes = dict(programs.case_named(name).symbols)
    graph = programs.differentiated(name, gradflow.STORE_ALL)
    counted = allocation.allocated_bytes(graph.sdfg, sizes)
    assert not counted.unresolved
    assert counted.by_category["tape"] > 0
    assert counted.total >= forwarded_bytes(graph, sizes)


def test_a_nested_sdfgs_tape_is_counted() -> None:
    """lp_map_of_loops forwards nothing (its map body's vjp reruns the body in the backward sweep), yet the
    body's own tape is allocated there."""
    sizes = dict(programs.case_named("lp_map_of_loops").symbols)
    graph = programs.differentiated("lp_map_of_loops", gradflow.STORE_ALL)
    counted = allocation.allocated_bytes(graph.sdfg, sizes)
    assert forwarded_bytes(graph, sizes) == 0
    assert counted.by_category["tape"] >= 8 * (sizes["M"] - 1)
    assert not counted.unresolved


def test_peak_rss_sees_a_transient_the_call_fills() -> None:
    # The peak RSS column of benchmarks/memory.py needs /proc/self/clear_refs (Linux, the project's platform).
    assert allocation.rss_supported() is None
    n = 8 << 20  # 64 MiB of float64: a fresh mapping whatever malloc's threshold
    runner = _runner()
    counted = allocation.allocated_bytes(runner.kernel.compiled.sdfg, {"N": n})
    assert counted.total >= 8 * n
    x, s = np.ones(n), np.zeros(1)
    values = {"X": x.ctypes.data, "S": s.ctypes.data, "N": n}
    args = [values[a.name] for a in runner.plan.args]
    measured = allocation.peak_rss(runner.kernel, {"N": n}, args)
    assert s[0] == 2.0 * n
    assert measured["total"] >= 0.9 * counted.total
    assert measured["total"] <= counted.total + (16 << 20)
