"""gradflow raises glibc's mmap threshold so that the large temporaries of every call come from (and go
back to) the heap instead of fresh, page-faulting mappings, unless the user tuned malloc or opted out.
Checked in fresh processes (the thresholds are process state) through the chunk header glibc puts in
front of every block: bit 1 of the size word marks a block served by its own mmap."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_PROBE = """
import ctypes
from gradflow.runtime import heap
print(heap.keep_freed_blocks())
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
block = libc.malloc(8 << 20)
print(ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & 2 == 2)
"""

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")


def _probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "GRADFLOW_KEEP_FREED_BLOCKS")}
    return subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.split()


def test_an_8_mb_block_comes_from_the_heap() -> None:
    assert _probe() == ["True", "False"]


def test_opting_out_keeps_glibcs_defaults() -> None:
    assert _probe(GRADFLOW_KEEP_FREED_BLOCKS="0") == ["False", "True"]


def test_a_users_malloc_tuning_is_kept() -> None:
    assert _probe(MALLOC_MMAP_THRESHOLD_="65536") == ["False", "True"]
