"""gradflow runs OpenBLAS calls on the calling thread (its pool's spinning workers starved OpenMP's and
torch's threads), unless the user set OPENBLAS_NUM_THREADS. Checked in fresh processes: the count is
process state. scipy-openblas32 is a dependency of gradflow, so these run everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = """
import ctypes
from gradflow.runtime import blas
lib = ctypes.CDLL(blas.library_path())
lib.scipy_openblas_set_num_threads(ctypes.c_int(2))
print(blas.one_thread(), lib.scipy_openblas_get_num_threads())
"""


def _probe(env: dict[str, str]) -> list[str]:
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_blas_runs_on_one_thread_by_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _probe(env) == ["True", "1"]


def test_a_users_openblas_thread_count_is_kept() -> None:
    assert _probe({**os.environ, "OPENBLAS_NUM_THREADS": "2"}) == ["False", "2"]
