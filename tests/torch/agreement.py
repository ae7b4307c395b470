"""How close a compiled module is to the torch module it was compiled from (shared by the float64 tests of
`test_compile.py` and `test_precision.py`)."""

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
