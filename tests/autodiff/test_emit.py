"""The outer memlets `emit.mapped_tasklet` computes for the maps reverse rules emit equal DaCe's own
propagation (it takes a shortcut for indices that are a map parameter plus an offset)."""

from __future__ import annotations

import dace
import pytest
from dace.sdfg.propagation import propagate_subset
from hypothesis import given, settings
from hypothesis import strategies as st

from gradflow.autodiff.emit import _shifted_image, mapped_tasklet

N = dace.symbol("N")


def _sdfg() -> dace.SDFG:
    sdfg = dace.SDFG("emit_check")
    sdfg.add_array("A", (N + 8, N + 8), dace.float64)
    sdfg.add_array("B", (N + 8, N + 8), dace.float64)
    return sdfg


offsets = st.tuples(st.integers(-2, 2), st.integers(-2, 2))


@settings(max_examples=40, deadline=None)
@given(reads=st.lists(offsets, min_size=1, max_size=4), low=st.integers(0, 3), extra=st.integers(0, 3))
def test_shifted_indices_propagate_as_dace_does(reads, low, extra) -> None:
    sdfg = _sdfg()
    ranges = {"i": f"{low + 2}:N + {low + 2 + extra}", "j": "2:N + 2"}
    memlets = [dace.Memlet(f"A[i + {a}, j + {b}]") for a, b in reads]
    params = list(ranges)
    rng = dace.subsets.Range.from_string(", ".join(ranges.values()))
    ours = _shifted_image(memlets, params, rng, use_dst=False)
    theirs = propagate_subset(memlets, sdfg.arrays["A"], params, rng)
    assert ours is not None
    assert ours.subset == theirs.subset, f"{ours.subset} vs {theirs.subset}"
    assert dace.symbolic.simplify(ours.volume - theirs.volume) == 0


@pytest.mark.parametrize("index", ["i * 2, j", "j, i + N * 0 + j", "i:i + 2, j"])
def test_other_indices_are_left_to_dace(index: str) -> None:
    rng = dace.subsets.Range.from_string("0:N, 0:N")
    assert _shifted_image([dace.Memlet(f"A[{index}]")], ["i", "j"], rng, use_dst=False) is None


def test_a_mapped_tasklet_gets_the_bounding_box_of_its_reads_and_its_write() -> None:
    sdfg = _sdfg()
    state = sdfg.add_state()
    _, entry, exit_ = mapped_tasklet(
        state, "stencil", {"i": "1:N + 1", "j": "0:N"},
        {"a": dace.Memlet("A[i - 1, j]"), "b": dace.Memlet("A[i + 1, j + 3]")}, "o = a + b",
        {"o": dace.Memlet("B[i, j]", wcr="lambda x, y: x + y")})
    (into,) = state.in_edges(entry)
    (out,) = state.out_edges(exit_)
    assert str(into.data.subset) == "0:N + 2, 0:N + 3"
    assert str(out.data.subset) == "1:N + 1, 0:N" and out.data.wcr is not None
    sdfg.validate()
