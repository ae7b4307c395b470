"""torch's own convolution for the float32 convolutions of programs a torch model runs through.

gradflow's convolution kernels (`runtime/conv_kernels.h`) unfold each image into a matrix and multiply;
torch's CPU convolution (oneDNN) convolves directly. Which is faster depends on the shape and on the
machine: on one host a 16-channel ResNet block's convolutions took 1.9 ms through torch where the kernels
took 2.9-3.4 ms, while ResNet-18's 64-512 channel layers measured alike; on an AVX-512 AMD host those
layers took 0.37-0.59 of the kernels' time through torch and a 3-channel stem 2.4x. So when a `Function`
is made of programs with convolutions (a torch model with a `Conv2d` through `gradflow.torch.compile`),
`aten_conv.cpp` is built (once per torch version, in the cache) and loaded with RTLD_GLOBAL; the kernels
look it up with dlsym and hand it float32 NCHW convolutions run outside a parallel region (`routed` in
`conv_kernels.h`) as GRADFLOW_CONV says:

- `auto` (default): the first call of each (operation, shape, thread count) in the process times both
  routes and the faster computes it from then on (as `torch.backends.cudnn.benchmark` does for cuDNN's
  algorithms): the two round differently in float32, so two processes may differ at that level;
- `torch`: torch computes every one it can (deterministic);
- `own`: gradflow's kernels compute all of them.

`routes()` lists the routes taken so far.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from pathlib import Path

import dace
import torch

from gradflow.core.environment import env_choice
from gradflow.core.errors import CompilationError, InvalidArgumentError
from gradflow.library import convolution as nodes
from gradflow.runtime.compile import usable_cache_root

#: the values of GRADFLOW_CONV, in the order of aten_conv.cpp's modes
CONV_CHOICES = ("own", "torch", "auto")
#: the kernels' operations, by their number in aten_conv.cpp
OPERATIONS = ("forward", "grad_input", "grad_weights")
#: the shape values of a route, as `runtime/conv_kernels.h`'s `Shape` names them
SHAPE_FIELDS = ("N", "C", "H", "W", "M", "KH", "KW", "OH", "OW", "SH", "SW", "DH", "DW", "PH", "PW")
_SOURCE = Path(__file__).with_name("aten_conv.cpp")
_LOCK = threading.Lock()
_LOADED: list[ctypes.CDLL] = []


def conv_choice() -> str:
    """GRADFLOW_CONV (default "auto"); an unknown value is an `InvalidArgumentError`."""
    return env_choice("GRADFLOW_CONV", CONV_CHOICES, "auto")


def has_convolutions(*sdfgs: dace.SDFG) -> bool:
    return any(isinstance(n, nodes.NODES) for sdfg in sdfgs for n, _ in sdfg.all_nodes_recursive())


def use_torch_convolutions(*sdfgs: dace.SDFG) -> bool:
    """Load torch's convolution for the kernels if `sdfgs` have convolution nodes and GRADFLOW_CONV is not
    "own", and set its mode from GRADFLOW_CONV (for the whole process); whether it is loaded."""
    choice = conv_choice()
    if choice != "own" and has_convolutions(*sdfgs):
        load()
    if _LOADED:
        set_mode(choice)
    return bool(_LOADED)


def load() -> None:
    """Build (if needed) and load torch's convolution for the kernels of this process, whatever
    GRADFLOW_CONV says (`use_torch_convolutions` is the switch that reads it)."""
    with _LOCK:
        if not _LOADED:
            library = ctypes.CDLL(str(_build()), mode=ctypes.RTLD_GLOBAL)
            library.gradflow_aten_conv2d_calls.restype = ctypes.c_long  # set once, not at every count
            library.gradflow_aten_conv2d_routes.restype = ctypes.c_long
            _LOADED.append(library)


def torch_calls() -> int:
    """How many convolution kernel calls torch has computed in this process (0 while it is not loaded)."""
    return int(_LOADED[0].gradflow_aten_conv2d_calls()) if _LOADED else 0


def set_mode(choice: str) -> None:
    """Route the kernels' convolutions as GRADFLOW_CONV's `choice` says, from their next call on (for the
    whole process; nothing to do while torch's convolution is not loaded)."""
    if choice not in CONV_CHOICES:
        raise InvalidArgumentError(f"the convolution route is {choice!r}", f"use one of {', '.join(CONV_CHOICES)}")
    if _LOADED:
        _LOADED[0].gradflow_aten_conv2d_set_mode(ctypes.c_int(CONV_CHOICES.index(choice)))


def routes() -> list[dict]:
    """The routes recorded so far under "auto": one per (operation, shape, thread count), with its shape
    as the kernels' `Shape` names it and `torch` True where torch computes it."""
    if not _LOADED:
        return []
    count = _LOADED[0].gradflow_aten_conv2d_routes(None, ctypes.c_long(0))
    rows = (ctypes.c_long * (18 * count))()
    count = min(count, _LOADED[0].gradflow_aten_conv2d_routes(rows, ctypes.c_long(count)))
    return [{"operation": OPERATIONS[rows[18 * k]], **dict(zip(SHAPE_FIELDS, rows[18 * k + 1:18 * k + 16])),
             "threads": rows[18 * k + 16], "torch": bool(rows[18 * k + 17])} for k in range(count)]


def forget_routes() -> None:
    """Drop the recorded routes: the next call of each shape times both again (for benchmarks)."""
    if _LOADED:
        _LOADED[0].gradflow_aten_conv2d_forget()


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
