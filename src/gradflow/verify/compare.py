"""Comparing computed values with references: the one place that decides "agrees" and "how far off".

A check compares arrays with `agree`, which returns the worst relative error it saw (for the report) and
raises `CheckFailure` naming what disagreed when the values are not within tolerance. Tests and the
`gradflow verify` command use the same checks, so a rule is verified the same way in both.
"""

from __future__ import annotations

import numpy as np

from gradflow.core.errors import GradflowError


class CheckFailure(GradflowError):
    """A verification check found a value that disagrees with its reference (named in the message)."""


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max(|want|, tiny): 0 for equal arrays, inf where a NaN or inf appears on one side."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    finite = np.isfinite(got) & np.isfinite(want)
    same_nonfinite = (np.isnan(got) & np.isnan(want)) | (np.isinf(got) & (got == want))
    if not np.all(finite | same_nonfinite):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = np.maximum(np.abs(want[finite]), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(got[finite] - want[finite]) / scale))


def agree(got, want, *, rtol: float, atol: float, what: str) -> float:
    """The worst relative error of `got` against `want`; `CheckFailure` unless `allclose(rtol, atol)`."""
    got_a, want_a = np.asarray(got), np.asarray(want)
    error = relative_error(got_a, want_a)
    try:
        np.testing.assert_allclose(got_a, want_a, rtol=rtol, atol=atol)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise CheckFailure(f"{what}: {' '.join(lines[1:4])}") from None
    return error
