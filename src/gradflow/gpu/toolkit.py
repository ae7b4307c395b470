"""Where the CUDA compiler is.

Looked for in this order: `GRADFLOW_CUDA_HOME`, then `CUDA_HOME` / `CUDA_PATH` (a toolkit root holding
`bin/nvcc`), then `nvcc` on the PATH, then the `nvidia-cuda-nvcc` wheel (CUDA 13 installs it under
`site-packages/nvidia/cu13`; `pip install 'gradflow[cuda]'` brings it and the runtime and CCCL headers
DaCe's generated code includes). The wheel's `nvcc.profile` adds its own include folders, so the compiler
alone is enough to build generated code; nothing here needs a GPU or a driver.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import attrs

from gradflow.core.errors import GradflowError

_ENVIRONMENT = ("GRADFLOW_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")


@attrs.frozen(eq=False)
class CudaToolkitError(GradflowError):
    """No usable CUDA compiler was found (or the one named does not run)."""


@attrs.frozen
class CudaToolkit:
    nvcc: Path
    version: str  # as `nvcc --version` reports it, e.g. "13.5"
    origin: str  # where it was found: an environment variable's name, "PATH" or "wheel"


def _wheel_nvcc() -> Path | None:
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", ()):
        for candidate in sorted(Path(root).glob("cu*/bin/nvcc"), reverse=True):
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def _version(nvcc: Path, origin: str) -> str:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CudaToolkitError(f"the CUDA compiler {nvcc} (from {origin}) does not run: {exc}",
                               "install a CUDA toolkit, or `pip install 'gradflow[cuda]'`") from exc
    for word in out.replace(",", " ").split():
        if word[:1].isdigit() and "." in word and word.count(".") == 1:
            return word
    return "unknown"


def find_toolkit() -> CudaToolkit:
    """The CUDA compiler to build generated code with; `CudaToolkitError` naming where it looked if none."""
    for variable in _ENVIRONMENT:
        root = os.environ.get(variable)
        if root:
            nvcc = Path(root) / "bin" / "nvcc"
            if not os.access(nvcc, os.X_OK):
                raise CudaToolkitError(f"{variable}={root} has no bin/nvcc",
                                       f"point {variable} at a CUDA toolkit's root, or unset it")
            return CudaToolkit(nvcc, _version(nvcc, variable), variable)
    on_path = shutil.which("nvcc")
    if on_path:
        return CudaToolkit(Path(on_path), _version(Path(on_path), "PATH"), "PATH")
    wheel = _wheel_nvcc()
    if wheel is not None:
        return CudaToolkit(wheel, _version(wheel, "wheel"), "wheel")
    raise CudaToolkitError(
        f"no CUDA compiler: none of {', '.join(_ENVIRONMENT)} is set, `nvcc` is not on the PATH, and the "
        "`nvidia-cuda-nvcc` wheel is not installed",
        "`pip install 'gradflow[cuda]'` (the compiler as a wheel; no GPU needed to build), or set CUDA_HOME")
