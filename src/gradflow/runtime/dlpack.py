"""Zero-copy exchange between torch tensors and the arrays DaCe reads, writes and allocates (DLPack).

- `to_torch(array)`: a numpy array (e.g. a return value DaCe allocated) as a torch tensor on the same memory.
- `to_numpy(tensor)`: a CPU torch tensor as a numpy array on the same memory.
- `call(compiled, **arrays)`: `CompiledSDFG.__call__` with torch tensors (validated first, passed as numpy
  views of their memory) whose DaCe-allocated return values come back as torch tensors on DaCe's memory.

Nothing here copies: tests compare `data_ptr()`s. The caller keeps the owner alive as usual (a DLPack
tensor holds a reference to the exporting object, so a tensor made from a DaCe array keeps it alive).
"""

from __future__ import annotations

from typing import Any

import dace
import numpy as np
import torch
from dace.codegen.compiled_sdfg import CompiledSDFG

from gradflow.core.errors import ArgumentError
from gradflow.runtime.plan import ARRAY, SYMBOL, plan_for
from gradflow.runtime.validate import check_array, infer_symbols


def to_torch(array: Any) -> torch.Tensor:
    """A torch tensor viewing the memory of any DLPack exporter (numpy arrays included)."""
    if isinstance(array, torch.Tensor):
        return array
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        raise ArgumentError("to_torch: the numpy array is read-only; torch tensors are always writable",
                            "pass a writable array (or np.array(x) to copy it)")
    return torch.from_dlpack(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array viewing the memory of a CPU torch tensor."""
    if tensor.device.type != "cpu":
        raise ArgumentError(f"to_numpy: tensor is on {tensor.device}, numpy views need CPU memory", ".cpu() it")
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_neg() or tensor.is_conj():
        raise ArgumentError("to_numpy: tensor is a lazy negation/conjugation view", ".resolve_neg() it first")
    return np.from_dlpack(tensor)


def call(compiled: CompiledSDFG, **arrays: Any) -> Any:
    """Call a compiled SDFG through DaCe's own `__call__`, with torch tensors in and torch tensors out.

    Every array argument is validated (dtype, shape, strides, device) before DaCe sees it; DaCe-allocated
    return values (`__return*`) are returned as torch tensors sharing DaCe's memory.
    """
    plan = plan_for(compiled.sdfg)
    given = [(a, tuple(arrays[a.name].shape)) for a in plan.arrays if a.name in arrays]
    fixed = {n: int(arrays[n]) for n in plan.symbols if n in arrays}
    symbols = infer_symbols(given, plan.symbols, fixed)
    converted = {}
    for name, value in arrays.items():
        spec = plan.arg(name) if name in plan.names else None
        if spec is not None and spec.kind == ARRAY:
            check_array(spec, value, symbols, written=name in plan.writes)
            converted[name] = to_numpy(value) if isinstance(value, torch.Tensor) else value
        elif spec is not None and spec.kind == SYMBOL:
            continue
        else:
            converted[name] = value.item() if isinstance(value, torch.Tensor) else value
    converted.update({n: v for n, v in symbols.items() if n in plan.names})
    # DLPack views have a `.base`; DaCe refuses such "views" unless told otherwise. The strides and layout
    # were checked above against the SDFG's descriptors, which is what that refusal protects.
    with dace.config.set_temporary("compiler", "allow_view_arguments", value=True):
        result = compiled(**converted)
    if result is None:
        return None
    if isinstance(result, tuple):
        return tuple(to_torch(r) for r in result)
    return to_torch(result)
