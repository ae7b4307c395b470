"""Compile C++ test code against the CBLAS shim every compiled SDFG includes (`runtime.blas`), as a small
shared library loaded into the test process (the shim's templates can then be called directly)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from gradflow.runtime import blas


def compile_probe(folder: Path, source: str) -> ctypes.CDLL:
    """`source` (which includes "gradflow_cblas.h") built with OpenMP into `folder` and loaded."""
    (folder / "probe.cpp").write_text(source)
    wheel_lib = Path(blas.library_path())
    subprocess.run(["g++", "-O2", "-fopenmp", "-shared", "-fPIC", "-o", str(folder / "probe.so"),
                    str(folder / "probe.cpp"), f"-I{blas._wheel().get_include_dir()}", f"-I{blas._shim_dir()}",
                    str(wheel_lib), f"-Wl,-rpath,{wheel_lib.parent}"], check=True, capture_output=True)
    loaded = ctypes.CDLL(str(folder / "probe.so"))
    blas.one_thread()
    return loaded
