"""A float64 module computes in float64 through `gradflow.torch.compile`, scalar arithmetic included.

Arithmetic between a 0-dim float64 tensor and a Python number is float64 in eager torch, but torch's
TorchScript exporter writes it through float32 (`Cast(to=float)`, float32 constants, `Cast(to=double)`):
before `gradflow.torch.precision`, such a model agreed with eager torch to about 1e-8 only. A rounding the
model asks for itself (`.float()` without arithmetic) is kept. ONNX keeps float attributes in single
precision too (`LeakyRelu(alpha=0.1)`): the lowering reads each as the double it most likely was
(`gradflow.frontend.onnx.table.widened`).
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

import gradflow.torch as gt
from gradflow.torch.export import export_module
from tests.torch.agreement import assert_output_and_gradients_agree


class ScalarArithmetic(torch.nn.Module):
    """Reductions to 0-dim tensors scaled and shifted by Python numbers, mixed back into tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        scale = y.abs().mean() * 0.1 + 1e-3  # a 0-dim float64 value times and plus Python floats
        return y / scale + 0.5 * y.sum() - (y ** 2).sum() / 3.0


class AsksForFloat32(torch.nn.Module):
    """A model that rounds a value to float32 on purpose (no Python number involved)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return y * y.sum().float().double()


class SinglePrecisionAttributes(torch.nn.Module):
    """Activations and a normalization whose constants ONNX stores as float32 attributes (LeakyRelu's and
    Elu's alpha, LayerNormalization's epsilon)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.norm = torch.nn.LayerNorm(3, eps=1e-3)

    def forward(self, x):
        y = self.lin(x)
        return self.norm(torch.nn.functional.leaky_relu(y, 0.1) + torch.nn.functional.elu(y, 0.7))


@functools.cache
def _compiled(cls):
    torch.manual_seed(0)
    model = cls().double()
    return model, gt.compile(copy.deepcopy(model), (torch.randn(5, 4, dtype=torch.float64),))


def _casts_to_float(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type == "Cast"
               and any(a.name == "to" and a.i == TensorProto.FLOAT for a in n.attribute))


def test_the_exporter_detours_are_computed_in_float64_and_asked_roundings_kept() -> None:
    model, _ = _compiled(ScalarArithmetic)
    x = torch.randn(5, 4, dtype=torch.float64)
    assert _casts_to_float(export_module(model, (x,), [(5, 3)]).model) == 0
    asked, _ = _compiled(AsksForFloat32)
    assert _casts_to_float(export_module(asked, (x,), [(5, 3)]).model) == 1


@pytest.mark.parametrize("cls", [ScalarArithmetic, AsksForFloat32, SinglePrecisionAttributes],
                         ids=lambda c: c.__name__)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_float64_models_match_eager_torch_to_1e12(seed: int, cls) -> None:
    model, compiled = _compiled(cls)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    g = torch.randn(5, 3, dtype=torch.float64, generator=gen)
    assert_output_and_gradients_agree(model, compiled, x, g, 1e-12)


def test_a_float_attribute_is_read_as_the_double_it_rounds_from() -> None:
    from gradflow.frontend.onnx.table import widened

    for value in (0.1, 0.7, 1 / 6, 1 / 3, 1e-5, 1e-12, -0.2, 2.5):
        assert widened(float(np.float32(value))) == value
    for value in (1.6732632423543772, 0.7978845608028654):  # no short form: still the same single
        assert np.float32(widened(float(np.float32(value)))) == np.float32(value)


class Upsampled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 1)

    def forward(self, x):
        return torch.nn.functional.interpolate(self.conv(x), scale_factor=2, mode="nearest").sum((2, 3))


def test_a_model_exported_under_float64_as_default_dtype_keeps_resize_scales_float32() -> None:
    # with float64 as torch's default dtype the exporter writes F.interpolate's scales in float64, which
    # ONNX's type check refuses: the model did not load (MalformedModelError, "fix or re-export the model")
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = Upsampled()
        x = torch.randn(2, 2, 3, 3)
        compiled = gt.compile(copy.deepcopy(model), (x,))
        assert_output_and_gradients_agree(model, compiled, x, torch.randn(2, 3), 1e-12)
    finally:
        torch.set_default_dtype(saved)
