"""Convolutions of compiled torch models computed by torch's own convolution (`gradflow.torch.convolution`)
or by gradflow's kernels, as GRADFLOW_CONV routes them, with the same answers either way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import gradflow.torch as gt
from gradflow.core.errors import InvalidArgumentError
from gradflow.torch import convolution
from tests.torch.agreement import assert_output_and_gradients_agree

F32 = 1e-5


class _Wide(torch.nn.Module):
    """Two 3x3 convolutions with 16 to 32 channels."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.b = torch.nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).sum(dim=(2, 3))


def _stem() -> torch.nn.Module:
    # three input channels, a 1x1 convolution, a strided one
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 1),
                               torch.nn.Conv2d(16, 16, 3, stride=2, padding=1))


def _calls_of_one_step(compiled, x: torch.Tensor) -> tuple[int, int]:
    """How many kernel calls torch computed in a forward, then in a backward, of `compiled`."""
    start = convolution.torch_calls()
    out = compiled(x)
    forward = convolution.torch_calls() - start
    torch.autograd.grad(out, list(compiled.parameters()), torch.ones_like(out))
    return forward, convolution.torch_calls() - start - forward


@pytest.fixture
def route(monkeypatch):
    """Sets GRADFLOW_CONV for the models a test compiles (read when their programs are built); the process's
    mode is the default's again afterwards."""
    yield lambda choice: monkeypatch.setenv("GRADFLOW_CONV", choice)
    convolution.set_mode("auto")


def test_torch_route_runs_every_convolution_on_torchs_and_agrees_with_eager(route) -> None:
    route("torch")
    torch.manual_seed(0)
    model, x = _Wide(), torch.randn(4, 16, 12, 12)
    compiled = gt.compile(model, (x,))
    assert _calls_of_one_step(compiled, x) == (2, 3)  # backward: both weight gradients, b's input gradient
    assert_output_and_gradients_agree(model, compiled, x, torch.randn(4, 16), F32)
    torch.manual_seed(1)
    model, x = _stem(), torch.randn(4, 3, 8, 8)
    compiled = gt.compile(model, (x,))
    assert _calls_of_one_step(compiled, x) == (3, 5)  # not the stem's input gradient
    assert_output_and_gradients_agree(model, compiled, x, torch.randn(4, 16, 4, 4), F32)


def test_auto_route_decides_each_shape_once_and_agrees_with_eager(route) -> None:
    # the first step times both routes of each convolution; from then on every step takes the same ones
    route("auto")
    convolution.forget_routes()
    torch.manual_seed(1)
    model, x = _stem(), torch.randn(4, 3, 8, 8)
    compiled = gt.compile(model, (x,))
    assert_output_and_gradients_agree(model, compiled, x, torch.randn(4, 16, 4, 4), F32)
    decided = convolution.routes()
    assert sorted(r["operation"] for r in decided) == sorted(["forward"] * 3 + ["grad_weights"] * 3
                                                             + ["grad_input"] * 2)
    steps = [_calls_of_one_step(compiled, x) for _ in range(2)]
    assert steps[0] == steps[1]
    assert sum(steps[0]) == sum(r["torch"] for r in decided)  # each shape computed once a step
    assert convolution.routes() == decided
    assert_output_and_gradients_agree(model, compiled, x, torch.randn(4, 16, 4, 4), F32)


def test_float64_convolutions_stay_with_gradflows_kernels(route) -> None:
    route("torch")
    torch.manual_seed(2)
    model, x = _Wide().double(), torch.randn(2, 16, 8, 8, dtype=torch.float64)
    compiled = gt.compile(model, (x,))
    assert _calls_of_one_step(compiled, x) == (0, 0)
    assert_output_and_gradients_agree(model, compiled, x, torch.randn(2, 16, dtype=torch.float64), 1e-12)


_OWN = """
import torch, gradflow.torch as gt
from gradflow.torch import convolution
from tests.torch.agreement import assert_output_and_gradients_agree
from tests.torch.test_convolution import _Wide, F32
torch.manual_seed(0)
model, x = _Wide(), torch.randn(4, 16, 12, 12)
compiled = gt.compile(model, (x,))
assert_output_and_gradients_agree(model, compiled, x, torch.randn(4, 16), F32)
print("torch calls", convolution.torch_calls())
"""


def test_gradflow_conv_own_keeps_gradflows_kernels() -> None:
    # a fresh process: once torch's convolution is loaded into one, the kernels find it
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _OWN], env={**os.environ, "GRADFLOW_CONV": "own"},
                         capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch calls 0" in out.stdout


def test_an_unknown_gradflow_conv_is_a_typed_error(monkeypatch) -> None:
    x = torch.randn(3, 2)
    compiled = gt.compile(torch.nn.Linear(2, 2), (x,))
    monkeypatch.setenv("GRADFLOW_CONV", "onednn")
    with pytest.raises(InvalidArgumentError, match="GRADFLOW_CONV is 'onednn'"):
        compiled(x)  # its programs are built at the first call
