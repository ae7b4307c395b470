"""ONNX frontend tests run single-threaded kernels (2-core CI, pytest -n 2)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
