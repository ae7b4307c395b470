"""How close a compiled module is to the torch module it was compiled from (shared by the float64 tests of
`test_compile.py`, `test_precision.py`, `test_dynamo_backend.py` and `test_draws.py`)."""

from __future__ import annotations

import torch


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (elementwise relative errors of entries near 0 measure summation order)."""
    return ((a - b).abs().max() / b.abs().max()).item()


def assert_output_and_gradients_agree(model, compiled, x: torch.Tensor, cotangent: torch.Tensor,
                                      tol: float) -> None:
    """`compiled(x)` and its parameter gradients for `cotangent` are `model`'s to `tol` (relative_error)."""
    out, want = compiled(x), model(x)
    assert relative_error(out, want) < tol
    got = torch.autograd.grad(out, list(compiled.parameters()), cotangent)
    expected = torch.autograd.grad(want, list(model.parameters()), cotangent)
    for (name, _), a, b in zip(model.named_parameters(), got, expected):
        assert relative_error(a, b) < tol, name


def assert_seeded_alike_through_the_backend(model, ref, inputs, tol: dict) -> None:
    """`model` through `torch.compile(backend="gradflow")` and `ref` in eager torch, seeded alike before each
    call (seed k for `inputs[k]`, so both draw the same dropout masks and random numbers): outputs and
    parameter gradients of `square().sum()` agree to `tol` (`torch.testing.assert_close` arguments)."""
    run = torch.compile(model, backend="gradflow")
    for seed, x in enumerate(inputs):
        torch.manual_seed(seed)
        y = run(x)
        torch.manual_seed(seed)
        want = ref(x)
        torch.testing.assert_close(y, want, **tol)
        y.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol)
            p.grad = q.grad = None
