"""`register_scalar_sums`: a sequential map's sum into one element goes through a local variable, added
to the element once; a map that reads the element, or runs in parallel, is left alone. Values stay."""

from __future__ import annotations

import dace
import numpy as np
from dace import Memlet

from gradflow.core.graph import Graph
from gradflow.optimize.scalar_sums import RegisterScalarSums, _candidates
from gradflow.runtime.compile import compile_sdfg

N = 37


def _dot_and_scale(schedule: dace.ScheduleType, reads_sum: bool = False) -> dace.SDFG:
    """s[0] += a[i] * y[i] and o[i] = 2 a[i] (+ s[0] when `reads_sum`) in one map (arrays named like the
    connectors a hand-written accumulator would use)."""
    sdfg = dace.SDFG(f"dot_and_scale_{schedule.name}_{int(reads_sum)}")
    for name, shape in (("a", [N]), ("y", [N]), ("o", [N]), ("s", [1])):
        sdfg.add_array(name, shape, dace.float64)
    state = sdfg.add_state("main")
    inputs = {"__x": Memlet("a[i]"), "__y": Memlet("y[i]")}
    code = "__s = __x * __y\n__z = 2 * __x"
    if reads_sum:
        inputs["__r"] = Memlet("s[0]")
        code += " + __r"
    state.add_mapped_tasklet("dot", {"i": f"0:{N}"}, inputs, code,
                             {"__s": Memlet("s[0]", wcr="lambda a, b: a + b"), "__z": Memlet("o[i]")},
                             schedule=schedule, external_edges=True)
    return sdfg


def test_a_sequential_sum_goes_through_a_local() -> None:
    graph = Graph.of(_dot_and_scale(dace.ScheduleType.Sequential))
    assert len(_candidates(graph.sdfg)) == 1
    out = RegisterScalarSums()(graph).unwrap()
    assert not _candidates(out.sdfg)
    [acc] = [d for d in out.sdfg.arrays.values() if d.storage == dace.StorageType.Register]
    assert tuple(acc.shape) == (1,)
    rng = np.random.default_rng(13)
    x, y = rng.standard_normal(N), rng.standard_normal(N)
    s, z = np.array([0.5]), np.zeros(N)
    compile_sdfg(out)(a=x, y=y, o=z, s=s)
    np.testing.assert_allclose(s[0], 0.5 + x @ y, rtol=1e-14)
    np.testing.assert_allclose(z, 2 * x, rtol=1e-15)


def test_parallel_maps_and_maps_reading_the_sum_are_left_alone() -> None:
    for sdfg in (_dot_and_scale(dace.ScheduleType.Default), _dot_and_scale(dace.ScheduleType.Sequential, True)):
        graph = Graph.of(sdfg)
        assert not _candidates(graph.sdfg)
        assert RegisterScalarSums()(graph).unwrap() is graph


def test_a_sum_written_on_some_paths_only() -> None:
    """A dynamic write (the tasklet adds only where `x > 0`) still adds nothing elsewhere, and the element
    gets the total once."""
    sdfg = dace.SDFG("positive_squares")
    sdfg.add_array("x", [N], dace.float64)
    sdfg.add_array("s", [1], dace.float64)
    state = sdfg.add_state("main")
    state.add_mapped_tasklet("squares", {"i": f"0:{N}"}, {"__x": Memlet("x[i]")}, "if __x > 0:\n    __s = __x * __x",
                             {"__s": Memlet("s[0]", wcr="lambda a, b: a + b", dynamic=True)},
                             schedule=dace.ScheduleType.Sequential, external_edges=True)
    out = RegisterScalarSums()(Graph.of(sdfg)).unwrap()
    assert not _candidates(out.sdfg) and len(out.sdfg.arrays) == 3
    x = np.random.default_rng(14).standard_normal(N)
    s = np.array([1.5])
    compile_sdfg(out)(x=x, s=s)
    np.testing.assert_allclose(s[0], 1.5 + np.sum(np.where(x > 0, x * x, 0.0)), rtol=1e-14)
