"""Write-conflict resolution, in one place: the lambdas gradflow writes on memlets that accumulate, and
what kind of reduction a memlet's lambda is."""

from __future__ import annotations

import functools

import dace
from dace.frontend.operations import detect_reduction_type

SUM = "lambda a, b: a + b"
PRODUCT = "lambda a, b: a * b"
MAX = "lambda a, b: max(a, b)"
MIN = "lambda a, b: min(a, b)"


@functools.lru_cache(maxsize=512)
def reduction_type(wcr: str | None) -> dace.dtypes.ReductionType | None:
    """DaCe's `detect_reduction_type` of a write-conflict lambda, memoized: it is a pure function of the
    text, and each call builds SymPy's `Max`/`Min` of two symbols (milliseconds), which the AD asks for
    every write-conflict edge it meets."""
    return detect_reduction_type(wcr)
