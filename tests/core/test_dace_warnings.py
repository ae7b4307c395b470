"""Differentiating prints no DaCe warning: the uninitialized-transient warning of a tape push (whose first
slot is never read, see `gradflow/core/dace_warnings.py`) is filtered, and only for those states; the
reverse of a minimum builds its tasklets with ordered connectors."""

from __future__ import annotations

import warnings

import dace
import numpy as np

import gradflow
from gradflow.core.dace_warnings import ignore_tape_pushes

N = dace.symbol("N")


@dace.program
def running_update(x: dace.float64[N], S: dace.float64[1]):
    m = np.zeros([1], dtype=np.float64)
    for i in range(N):
        m[0] += 0.5 * (x[i] - m[0]) * x[i]
    S[0] = m[0]


def _validation_warnings(sdfg: dace.SDFG, filtered: bool) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if filtered:
            ignore_tape_pushes()
        sdfg.validate()
    return [str(w.message) for w in caught if "uninitialized transient" in str(w.message)]


def test_tape_pushes_warn_in_dace_and_are_filtered_by_gradflow():
    sdfg = gradflow.grad(running_update.to_sdfg(), wrt=["x"], of="S", optimize=False)
    unfiltered = _validation_warnings(sdfg, filtered=False)
    assert unfiltered and all("push_" in m and "gradflow_tape_" in m for m in unfiltered)
    assert _validation_warnings(sdfg, filtered=True) == []


def test_other_uninitialized_reads_still_warn():
    sdfg = dace.SDFG("reads_garbage")
    sdfg.add_array("t", [3], dace.float64, transient=True)
    sdfg.add_array("out", [3], dace.float64)
    state = sdfg.add_state("compute")
    state.add_nedge(state.add_read("t"), state.add_write("out"), dace.Memlet("t[0:3]"))
    assert _validation_warnings(sdfg, filtered=True)


@dace.program
def nearest(points: dace.float64[N, 3], centroids: dace.float64[4, 3], S: dace.float64[1]):
    distances = np.sum(points * points, axis=1)[:, None] - 2.0 * (points @ np.transpose(centroids))
    S[0] = np.sum(np.min(distances, axis=1))


def test_the_reverse_of_a_minimum_warns_of_nothing():
    """The reverse rule of a max/min reduction built its tie-counting tasklets with sets of connectors,
    which DaCe warns of ("Using sets for connectors is discouraged") at every differentiation."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gradflow.grad(nearest.to_sdfg(), wrt=["centroids"], of="S", optimize=False)
    assert not [str(w.message) for w in caught if "connectors" in str(w.message)]
