"""Test-wide settings: one OpenMP thread per worker (tests run under pytest -n 2).

`gradflow.torch` (and so torch) is imported up front in every process, the xdist controller included:
the controller imports a warning's category module to show a warning a worker reports
(`torch.jit.TracerWarning`, `gradflow.torch.BatchSpecializationWarning`), and two such imports of torch
running at once in its threads fail half-way ("partially initialized module 'torch'").
"""

import os

os.environ["OMP_NUM_THREADS"] = "1"

import gradflow.torch  # noqa: E402,F401
