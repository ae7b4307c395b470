"""`overwritten_before_read`: True only when every run writes every element before anything reads it."""

from __future__ import annotations

import dace
import numpy as np
import pytest

from gradflow.analysis.writes import (
    exposed_read,
    may_read_before_write,
    overwritten_before_read,
    overwritten_before_read_in,
    written,
)

N = dace.symbol("N")
f64 = dace.float64


@dace.program
def overwrite_then_loop(X: f64[N], Y: f64[N], S: f64[1]):
    Y[:] = X * 2.0
    for i in range(N):
        S[0] = S[0] + Y[i]


@dace.program
def partial(X: f64[N], Y: f64[N]):
    Y[0:2] = X[0:2]


@dace.program
def in_a_loop(X: f64[N], Y: f64[N]):
    for i in range(N):
        Y[i] = X[i]


@dace.program
def in_a_branch(X: f64[N], Y: f64[N]):
    if X[0] > 0:
        Y[:] = X
    else:
        Y[:] = -X


@dace.program
def in_one_branch(X: f64[N], Y: f64[N]):
    if X[0] > 0:
        Y[:] = X


@dace.program
def branch_on_itself(X: f64[N], Y: f64[N]):
    if Y[0] > 0:
        Y[:] = X
    else:
        Y[:] = -X


@dace.program
def reset_then_accumulate(X: f64[N], S: f64[1]):
    S[0] = 0.0
    for i in range(N):
        S[0] += X[i]


@dace.program
def written_then_read_in_one_state(X: f64[N], S: f64[1]):
    S[0] = np.sum(X)
    S[0] += 1.0


@dace.program
def read_then_written_in_one_state(X: f64[N], S: f64[1]):
    S[0] = S[0] * 2.0 + np.sum(X)


@dace.program
def two_of_four_columns(X: f64[N], Y: f64[N, 4]):
    for i in dace.map[0:N]:  # the memlet out of the map names all of Y (a bounding box)
        Y[i, 0] = X[i]
        Y[i, 2] = X[i]


@dace.program
def four_of_four_columns(X: f64[N], Y: f64[N, 4]):
    for i in dace.map[0:N]:
        Y[i, 0] = X[i]
        Y[i, 1] = X[i]
        Y[i, 3] = X[i]
        Y[i, 2] = X[i]


@dace.program
def the_diagonal(X: f64[N], Y: f64[N, N]):
    for i in dace.map[0:N]:
        Y[i, i] = X[i]


@dace.program
def every_element_of_a_map(X: f64[N], Y: f64[N, 4]):
    for i, j in dace.map[0:N, 0:4]:
        Y[i, j] = X[i]


@pytest.mark.parametrize("program, name, expected", [
    (two_of_four_columns, "Y", False),   # half of each row, whatever the map's memlet says
    (four_of_four_columns, "Y", True),   # four writes, one per column: joined, they cover Y
    (the_diagonal, "Y", False),          # one parameter in two dimensions
    (every_element_of_a_map, "Y", True),
    (overwrite_then_loop, "Y", True),   # written whole in the first state, read in the loop after
    (overwrite_then_loop, "X", False),  # only read
    (overwrite_then_loop, "S", False),  # read and written in the loop
    (partial, "Y", False),              # two elements of N
    (in_a_loop, "Y", False),            # every element, but inside a loop: not followed
    (in_a_branch, "Y", True),           # an if with an else, both branches writing it all
    (in_one_branch, "Y", False),        # no else: a run may skip the write
    (branch_on_itself, "Y", False),     # the condition reads it first
    (reset_then_accumulate, "S", True),  # overwritten first, accumulated into afterwards
    # one state writes it whole, then reads it through the same node (DaCe orders the read after the write)
    (written_then_read_in_one_state, "S", True),
    (read_then_written_in_one_state, "S", False),  # its first node is read before anything writes it
])
def test_overwritten_before_read(program, name, expected):
    assert overwritten_before_read(program.to_sdfg(simplify=True), name) is expected


def test_accumulating_and_nested_writes_are_not_overwrites():
    sdfg = dace.SDFG("acc")
    sdfg.add_array("X", [N], f64)
    sdfg.add_array("S", [1], f64)
    sdfg.add_state().add_mapped_tasklet("s", {"i": "0:N"}, {"x": dace.Memlet("X[i]")}, "s = x",
                                       {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)
    assert not overwritten_before_read(sdfg, "S") and written(sdfg) == {"S"}

    inner = dace.SDFG("inner")
    inner.add_array("o", [N], f64)
    inner.add_state().add_mapped_tasklet("w", {"i": "0:1"}, {}, "y = 1.0", {"y": dace.Memlet("o[0]")},
                                         external_edges=True)  # writes one element of N
    outer = dace.SDFG("outer")
    outer.add_array("Y", [N], f64)
    state = outer.add_state()
    nested = state.add_nested_sdfg(inner, {}, {"o"})
    state.add_edge(nested, "o", state.add_access("Y"), None, dace.Memlet("Y[0:N]"))
    assert not overwritten_before_read(outer, "Y") and written(outer) == {"Y"}


@dace.program
def unused(X: f64[N], Y: f64[N], S: f64[1]):
    S[0] = np.sum(X)


def test_an_untouched_array_is_never_read_but_not_overwritten():
    sdfg = unused.to_sdfg(simplify=True)
    assert not may_read_before_write(sdfg, "Y") and not overwritten_before_read(sdfg, "Y")
    assert not may_read_before_write(sdfg, "S") and overwritten_before_read(sdfg, "S")
    assert may_read_before_write(sdfg, "X")


def _library_write(beta: float, in_a_map: bool) -> dace.SDFG:
    """y = A x (+ beta y), a `Gemv` whose output edge is all the state shows of y: with beta != 0 it adds
    into y without an edge that reads it. `in_a_map`: the call inside a one-iteration map."""
    from dace.libraries.blas import Gemv

    sdfg = dace.SDFG(f"gemv_beta_{int(beta)}_{'map' if in_a_map else 'top'}")
    sdfg.add_array("A", [N, N], f64)
    sdfg.add_array("x", [N], f64)
    sdfg.add_array("y", [N], f64)
    state = sdfg.add_state()
    node = Gemv("gemv", alpha=1.0, beta=beta)
    a, x, y = state.add_read("A"), state.add_read("x"), state.add_write("y")
    if not in_a_map:
        state.add_edge(a, None, node, "_A", dace.Memlet("A[0:N, 0:N]"))
        state.add_edge(x, None, node, "_x", dace.Memlet("x[0:N]"))
        state.add_edge(node, "_y", y, None, dace.Memlet("y[0:N]"))
        return sdfg
    entry, exit_ = state.add_map("once", {"k": "0:1"})
    state.add_memlet_path(a, entry, node, dst_conn="_A", memlet=dace.Memlet("A[0:N, 0:N]"))
    state.add_memlet_path(x, entry, node, dst_conn="_x", memlet=dace.Memlet("x[0:N]"))
    state.add_memlet_path(node, exit_, y, src_conn="_y", memlet=dace.Memlet("y[0:N]"))
    return sdfg


@pytest.mark.parametrize("in_a_map", [False, True])
def test_a_library_call_that_adds_into_its_output_does_not_overwrite_it(in_a_map):
    # Found by `share_dead_buffers`: a gradient Gemv (beta = 1) into a buffer was taken for an overwrite,
    # and the buffer was shared with a dead array whose values the sum then added to.
    assert overwritten_before_read(_library_write(0.0, in_a_map), "y")
    assert not overwritten_before_read(_library_write(1.0, in_a_map), "y")
    assert may_read_before_write(_library_write(1.0, in_a_map), "y")


def test_a_beta_is_compared_as_a_number():
    # SymPy's Float(0.0) == 0 is False: a zero beta once read as "adds into its output" in some places
    import sympy

    from gradflow.analysis.ops import constant_beta

    assert overwritten_before_read(_library_write(sympy.Float(0.0), False), "y")
    assert [constant_beta(type("Node", (), {"beta": b})()) for b in (0, sympy.Float(0.0), 1, sympy.Symbol("b"))] == [
        0.0, 0.0, 1.0, None]


@dace.program
def temporary_in_a_branch_and_loop(X: f64[N], Y: f64[N], T: f64[1]):
    """`T` is written before every read, but only on the path that takes the branch and enters the loop."""
    if X[0] > 1.0:
        for i in range(N):
            T[0] = X[N - 1]
            Y[i] *= T[0]


@dace.program
def accumulator_in_a_branch(X: f64[N], T: f64[1]):
    if X[0] > 1.0:
        T[0] = T[0] + X[1]


@dace.program
def carried_across_iterations(X: f64[N], T: f64[1]):
    for i in range(N):
        X[i] = T[0]
        T[0] = X[i] + 1.0


@dace.program
def set_in_a_branch_read_after(X: f64[N], Y: f64[N], T: f64[1]):
    if X[0] > 1.0:
        T[0] = X[1]
    Y[0] = T[0]


@pytest.mark.parametrize("program, name, expected", [
    (temporary_in_a_branch_and_loop, "T", False),  # written before read wherever it is read
    (temporary_in_a_branch_and_loop, "Y", True),   # Y[i] *= ... reads the caller's Y
    (accumulator_in_a_branch, "T", True),          # reads its own value under the branch
    (carried_across_iterations, "T", True),        # an iteration reads what the previous one wrote
    (set_in_a_branch_read_after, "T", True),       # the skipping path reaches the read unwritten
    (overwrite_then_loop, "Y", False),             # overwritten whole first
    (in_a_branch, "Y", False),                     # only written
    (read_then_written_in_one_state, "S", True),
])
def test_exposed_read(program, name, expected):
    """`exposed_read`: may a run read a value of the array from before the region (checkpointed steps
    snapshot only the arrays that expose a read)?"""
    assert exposed_read(program.to_sdfg(simplify=True), name) is expected


@dace.program
def shifted_interior(X: f64[N], Y: f64[N]):
    Y[1:N - 1] = X[:N - 2] * 2.0  # DaCe's map runs over 0:N-2 and writes Y[__i0 + 1]


@dace.program
def reversed_interior(X: f64[N], Y: f64[N]):
    for i in dace.map[0:N - 2]:
        Y[N - 2 - i] = X[i]


@pytest.mark.parametrize("program", [shifted_interior, reversed_interior])
def test_a_map_writing_a_shifted_range_overwrites_that_range(program):
    sdfg = program.to_sdfg(simplify=True)
    interior = dace.subsets.Range.from_string("1:N - 1")
    assert overwritten_before_read_in(sdfg, "Y", interior)
    assert not overwritten_before_read_in(sdfg, "Y", dace.subsets.Range.from_string("0:N - 1"))
    assert not overwritten_before_read(sdfg, "Y")


def _tiled_copy(inner_end: str, index: str) -> dace.SDFG:
    """Y[index] = X[index] over a tile map `t` in 0:N:4 and, inside, `p` over `t .. inner_end`: the form
    StripMining leaves (`nest_reductions` tiles a symbolic extent so, the last tile cut short). The outer
    memlet is the whole array, as `nest_reductions` keeps it."""
    sdfg = dace.SDFG(f"tiled_{abs(hash((inner_end, index)))}")
    sdfg.add_array("X", [N], dace.float64)
    sdfg.add_array("Y", [N], dace.float64)
    state = sdfg.add_state()
    tiles_in, tiles_out = state.add_map("tiles", {"t": "0:N:4"})
    elements_in, elements_out = state.add_map("elements", {"p": f"t:{inner_end} + 1"})
    tasklet = state.add_tasklet("copy", {"x"}, {"y"}, "y = x")
    x, y = state.add_read("X"), state.add_write("Y")
    state.add_memlet_path(x, tiles_in, elements_in, tasklet, dst_conn="x", memlet=dace.Memlet(f"X[{index}]"))
    state.add_memlet_path(tasklet, elements_out, tiles_out, y, src_conn="y", memlet=dace.Memlet(f"Y[{index}]"))
    for e in [*state.in_edges(tiles_in), *state.out_edges(tiles_out)]:
        e.data = dace.Memlet(data=e.data.data, subset="0:N")
    return sdfg


@pytest.mark.parametrize("inner_end, index, expected", [
    ("Min(N - 1, t + 3)", "p", True),  # each tile's elements, the last cut short: every element once
    ("Min(N - 1, t + 2)", "p", False),  # one element of each tile never written
    ("Min(N - 1, t + 3)", "Min(p, t)", False),  # an index reading the tile itself
])
def test_a_strip_mined_map_overwrites_what_its_tiles_join_to(inner_end, index, expected):
    assert overwritten_before_read(_tiled_copy(inner_end, index), "Y") is expected


def _copy_naming_its_source(source_subset: str) -> dace.SDFG:
    """Y = the copy of X[source_subset] whose memlet names only its source (no destination subset), as
    gradflow's backward makes its working copies; then Y is read."""
    sdfg = dace.SDFG(f"copy_{source_subset.replace(':', '_').replace(' ', '')}")
    sdfg.add_array("X", [N], f64)
    sdfg.add_array("Z", [N], f64)
    sdfg.add_transient("Y", [N], f64)
    first = sdfg.add_state("copy")
    first.add_nedge(first.add_read("X"), first.add_write("Y"), dace.Memlet(f"X[{source_subset}]"))
    sdfg.add_state_after(first, "read").add_mapped_tasklet(
        "z", {"i": "0:N"}, {"y": dace.Memlet("Y[i]")}, "z = y", {"z": dace.Memlet("Z[i]")}, external_edges=True)
    return sdfg


def test_a_copy_naming_only_its_source_overwrites_the_destination_when_the_shapes_agree():
    whole, part = _copy_naming_its_source("0:N"), _copy_naming_its_source("1:N")
    assert overwritten_before_read(whole, "Y") and not may_read_before_write(whole, "Y")
    assert not overwritten_before_read(part, "Y") and may_read_before_write(part, "Y")
    # DaCe's code copies element to element: all of Y from all of X, and of a part the same part (Y[1:])
    x = np.arange(1.0, 7.0)
    for sdfg, written in ((whole, slice(0, 6)), (part, slice(1, 6))):
        z = np.full(6, -1.0)
        sdfg.compile()(X=x, Z=z, N=6)
        np.testing.assert_array_equal(z[written], x[written])
