"""Write-conflict sums DaCe would leave unprotected in a parallel loop (`runtime/races.py`): a map whose
threads could add into the same element runs sequentially; maps whose threads provably write apart, and
sums DaCe makes atomic, are left as they are."""

from __future__ import annotations

import copy
import glob
import os
import subprocess
import sys

import dace
import pytest
from dace.sdfg import nodes as nd

from gradflow.core.graph import Graph, fingerprint
from gradflow.runtime import races
from gradflow.runtime.compile import build_key, compile_sdfg, usable_cache_root
from tests.optimize.test_nest_reductions import matvec, shifted_sum

N, K = dace.symbol("N"), dace.symbol("K")
# shifted_sum: y[i + k], iterations with different i add into the same element and DaCe's check passes it;
# matvec: y[i] over (i, k), which DaCe makes atomic itself


@dace.program
def strided_sum(A: dace.float64[N, K], y: dace.float64[2 * N, K]):
    # y[2 i, k]: every (i, k) adds into its own element
    for i, k in dace.map[0:N, 0:K]:
        with dace.tasklet:
            a << A[i, k]
            o >> y(1, lambda p, q: p + q)[2 * i, k]
            o = a


def _maps(sdfg: dace.SDFG) -> list[nd.MapEntry]:
    return [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nd.MapEntry)]


def test_a_map_whose_threads_meet_on_an_element_runs_sequentially() -> None:
    sdfg = shifted_sum.to_sdfg()
    [entry] = _maps(sdfg)
    assert entry.map.schedule != dace.ScheduleType.Sequential
    assert races.serialize_racing_sums(sdfg) == [entry.map.label]
    assert entry.map.schedule == dace.ScheduleType.Sequential


@pytest.mark.parametrize("program", [matvec, strided_sum])
def test_maps_that_do_not_race_are_left_alone(program) -> None:
    sdfg = program.to_sdfg()
    before = [e.map.schedule for e in _maps(sdfg)]
    assert races.serialize_racing_sums(sdfg) == []
    assert [e.map.schedule for e in _maps(sdfg)] == before


@pytest.mark.parametrize("params, collapse, index, apart", [
    (["i", "k"], 1, "i + k", False),  # another value of i meets this one's elements through k
    (["i", "k"], 1, "2*i, k", True),
    (["i", "k"], 1, "k", False),  # i is not in the index: every thread adds into every element
    (["i", "k"], 2, "i, k", True),
    (["i", "k"], 2, "i", False),  # collapsed: (i, 0) and (i, 1) may be on two threads
    (["i"], 1, "4*i:4*i + 4", True),  # blocks of 4 elements (the end is exclusive), 4 apart
    (["i"], 1, "4*i:4*i + 5", False),  # blocks of 5 elements, 4 apart: neighbours share one
    (["i"], 1, "i % 7", False),  # not affine
    (["i", "k"], 1, "32*i + k", True),  # k < 32 (the map's range below): i's elements are 32 apart
    (["i", "k"], 1, "31*i + k", False),
    (["i", "k"], 1, "32*i + k:32*i + k + 2", False),  # k's block of 2 reaches the next i's first element
])
def test_which_indices_keep_threads_apart(params, collapse, index, apart) -> None:
    m = nd.Map("m", params, dace.subsets.Range([(0, 99, 1)] + [(0, 31, 1)] * (len(params) - 1)))
    m.collapse = collapse
    assert races.disjoint_across_threads(nd.MapEntry(m), dace.subsets.Range.from_string(index)) == apart


@pytest.mark.parametrize("index, apart", [("2*i, k", True), ("32*i + k", False), ("i", False)])
def test_every_parameter_of_a_cuda_kernel_is_parallel(index, apart) -> None:
    # (i, 0) and (i, 1) run on two GPU threads whatever `collapse` says: `32*i + k` passes for OpenMP
    # (i alone shared out, k < 32), not for a kernel
    m = nd.Map("m", ["i", "k"], dace.subsets.Range([(0, 99, 1), (0, 31, 1)]),
               schedule=dace.ScheduleType.GPU_Device)
    assert races.disjoint_across_threads(nd.MapEntry(m), dace.subsets.Range.from_string(index)) == apart


def test_a_cuda_kernel_that_would_race_is_a_compilation_error() -> None:
    from gradflow.core.errors import CompilationError
    from gradflow.gpu import OPTIMIZE_GPU

    gpu = OPTIMIZE_GPU(Graph.of(shifted_sum.to_sdfg())).unwrap().to_sdfg()
    with pytest.raises(CompilationError, match=r"sum into 'y' in GPU kernel .* would race"):
        races.serialize_racing_sums(gpu)
    assert races.serialize_racing_sums(OPTIMIZE_GPU(Graph.of(strided_sum.to_sdfg())).unwrap().to_sdfg()) == []


def test_the_built_program_has_no_parallel_loop_around_the_unprotected_adds() -> None:
    graph = Graph.of(shifted_sum.to_sdfg())
    compile_sdfg(graph)
    folder = usable_cache_root() / build_key(graph.sdfg, graph.fingerprint)
    [code] = [open(p).read() for p in glob.glob(str(folder / "src" / "cpu" / "*.cpp"))]
    assert "reduce(y + (i + k)" in code and "#pragma omp parallel" not in code


_TWO_THREADS = """
import numpy as np, dace, gradflow
from gradflow.runtime import races
n, k = 2, 2_000_000
@dace.program
def corr(x: dace.float64[n + k - 1], w: dace.float64[k], S: dace.float64[1]):
    y = np.zeros([n], dtype=np.float64)
    for i, j in dace.map[0:n, 0:k]:
        with dace.tasklet:
            a << x[i + j]
            b << w[j]
            o >> y(1, lambda p, q: p + q)[i]
            o = a * b
    S[0] = np.sum(y * y)
# unoptimized: OPTIMIZE's choose_schedules already makes such a map sequential (its sums have no owner)
grad = gradflow.grad(corr, wrt=["x"], of="S", optimize=False)
print("serialized", races.serialize_racing_sums(grad.sdfg.__deepcopy__({})))
f = gradflow.value_and_grad(corr, wrt=["x"], of="S", optimize=False)
rng = np.random.default_rng(0)
x, w = rng.standard_normal(n + k - 1), rng.standard_normal(k)
y = np.array([x[i:i + k] @ w for i in range(n)])
want = np.zeros(n + k - 1)
for i in range(n):
    want[i:i + k] += 2 * y[i] * w
worst = 0.0
for _ in range(5):
    _, g = f(x=x, w=w, S=np.zeros(1))
    worst = max(worst, float(np.abs(g["x"] - want).max() / np.abs(want).max()))
print("worst", worst)
"""


def test_a_correlation_gradient_on_two_threads(tmp_path) -> None:
    # the adjoint of x[i + j] is gx[i + j] += ...: gradflow's reverse mode makes the sum that DaCe would
    # leave racing (2 of 10 calls of `shifted_sum` lost additions at two threads before this check);
    # fresh process, as the thread count is its state
    script = tmp_path / "corr.py"  # DaCe parses a program from its source file
    script.write_text(_TWO_THREADS)
    out = subprocess.run([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "2"},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("serialized", "worst")))
    assert lines["serialized"] != "[]"  # the gradient program has such a map
    assert float(lines["worst"]) < 1e-12


def test_the_check_works_on_a_copy_of_what_the_caller_gave() -> None:
    graph = Graph.of(shifted_sum.to_sdfg())
    before = fingerprint(graph.sdfg)
    compile_sdfg(graph)
    assert fingerprint(graph.sdfg) == before
    assert all(e.map.schedule != dace.ScheduleType.Sequential for e in _maps(graph.sdfg))


class _ExpandShiftedAdd(dace.transformation.ExpandTransformation):
    environments: list = []

    @staticmethod
    def expansion(node, state: dace.SDFGState, sdfg: dace.SDFG) -> dace.SDFG:
        inner = shifted_sum.to_sdfg()  # (x, y) -> y[i + k] += x[...] over a map on (i, k)
        inner.name = "shifted_add_expansion"
        return inner


@dace.library.node
class _ShiftedAdd(nd.LibraryNode):
    """A library node whose expansion is the sum DaCe lets race; nothing of it is visible before the build
    expands it."""

    implementations = {"pure": _ExpandShiftedAdd}
    default_implementation = "pure"

    def __init__(self, name: str = "shifted_add") -> None:
        super().__init__(name, inputs={"A"}, outputs={"y"})


def test_a_racing_sum_inside_a_library_expansion_is_checked_too() -> None:
    # the code generator expands library nodes after the caller's last look at the SDFG; the check runs on
    # what it expands, so the expansion's map (in a nested SDFG) is built sequential
    outer = shifted_sum.to_sdfg()
    sdfg = dace.SDFG("calls_a_library_node")
    for name, desc in outer.arrays.items():
        sdfg.add_datadesc(name, copy.deepcopy(desc))
    state = sdfg.add_state()
    node = _ShiftedAdd()
    state.add_node(node)
    [inp] = [n for n in outer.arrays if n != "y"]
    state.add_edge(state.add_read(inp), None, node, "A", dace.Memlet.from_array(inp, sdfg.arrays[inp]))
    state.add_edge(node, "y", state.add_write("y"), None, dace.Memlet.from_array("y", sdfg.arrays["y"]))
    assert _maps(sdfg) == []
    graph = Graph.of(sdfg)
    compile_sdfg(graph)
    folder = usable_cache_root() / build_key(graph.sdfg, graph.fingerprint)
    [code] = [open(p).read() for p in glob.glob(str(folder / "src" / "cpu" / "*.cpp"))]
    assert "reduce(y + (i + k)" in code
    assert "#pragma omp parallel" not in code
