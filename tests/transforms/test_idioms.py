"""`raise_convolutions` (`transforms/idioms.py`): NPBench's loop-nest convolutions become `Convolution` nodes
that compute the same values; near misses stay loops. The gradients of the raised NPBench networks are
checked against torch in `tests/corpus/test_npbench_grad.py` (conv2d_bias, lenet, resnet)."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from dace.sdfg.state import LoopRegion

from gradflow.transforms.idioms import RaiseConvolutions, find_matches
from gradflow.core.graph import Graph
from gradflow.library.convolution import Convolution
from gradflow.runtime.compile import compile_sdfg
from tests.corpus import npbench

N, H, W, C, M, OH = (dace.symbol(s) for s in ("N", "H", "W", "C", "M", "OH"))
f64 = dace.float64


def _convolutions(graph: Graph) -> list[Convolution]:
    return [n for n, _ in graph.sdfg.all_nodes_recursive() if isinstance(n, Convolution)]


def _loops(graph: Graph) -> int:
    return sum(isinstance(b, LoopRegion) for b in graph.sdfg.all_control_flow_blocks())


@pytest.mark.parametrize("name, count", [("nb_conv2d_bias", 1), ("nb_lenet", 2), ("nb_resnet", 3)])
def test_npbench_convolutions_are_raised(name: str, count: int) -> None:
    graph = Graph.of(getattr(npbench, name).to_sdfg(simplify=True))
    raised = RaiseConvolutions()(graph).unwrap()
    convs = _convolutions(raised)
    assert len(convs) == count and all(c.layout == "NHWC" for c in convs)
    assert _loops(raised) == _loops(graph) - 2 * count
    assert not _convolutions(graph)  # the input is untouched
    raised.sdfg.validate()


@dace.program
def strided(x: f64[N, H, W, C], w: f64[3, 2, C, M], out: f64[N, OH, W - 1, M]):
    for i in range(OH):
        for j in range(W - 1):
            out[:, i, j, :] = np.sum(x[:, 2 * i:2 * i + 3, j:j + 2, :, np.newaxis] * w[np.newaxis], axis=(1, 2, 3))


def test_strided_convolution_is_raised_and_computes_the_same() -> None:
    graph = Graph.of(strided.to_sdfg(simplify=True))
    raised = RaiseConvolutions()(graph).unwrap()
    (conv,) = _convolutions(raised)
    assert list(conv.strides) == [2, 1] and list(conv.dilations) == [1, 1]
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 9, 6, 3)), rng.normal(size=(3, 2, 3, 4))
    out = np.full((2, 4, 5, 4), np.nan)
    compile_sdfg(raised)(x=x, w=w, out=out, N=2, H=9, W=6, C=3, M=4, OH=4)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(3, 2, 0, 1),
                                      stride=(2, 1)).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@dace.program
def channel_kept(x: f64[N, H, W, C], w: f64[3, 3, C, M], out: f64[N, H - 2, W - 2, C, M]):
    for i in range(H - 2):
        for j in range(W - 2):
            out[:, i, j, :, :] = np.sum(x[:, i:i + 3, j:j + 3, :, np.newaxis] * w[np.newaxis], axis=(1, 2))


@dace.program
def summed_not_multiplied(x: f64[N, H, W, C], w: f64[3, 3, C, M], out: f64[N, H - 2, W - 2, M]):
    for i in range(H - 2):
        for j in range(W - 2):
            out[:, i, j, :] = np.sum(x[:, i:i + 3, j:j + 3, :, np.newaxis] + w[np.newaxis], axis=(1, 2, 3))


@dace.program
def part_of_the_output(x: f64[N, H, W, C], w: f64[3, 3, C, M], out: f64[N, H - 2, W - 2, M]):
    for i in range(H - 3):
        for j in range(W - 2):
            out[:, i, j, :] = np.sum(x[:, i:i + 3, j:j + 3, :, np.newaxis] * w[np.newaxis], axis=(1, 2, 3))


@dace.program
def loop_variable_read_after(x: f64[N, H, W, C], w: f64[3, 3, C, M], out: f64[N, H - 2, W - 2, M], last: f64[1]):
    for i in range(H - 2):
        for j in range(W - 2):
            out[:, i, j, :] = np.sum(x[:, i:i + 3, j:j + 3, :, np.newaxis] * w[np.newaxis], axis=(1, 2, 3))
    last[0] = i


@pytest.mark.parametrize("program", [channel_kept, summed_not_multiplied, part_of_the_output, loop_variable_read_after],
                         ids=lambda p: p.name)
def test_near_misses_stay_loops(program) -> None:
    graph = Graph.of(program.to_sdfg(simplify=True))
    assert _loops(graph) >= 2
    assert not find_matches(graph.sdfg)
    assert RaiseConvolutions()(graph).unwrap() is graph
