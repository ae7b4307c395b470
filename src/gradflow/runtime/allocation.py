"""A typed error before an allocation that cannot succeed.

The sizes of what gradflow allocates at a call (outputs, gradients, saved values) follow from the
symbols the inputs' shapes fix: a wrong or broadcast input can ask for terabytes, and numpy's
`MemoryError` would then name neither the array nor the sizes. `check_fits` says which array, its shape
and the symbol values, before anything is allocated.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Mapping, Sequence

import numpy as np

from gradflow.core.errors import ArgumentError


@functools.cache
def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(what: str, shape: Sequence[int], dtype, symbols: Mapping[object, int]) -> None:
    """Raise `ArgumentError` when `what` (the user's name for it) of `shape` would not fit in memory."""
    limit = physical_memory()
    nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    if limit is None or nbytes <= limit:
        return
    sizes = ", ".join(f"{k} = {v}" for k, v in symbols.items())
    raise ArgumentError(
        f"{what} would need {nbytes / 2**30:.1f} GiB (shape {tuple(int(d) for d in shape)}"
        + (f", from {sizes}" if sizes else "") + f"), more than this machine's {limit / 2**30:.1f} GiB",
        "check the shapes of the inputs (a broadcast or transposed input can fix a size you did not mean)")
