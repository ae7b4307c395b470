"""Test-wide settings: one OpenMP thread per worker (tests run under pytest -n 2)."""

import os

os.environ["OMP_NUM_THREADS"] = "1"
