"""Zero-copy exchange with DaCe through DLPack (pointer equality, both directions)."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

from gradflow.core.errors import ArgumentError
from gradflow.runtime import compile_sdfg
from gradflow.runtime import dlpack

N = dace.symbol("N")


@dace.program
def rt_axpy(x: dace.float64[N], y: dace.float64[N], a: dace.float64):
    return a * x + y


@pytest.fixture(scope="module")
def axpy():
    return compile_sdfg(rt_axpy.to_sdfg(simplify=True))


def test_numpy_to_torch_shares_memory():
    a = np.arange(10.0)
    t = dlpack.to_torch(a)
    assert t.data_ptr() == a.ctypes.data
    t[3] = -1.0
    assert a[3] == -1.0


def test_torch_to_numpy_shares_memory():
    t = torch.arange(10.0, dtype=torch.float64, requires_grad=True)
    a = dlpack.to_numpy(t)
    assert a.ctypes.data == t.data_ptr()


def test_readonly_numpy_is_refused():
    a = np.arange(4.0)
    a.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        dlpack.to_torch(a)


def test_dace_owned_return_value_seen_by_torch_without_copy(axpy):
    x, y = np.random.rand(7), np.random.rand(7)
    ret = axpy(x=x, y=y, a=2.0, N=7)  # allocated by DaCe
    t = dlpack.to_torch(ret)
    assert t.data_ptr() == ret.ctypes.data
    np.testing.assert_allclose(t.numpy(), 2.0 * x + y)


def test_call_with_torch_tensors(axpy):
    x, y = torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    out = dlpack.call(axpy, x=x, y=y, a=3.0)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, 3.0 * x + y)


def test_call_validates_before_dace_sees_the_tensor(axpy):
    x, y = torch.rand(5, dtype=torch.float32), torch.rand(5, dtype=torch.float64)
    with pytest.raises(ArgumentError, match="'x'.*float64, got float32"):
        dlpack.call(axpy, x=x, y=y, a=3.0)
    with pytest.raises(ArgumentError, match="'y'.*extent 6"):
        dlpack.call(axpy, x=x.double(), y=torch.rand(6, dtype=torch.float64), a=3.0)
