"""torch's own convolution for the float32 convolutions of programs a torch model runs through.

gradflow's convolution kernels (`runtime/conv_kernels.h`) unfold each image into a matrix and multiply;
torch's CPU convolution (oneDNN) convolves directly. On a 16-channel ResNet block at one thread the
unfolding and folding alone took a quarter of gradflow's forward+backward time, and torch's convolution
forward plus both gradients took 1.9 ms where the kernels took 2.9-3.4 ms. So when a `Function` is made
of programs with convolutions (a torch model with a `Conv2d` through `gradflow.torch.compile`),
`aten_conv.cpp` is built (once per torch version, in the cache) and loaded with RTLD_GLOBAL: the kernels
look `gradflow_aten_conv2d` up with dlsym and hand it the float32 NCHW convolutions, run outside a parallel
region, of the shapes where it measured faster (`by_torch` in `conv_kernels.h`; others, and any that torch
refuses, stay with the kernels). `GRADFLOW_CONV=own` keeps the kernels for all of them.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from pathlib import Path

import dace
import torch

from gradflow.core.environment import env_choice
from gradflow.core.errors import CompilationError
from gradflow.library import convolution as nodes
from gradflow.runtime.compile import usable_cache_root

#: the values of GRADFLOW_CONV
CONV_CHOICES = ("torch", "own")
_SOURCE = Path(__file__).with_name("aten_conv.cpp")
_LOCK = threading.Lock()
_LOADED: list[ctypes.CDLL] = []


def conv_choice() -> str:
    """GRADFLOW_CONV (default "torch"); an unknown value is an `InvalidArgumentError`."""
    return env_choice("GRADFLOW_CONV", CONV_CHOICES, "torch")


def has_convolutions(*sdfgs: dace.SDFG) -> bool:
    return any(isinstance(n, nodes.NODES) for sdfg in sdfgs for n, _ in sdfg.all_nodes_recursive())


def use_torch_convolutions(*sdfgs: dace.SDFG) -> bool:
    """Load torch's convolution for the kernels if `sdfgs` have convolution nodes and GRADFLOW_CONV allows
    it; whether it is loaded."""
    if conv_choice() != "torch" or not has_convolutions(*sdfgs):
        return bool(_LOADED)
    load()
    return True


def load() -> None:
    """Build (if needed) and load torch's convolution for the kernels of this process, whatever
    GRADFLOW_CONV says (`use_torch_convolutions` is the switch that reads it)."""
    with _LOCK:
        if not _LOADED:
            library = ctypes.CDLL(str(_build()), mode=ctypes.RTLD_GLOBAL)
            library.gradflow_aten_conv2d_calls.restype = ctypes.c_long  # set once, not at every count
            _LOADED.append(library)


def torch_calls() -> int:
    """How many convolution kernel calls torch has computed in this process (0 while it is not loaded)."""
    return int(_LOADED[0].gradflow_aten_conv2d_calls()) if _LOADED else 0


def set_enabled(on: bool) -> None:
    """Whether the loaded convolution takes the calls the kernels hand it (off: they compute them; for
    comparing both routes in one process)."""
    if _LOADED:
        _LOADED[0].gradflow_aten_conv2d_enable(ctypes.c_int(int(on)))


def _build() -> Path:
    """The shared library of `aten_conv.cpp` for this torch, built into the cache if it is not there."""
    from torch.utils import cpp_extension

    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + torch.__version__.encode()).hexdigest()[:16]
    folder = usable_cache_root() / "torch_conv" / key
    folder.mkdir(parents=True, exist_ok=True)
    name = f"gradflow_aten_conv_{key}"
    try:
        path = cpp_extension.load(name=name, sources=[str(_SOURCE)], build_directory=str(folder),
                                  extra_cflags=["-O2", "-std=c++17"], is_python_module=False, verbose=False)
    except Exception as exc:  # ninja/compiler failures come as several exception types
        raise CompilationError(f"building torch's convolution for gradflow in {folder} failed: "
                               f"{type(exc).__name__}: {str(exc)[-2000:]}",
                               "set GRADFLOW_CONV=own to use gradflow's own convolution kernels") from exc
    return Path(path) if path else folder / f"{name}.so"
