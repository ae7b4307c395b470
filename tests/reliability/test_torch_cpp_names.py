"""The C++ dispatcher with a size symbol named like one of its generated locals (`a0` is the first input's
parameter): the extension builds and agrees with torch. One extension build (~20 s on a cold cache)."""

from __future__ import annotations

import dace
import torch

import gradflow.torch as gt

A0 = dace.symbol("a0")


@dace.program
def scaled(a: dace.float64[A0], ctx: dace.float64[A0], y: dace.float64[A0]):
    y[:] = a * a * ctx


def test_symbol_named_like_a_generated_local_builds_and_runs():
    f = gt.function(scaled, inputs=["a", "ctx"], outputs=["y"], dispatcher="cpp")
    a = torch.rand(6, dtype=torch.float64, requires_grad=True)
    c = torch.rand(6, dtype=torch.float64, requires_grad=True)
    y = f(a, c)
    torch.testing.assert_close(y, a * a * c)
    ga, gc = torch.autograd.grad(y.sum(), [a, c])
    torch.testing.assert_close(ga, 2 * a * c)
    torch.testing.assert_close(gc, a * a)
    torch.testing.assert_close(f(a=a[:4], ctx=c[:4]), (a * a * c)[:4])
