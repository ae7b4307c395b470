"""`jacfwd` and `jacrev` on a small vector function with a loop and an in-place update, against
`torch.func.jacfwd`/`jacrev`; torch tensors in, a tensor out; the caller's arrays left as they were."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import gradflow
from gradflow.core.errors import InvalidArgumentError

N = dace.symbol("N")
M = dace.symbol("M")


@dace.program
def mix(x: dace.float64[N], W: dace.float64[M, N], y: dace.float64[M]):
    h = np.copy(x)
    for _t in range(3):
        h[1:] = np.tanh(h[1:] + 0.5 * h[:-1])
    y[:] = W @ (h * h) + np.sin(x[0]) * W[:, 0]


def _torch_mix(x, W):
    h = x
    for _ in range(3):
        h = torch.cat([h[:1], torch.tanh(h[1:] + 0.5 * h[:-1])])
    return W @ (h * h) + torch.sin(x[0]) * W[:, 0]


BUILT = {}


def _built(kind):
    if kind not in BUILT:  # one build per kind for all the examples
        BUILT[kind] = (gradflow.jacfwd if kind == "fwd" else gradflow.jacrev)(mix, wrt="x", of="y")
    return BUILT[kind]


@pytest.mark.parametrize("kind", ["fwd", "rev"])
@settings(max_examples=4, deadline=None)
@given(x=arrays(np.float64, 5, elements=st.floats(-2, 2)), W=arrays(np.float64, (3, 5), elements=st.floats(-2, 2)))
def test_jacobian_equals_torch(kind, x, W):
    x0, W0 = x.copy(), W.copy()
    J = _built(kind)(x=x, W=W)
    want = (torch.func.jacfwd if kind == "fwd" else torch.func.jacrev)(_torch_mix)(torch.tensor(x), torch.tensor(W))
    assert J.shape == (3, 5)
    assert np.allclose(J, want.numpy(), rtol=1e-10, atol=1e-12)
    assert np.array_equal(x, x0) and np.array_equal(W, W0)


def test_torch_tensors_in_a_tensor_out():
    x, W = torch.linspace(-1, 1, 5, dtype=torch.float64), torch.ones(3, 5, dtype=torch.float64)
    J = _built("rev")(x, W)
    assert isinstance(J, torch.Tensor)
    assert torch.allclose(J, torch.func.jacrev(_torch_mix)(x, W), rtol=1e-10, atol=1e-12)


def test_one_name_each():
    with pytest.raises(InvalidArgumentError, match="wrt takes one array name"):
        gradflow.jacfwd(mix, wrt=["x", "W"], of="y")


@pytest.mark.parametrize("kind", ["fwd", "rev"])
def test_a_function_of_no_outputs_has_an_empty_jacobian(kind):
    x, W = np.linspace(-1, 1, 5), np.ones((0, 5))
    J = _built(kind)(x=x, W=W)
    assert J.shape == (0, 5)


@dace.program
def spread(x: dace.float64[N], a: dace.float64[M], y: dace.float64[M]):
    y[:] = a * np.sum(x * x)


def test_a_jacobian_with_respect_to_an_empty_array_has_no_columns():
    J = gradflow.jacfwd(spread, wrt="x", of="y")(x=np.zeros(0), a=np.arange(3.0))
    assert J.shape == (3, 0)
