"""`tile_element_chains`: element-wise maps that read each other at constant offsets run block by block on
one thread.

Programs written as users write numpy (shifted slices both ways, a loop whose trip count is an argument,
a scalar computed between stages, an in-place update): forward and gradient must equal those of OPTIMIZE
without the pass and numpy's / torch's, at sizes around the block size (one block, a partial block, many)
and with one OpenMP thread (the tiled chain) and two (the chain as it was). Each program is compiled once
per pipeline; the sizes and data vary."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import tempfile

import dace
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.api import grad_graph, optimized
from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline
from gradflow.optimize import OPTIMIZE
from gradflow.analysis.versions import PREFIX
from gradflow.optimize.tiled_chains import TileElementChains, _runs
from gradflow.optimize.tiled_chains import _chains as chains_in
from gradflow.runtime import Runner
# the Runge-Kutta loss of overwrite_loop_sums' tests (two stages through a `rate` helper, S = sum(y * y)): its
# reversed loop holds a chain this pass tiles
from tests.optimize.test_loop_sums import runge_kutta as runge_kutta_loss
from tests.optimize.test_loop_sums import runge_kutta_torch as runge_kutta_loss_torch

N, T = dace.symbol("N"), dace.symbol("T")
WITHOUT = OPTIMIZE.without("tile_element_chains")
UPTO = Pipeline(OPTIMIZE.steps[:[s.name for s in OPTIMIZE.steps].index("tile_element_chains")])
#: blocks of 4 elements: every size but the smallest crosses block edges, and chains of 16 elements or more
#: run tiled (four blocks)
SMALL_BLOCKS = Pipeline(tuple(TileElementChains(block=4) if s.name == "tile_element_chains" else s
                              for s in OPTIMIZE.steps))
PIPELINES = {"default": OPTIMIZE, "blocks_of_4": SMALL_BLOCKS}
#: around the small blocks' threshold and edges, and the default blocks' (512 or 1024 elements: a chain of
#: 4 blocks or more runs tiled)
SIZES = (1, 2, 3, 15, 16, 17, 511, 513, 1100, 5000, 9000)


@dace.program
def runge_kutta(x: dace.float64[N], y: dace.float64[N]):
    k1 = np.ndarray([N], dtype=np.float64)
    k2 = np.ndarray([N], dtype=np.float64)
    for _ in range(T):
        h = 1.0 / T
        k1[0] = x[0]
        k1[1:] = x[1:] * y[:-1]
        k2[0] = x[0]
        k2[1:] = x[1:] * (y[:-1] + h * k1[:-1])
        y[:] = y + 0.5 * h * (k1 + k2)


def runge_kutta_numpy(x: np.ndarray, y: np.ndarray, t: int) -> np.ndarray:
    y = y.copy()
    for _ in range(t):
        h = 1.0 / t
        k1 = np.concatenate([x[:1], x[1:] * y[:-1]])
        k2 = np.concatenate([x[:1], x[1:] * (y[:-1] + h * k1[:-1])])
        y = y + 0.5 * h * (k1 + k2)
    return y


@dace.program
def smooth_twice(a: dace.float64[N], out: dace.float64[N]):
    # the second pass reads the first's right neighbour: its blocks must lag behind
    b = np.zeros_like(a)
    b[1:-1] = (a[:-2] + a[1:-1] + a[2:]) / 3.0
    out[1:-1] = b[2:] * b[:-2] - b[1:-1]


def smooth_twice_numpy(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    out = out.copy()
    b = np.zeros_like(a)
    b[1:-1] = (a[:-2] + a[1:-1] + a[2:]) / 3.0
    out[1:-1] = b[2:] * b[:-2] - b[1:-1]
    return out


@dace.program
def scaled_in_place(x: dace.float64[N], y: dace.float64[N]):
    # a scalar computed between the stages, and the last stage overwrites what the first one read
    s = np.ndarray([N], dtype=np.float64)
    s[1:] = np.tanh(y[:-1]) * x[1:]
    s[0] = 1.0
    scale = 0.5 / N
    y[:] = y * (1.0 + scale * s)


def scaled_in_place_numpy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    s = np.concatenate([[1.0], np.tanh(y[:-1]) * x[1:]])
    return y * (1.0 + 0.5 / len(x) * s)


@dace.program
def set_after_read(x: dace.float64[N], y: dace.float64[N], s: dace.float64[1]):
    # the first map reads s[0], which is set after it: the setting cannot run once per block
    b = np.ndarray([N], dtype=np.float64)
    b[:] = x * s[0]
    s[0] = 2.0
    y[1:] = b[1:] * s[0] + b[:-1]


def set_after_read_numpy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    y = y.copy()
    b = x * 0.5
    y[1:] = b[1:] * 2.0 + b[:-1]
    return y


def _tiled(program) -> list:
    """The pass's matches on `program` optimized up to the pass."""
    g = UPTO(Graph.of(program)).unwrap()
    return list(TileElementChains().matches(g.sdfg))


def _set_threads(count: int) -> None:
    """OpenMP's thread count for the programs loaded in this process (they ask `omp_get_max_threads`)."""
    ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads(count)


@pytest.fixture
def threads():
    yield _set_threads
    _set_threads(1)


FORWARD = {
    "runge_kutta": (runge_kutta, lambda x, y, t: runge_kutta_numpy(x, y, t), True),
    "smooth_twice": (smooth_twice, lambda a, out, t: smooth_twice_numpy(a, out), False),
    "scaled_in_place": (scaled_in_place, lambda x, y, t: scaled_in_place_numpy(x, y), False),
    "set_after_read": (set_after_read, lambda x, y, t: set_after_read_numpy(x, y), False),
}
#: programs whose chain must be left alone
UNTILED = {"set_after_read"}


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_the_pass_applies_where_it_may(name: str) -> None:
    assert bool(_tiled(FORWARD[name][0])) != (name in UNTILED), name


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_equals_numpy_and_the_program_without_the_pass(name: str, pipeline: str, threads) -> None:
    program, reference, looped = FORWARD[name]
    arg = program.argnames
    with_pass = Runner(optimized(Graph.of(program), PIPELINES[pipeline]))
    without = Runner(optimized(Graph.of(program), WITHOUT))
    rng = np.random.default_rng(11)
    for count in (1, 2):
        threads(count)
        for n in SIZES:
            t = 3 if looped else 0
            first, second = rng.uniform(0.1, 1.0, n), rng.uniform(-1.0, 1.0, n)
            want = reference(first, second, t)
            got = {}
            for side, runner in (("with", with_pass), ("without", without)):
                out = second.copy()
                extra = {"s": np.array([0.5])} if "s" in arg else {}  # set_after_read's scalar
                runner(**{arg[0]: first.copy(), arg[1]: out}, **extra, **({"T": t} if looped else {}))
                got[side] = out
            # rounding apart (GCC contracts a * b + c into one instruction or not, loop by loop), an
            # element that cancels is compared at the scale of the others
            scale = 1e-14 * np.abs(want).max()
            np.testing.assert_allclose(got["with"], want, rtol=1e-12, atol=scale, err_msg=f"n={n}")
            np.testing.assert_allclose(got["with"], got["without"], rtol=1e-12, atol=scale, err_msg=f"n={n}")


def test_the_gradient_has_a_tiled_chain() -> None:
    g = grad_graph(runge_kutta_loss, "x", "S", None, optimize=UPTO)
    assert list(TileElementChains().matches(g.sdfg))


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_gradients_equal_torchs_and_those_without_the_pass(pipeline: str, threads) -> None:
    with_pass = gradflow.value_and_grad(runge_kutta_loss, wrt="x", of="S", optimize=PIPELINES[pipeline])
    without = gradflow.value_and_grad(runge_kutta_loss, wrt="x", of="S", optimize=WITHOUT)
    rng = np.random.default_rng(5)
    for count in (1, 2):
        threads(count)
        for n, t in ((1, 2), (17, 3), (511, 1), (513, 3), (5000, 2), (1100, 0)):
            x = rng.uniform(0.1, 0.6, n)
            value, grad = with_pass(x=x.copy(), T=t)
            value_without, grad_without = without(x=x.copy(), T=t)
            xt = torch.tensor(x, requires_grad=True)
            loss = runge_kutta_loss_torch(xt, t)
            want = torch.autograd.grad(loss, xt)[0].numpy() if loss.requires_grad else np.zeros(n)
            np.testing.assert_allclose(value, loss.item(), rtol=1e-12)
            np.testing.assert_allclose(grad, grad_without, rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-14)


def _shifts(program) -> list[int]:
    g = UPTO(Graph.of(program)).unwrap()
    (chain,) = [c for region, states, pieces in _runs(g.sdfg) for c in chains_in(region, states, pieces, 4)]
    return sorted(chain.shifts.values())


def test_a_map_reading_a_right_neighbour_lags_a_block_edge_behind() -> None:
    # three maps: b's zeroing writes b[i]; the stencil writes b[i + 1] (after the zeroing of that element:
    # one behind it, -1); out[i + 1] reads b[i + 2], written by the stencil's iteration i + 1 (one behind
    # that, -2), else a block's last element would read b before it is written
    assert _shifts(smooth_twice) == [-2, -1, 0]


def test_left_neighbours_need_no_shift() -> None:
    assert set(_shifts(runge_kutta)) == {0}


@dace.program
def reads_back_a_sum(x: dace.float64[N], out: dace.float64[N]):
    # the second map reads the whole of `b` (its sum): not an element at a constant offset
    b = np.ndarray([N], dtype=np.float64)
    b[:] = x * 2.0
    out[:] = b * np.sum(b)


@dace.program
def mirrored_stage(x: dace.float64[N], out: dace.float64[N]):
    # the second map reads what the first wrote back to front (element N - 1 - i): not i + c
    b = np.ndarray([N], dtype=np.float64)
    b[:] = x * 2.0
    for i in dace.map[0:N]:
        out[i] = b[N - 1 - i] + 1.0


@pytest.mark.parametrize("program", [reads_back_a_sum, mirrored_stage], ids=lambda p: p.name)
def test_chains_whose_reads_are_not_at_constant_offsets_are_left_alone(program) -> None:
    assert not _tiled(program)
    x = np.random.default_rng(3).uniform(size=1500)
    with_pass, without = (Runner(optimized(Graph.of(program), p)) for p in (True, WITHOUT))
    a, b = np.zeros(1500), np.zeros(1500)
    with_pass(x=x, out=a)
    without(x=x, out=b)
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------- random chains
# Chains drawn at random: statements `a<k>[p:N - q] = f(a<i>[p + s:N - q + s], a<j>[...])` over four
# vectors, offsets -2..2 on either side, some updating in place (`+=`), run with blocks of 3 elements at
# sizes across many block edges, against the same statements run by numpy.

_VECTORS = 4


@st.composite
def _chains_of_statements(draw) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(2, 6))):
        target = draw(st.integers(0, _VECTORS - 1))
        first, second = draw(st.integers(0, _VECTORS - 1)), draw(st.integers(0, _VECTORS - 1))
        s1, s2 = draw(st.integers(-2, 2)), draw(st.integers(-2, 2))
        low = max(0, -s1, -s2) + draw(st.integers(0, 1))
        high = max(0, s1, s2) + draw(st.integers(0, 1))  # elements left at the end

        def part(k: int, s: int) -> str:
            return f"a{k}[{low + s}:N - {high - s}]"

        op = draw(st.sampled_from(["=", "+="]))
        expr = draw(st.sampled_from(["{x} * 0.5 + {y}", "np.tanh({x}) - {y}", "{x} * {y} + 0.25"]))
        lines.append(f"a{target}[{low}:N - {high}] {op} " + expr.format(x=part(first, s1), y=part(second, s2)))
    return lines


def _random_chain_program(lines: list[str], tmp: str):
    """The statements as a DaCe program (in a module file: DaCe reads the source) and as a numpy function."""
    args = ", ".join(f"a{k}: dace.float64[N]" for k in range(_VECTORS))
    body = "\n".join("    " + line for line in lines)
    source = f"import numpy as np\nimport dace\nN = dace.symbol('N')\n\n\n@dace.program\ndef chain({args}):\n{body}\n"
    path = os.path.join(tmp, f"chain_{abs(hash(source))}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"chain_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    twin_source = f"import numpy as np\n\ndef twin(N, {', '.join(f'a{k}' for k in range(_VECTORS))}):\n{body}\n"
    namespace: dict = {}
    exec(twin_source, namespace)
    return module.chain, namespace["twin"]


BLOCKS_OF_3 = Pipeline(tuple(TileElementChains(block=3) if s.name == "tile_element_chains" else s
                             for s in OPTIMIZE.steps))


@settings(max_examples=8, deadline=None, derandomize=True)
@given(_chains_of_statements())
def test_random_chains_equal_numpy_with_small_blocks(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        program, twin = _random_chain_program(lines, tmp)
        built = optimized(Graph.of(program), BLOCKS_OF_3)
    # only chains the pass tiles test it (a chain it leaves alone is the program as it was)
    assume(any(b.label.startswith(PREFIX) for b in built.sdfg.all_control_flow_blocks()))
    runner = Runner(built)
    rng = np.random.default_rng(len(lines))
    for n in (6, 7, 12, 13, 14, 40):  # from under the four blocks that run tiled to many blocks
        data = [rng.uniform(-1.0, 1.0, n) for _ in range(_VECTORS)]
        want = [d.copy() for d in data]
        twin(n, *want)
        got = [d.copy() for d in data]
        runner(**{f"a{k}": got[k] for k in range(_VECTORS)})
        for k in range(_VECTORS):
            scale = 1e-14 * max(1.0, np.abs(want[k]).max())
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=scale, err_msg=f"a{k} at N={n}: {lines}")
