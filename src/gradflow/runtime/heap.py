"""Large temporaries without page faults: glibc's malloc keeps freed blocks of up to 32 MiB for reuse.

Every call of a compiled program allocates its transients (an im2col buffer, the adjoints of the backward
pass; 18 MB per backward call of a small residual block) and the dispatcher allocates the outputs. glibc
serves blocks above its mmap threshold (128 KiB, raised adaptively only in some allocation patterns) with
fresh `mmap`s and returns them with `munmap`, so each call page-faults its temporaries in again, zeroing
every page: measured, a fifth of the residual block's forward+backward time was in the kernel's page
fault path and its forward+backward went from 19 ms to 11.5 ms with the thresholds raised.

`keep_freed_blocks()` sets, once per process, the mmap threshold to 32 MiB (glibc's own ceiling for its
adaptive threshold) and the trim threshold to 128 MiB, through `mallopt`, unless the user tuned malloc
(`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_` or `glibc.malloc` tunables) or
set `GRADFLOW_KEEP_FREED_BLOCKS=0`. The price: up to that much freed memory stays mapped in the process
(the same trade-off PyTorch's CPU performance guide makes by recommending jemalloc or tcmalloc).
Nothing happens off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

#: mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _user_tuned() -> bool:
    return (any(name in os.environ for name in _USER_SETTINGS)
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
            or os.environ.get("GRADFLOW_KEEP_FREED_BLOCKS", "1") == "0")


@functools.cache
def keep_freed_blocks() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process; see the module docstring). Returns whether
    they were set."""
    if _user_tuned():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
