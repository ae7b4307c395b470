"""Calling a compiled SDFG with numpy arrays or torch tensors, by position or by name.

Binds arguments to the SDFG's array arguments, infers symbols from shapes (checking that every argument
agrees), validates dtype and layout before the native call (DaCe itself would silently reinterpret a
float64 buffer as float32), and allocates the arrays the caller left out.
"""

from __future__ import annotations

from typing import Any

import dace
import numpy as np
import sympy

from gradflow.core.errors import ArgumentError
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg


def _to_numpy(value: Any, name: str) -> tuple[np.ndarray, bool]:
    if isinstance(value, np.ndarray):
        return value, False
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ArgumentError(f"argument '{name}' is on {value.device}; this program runs on the CPU")
        return value.detach().numpy(), True
    if isinstance(value, (int, float, np.number)):
        return np.asarray(value), False
    raise ArgumentError(f"argument '{name}' is a {type(value).__name__}; expected a numpy array or torch tensor")


class Invoker:
    """Bind, validate and call a compiled SDFG (compiled lazily, once, through the content cache)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        sdfg = graph.sdfg
        self.arrays = {n: d for n, d in sdfg.arrays.items() if not d.transient}
        self.order = [n for n in sdfg.arg_names if n in self.arrays]
        self.symbols = sorted(str(s) for s in sdfg.free_symbols)
        self._compiled = None

    def bind(self, args: tuple, kwargs: dict) -> tuple[dict[str, np.ndarray], dict[str, int], bool]:
        if len(args) > len(self.order):
            raise ArgumentError(f"{len(args)} positional arguments given; the program takes {self.order}")
        given = dict(zip(self.order, args))
        for k, v in kwargs.items():
            if k in given:
                raise ArgumentError(f"argument '{k}' given both by position and by name")
            if k not in self.arrays and k not in self.symbols:
                raise ArgumentError(f"unknown argument '{k}'; the program takes {self.order + self.symbols}")
            given[k] = v
        symbols: dict[str, int] = {s: int(given.pop(s)) for s in list(given) if s in self.symbols}
        arrays: dict[str, np.ndarray] = {}
        as_torch = False
        for name, value in given.items():
            arr, is_torch = _to_numpy(value, name)
            as_torch |= is_torch
            desc = self.arrays[name]
            expected = desc.dtype.as_numpy_dtype()
            if arr.dtype != expected:
                raise ArgumentError(f"argument '{name}' has dtype {arr.dtype}; the program expects {expected}",
                                    f"convert it first, e.g. .astype(np.{expected})")
            shape = tuple(desc.shape)
            if arr.ndim != len(shape) and not (arr.size == 1 and desc.total_size == 1):
                raise ArgumentError(f"argument '{name}' has shape {arr.shape}; the program expects {shape}")
            if arr.ndim == len(shape):
                for dim, (actual, formal) in enumerate(zip(arr.shape, shape)):
                    formal = sympy.sympify(formal)
                    if formal.is_Symbol and str(formal) not in symbols:
                        symbols[str(formal)] = actual
            if not arr.flags.c_contiguous:
                raise ArgumentError(f"argument '{name}' is not C-contiguous", "pass np.ascontiguousarray(...)")
            arrays[name] = arr
        for name, arr in arrays.items():
            desc = self.arrays[name]
            want = tuple(int(sympy.sympify(s).subs(symbols)) if not isinstance(s, int) else s for s in desc.shape)
            if arr.size != int(np.prod(want)) or (arr.ndim == len(want) and arr.shape != want):
                raise ArgumentError(f"argument '{name}' has shape {arr.shape}; with {symbols or 'no symbols'} the "
                                    f"program expects {want}")
        missing_symbols = [s for s in self.symbols if s not in symbols]
        if missing_symbols:
            raise ArgumentError(f"cannot infer symbol(s) {missing_symbols} from the arguments; pass them by name")
        for name, desc in self.arrays.items():
            if name not in arrays:
                shape = tuple(int(sympy.sympify(s).subs(symbols)) for s in desc.shape)
                arrays[name] = np.zeros(shape, dtype=desc.dtype.as_numpy_dtype())
        return arrays, symbols, as_torch

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[dict[str, np.ndarray], bool]:
        arrays, symbols, as_torch = self.bind(args, kwargs)
        if self._compiled is None:
            self._compiled = compile_sdfg(self.graph)
        # Layout and dtype were validated above, so arrays that view other memory (torch tensors seen
        # through numpy) are safe to pass without the copy DaCe would otherwise demand.
        with dace.config.set_temporary("compiler", "allow_view_arguments", value=True):
            self._compiled(**arrays, **symbols)
        return arrays, as_torch

