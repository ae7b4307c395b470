"""Argument validation before any native call.

DaCe passes a raw pointer to the compiled code and checks neither dtype nor strides of a torch tensor: a
float64 tensor given for a float32 array is silently reinterpreted. Everything that reaches a native call in
gradflow has gone through `check_array` (or the code the C++ generator emits from the same `ArgSpec`), which
raises an `ArgumentError` that names the argument and what is wrong with it.

Checked: kind (array vs. number), dtype and byte order (a big-endian `>f8` array has dtype name
`float64` but its bytes would be misread), rank, every extent (constant, symbol, or expression of
symbols, with each symbol consistent across all arguments), device (CPU), layout (strided), strides
(element strides equal to the SDFG descriptor's, so a transposed or sliced tensor is caught), torch's lazy
negation / conjugation views (whose memory does not hold the logical values), and writability of the
numpy arrays the program writes (a read-only array or memmap would be written, or crash the process).
Scalars must be numbers and symbols integers.
"""

from __future__ import annotations

import ctypes
import numbers
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from gradflow.core.errors import ArgumentError, describe
from gradflow.runtime.plan import ARRAY, ArgSpec

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def dtype_name(array: Any) -> str:
    """The numpy-style dtype name of a torch tensor or numpy array."""
    if isinstance(array, torch.Tensor):
        return DTYPE_NAMES.get(array.dtype, str(array.dtype).replace("torch.", ""))
    return np.dtype(array.dtype).name


def element_strides(array: Any) -> tuple[int, ...]:
    if isinstance(array, torch.Tensor):
        return tuple(array.stride())
    item = array.dtype.itemsize
    return tuple(s // item for s in array.strides)


def data_pointer(array: Any) -> int:
    """The address of the first element (no copy). For a writable C-contiguous numpy array (the common
    argument) through its buffer, 0.4 microseconds; numpy's `__array_interface__` builds a dict per call,
    1.75 microseconds, a twelfth of a small gradient's call (lse at n = 2500) for each array."""
    if isinstance(array, torch.Tensor):
        return array.data_ptr()
    try:
        return _address_of(_first_byte(array))
    except (TypeError, ValueError, BufferError):  # read-only, not C-contiguous, or empty
        return int(array.__array_interface__["data"][0])


_address_of, _first_byte = ctypes.addressof, ctypes.c_char.from_buffer


def _fail(name: str, problem: str, hint: str = "") -> ArgumentError:
    return ArgumentError(f"argument '{name}': {problem}", hint)


def infer_symbols(
    given: Sequence[tuple[ArgSpec, Sequence[int]]],
    needed: Iterable[str],
    fixed: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Symbol values from the shapes of the given arrays; every extent is then checked against them.

    `given` pairs each array's spec with the shape of the value passed for it. A symbol is fixed by the first
    dimension that is exactly that symbol; all other occurrences (and expressions) must agree.
    """
    symbols: dict[str, int] = dict(fixed or {})
    source: dict[str, str] = {k: "the symbols given" for k in symbols}
    for spec, shape in given:
        if len(shape) != spec.ndim:
            raise _fail(
                spec.name,
                f"expected {spec.ndim} dimension(s) of shape ({', '.join(d.py for d in spec.shape)}), "
                f"got {len(shape)} with shape {tuple(shape)}",
            )
        for axis, (dim, extent) in enumerate(zip(spec.shape, shape)):
            if dim.symbol is not None and dim.symbol not in symbols:
                symbols[dim.symbol] = int(extent)
                source[dim.symbol] = f"dimension {axis} of '{spec.name}'"
    missing = [s for s in needed if s not in symbols]
    if missing:
        raise ArgumentError(
            f"cannot infer the value of symbol(s) {', '.join(missing)} from the shapes of the arguments",
            "give them explicitly (symbols={...})",
        )
    for spec, shape in given:
        for axis, (dim, extent) in enumerate(zip(spec.shape, shape)):
            if any(f not in symbols for f in dim.free):
                continue  # a size the compiled program does not take (a tape sized by a loop bound it no
                # longer reads): nothing to check it against, and the program never reads it
            expected = dim.evaluate(symbols)
            if expected != int(extent):
                why = f" ({dim.symbol} = {symbols[dim.symbol]} from {source[dim.symbol]})" if dim.symbol else ""
                raise _fail(
                    spec.name,
                    f"dimension {axis} has extent {extent}, expected {dim.py} = {expected}{why}; "
                    f"shape ({', '.join(d.py for d in spec.shape)}) got {tuple(shape)}",
                )
    return symbols


def check_array(spec: ArgSpec, array: Any, symbols: Mapping[str, int], *, written: bool = False) -> None:
    """Raise `ArgumentError` unless `array` can be passed as `spec` without copy and without misreading
    (and, when the program writes it, be written)."""
    name = spec.name
    if spec.kind != ARRAY:
        raise _fail(name, f"is a {spec.kind}, not an array")
    if isinstance(array, torch.Tensor):
        if array.layout is not torch.strided:
            raise _fail(name, f"has layout {array.layout}; compiled SDFGs take dense (strided) tensors",
                        "call .to_dense() first")
        if array.device.type != "cpu":
            raise _fail(name, f"is on device {array.device}; this compiled SDFG runs on the CPU",
                        "move it with .cpu() first")
        if array.is_neg() or array.is_conj():
            raise _fail(name, "is a lazy negation/conjugation view whose memory does not hold its values",
                        "call .resolve_neg() / .resolve_conj() first")
    elif not isinstance(array, np.ndarray):
        raise _fail(name, f"expected a torch.Tensor or numpy.ndarray, got {type(array).__name__}")
    else:
        if not array.dtype.isnative:
            raise _fail(name, f"has non-native byte order (dtype '{array.dtype.str}'); its bytes would be misread",
                        f"convert it first: .astype(np.{spec.dtype})")
        if written and not array.flags.writeable:
            raise _fail(name, "is read-only (e.g. np.frombuffer of bytes, a read-only memmap), but the program "
                              "writes it", "pass a writable array (np.array(x) copies it)")
    got = dtype_name(array)
    if got != spec.dtype:
        raise _fail(name, f"expected dtype {spec.dtype}, got {got}",
                    f"convert it first (torch: .to(torch.{spec.dtype}), numpy: .astype(np.{spec.dtype})); "
                    "gradflow.torch.function(..., convert=True) converts floating inputs itself")
    shape = tuple(array.shape)

    def known(dims) -> tuple:  # None where the size reads a symbol the program does not take (infer_symbols)
        return tuple(d.evaluate(symbols) if all(f in symbols for f in d.free) else None for d in dims)

    expected_shape = known(spec.shape)
    if len(shape) != len(expected_shape) or any(e is not None and e != n for e, n in zip(expected_shape, shape)):
        raise _fail(name, f"expected shape {expected_shape}, got {shape}")
    strides = element_strides(array)
    expected = known(spec.strides)
    # strides of an array without elements address nothing (numpy gives some of them zero strides)
    if 0 not in shape and any(e is not None and e != s for e, s, n in zip(expected, strides, shape) if n > 1):
        raise _fail(name, f"has strides {strides} (in elements), the compiled SDFG expects {expected}",
                    "pass a contiguous copy (torch: .contiguous(), numpy: np.ascontiguousarray); "
                    "gradflow.torch.function(..., convert=True) copies inputs itself")


_INT_RANGES = {"int64": (-2**63, 2**63 - 1), "int32": (-2**31, 2**31 - 1), "int16": (-2**15, 2**15 - 1),
               "int8": (-2**7, 2**7 - 1), "uint8": (0, 2**8 - 1), "bool": (0, 1)}


def scalar_value(spec: ArgSpec, value: Any) -> Any:
    """The Python number to pass for a scalar argument: a number (numpy numbers, one-element numpy arrays
    and CPU tensors included) of a kind the scalar's dtype takes, and for an integer scalar within its
    range (ctypes would wrap it silently); else `ArgumentError`."""
    if type(value) in (float, int, bool):
        number = value
    elif isinstance(value, (np.generic, np.ndarray)) and np.size(value) == 1:
        number = value.item()
    elif isinstance(value, torch.Tensor) and value.numel() == 1 and value.layout is torch.strided \
            and value.device.type == "cpu":
        number = value.item()
    elif isinstance(value, numbers.Number):
        number = value
    else:
        raise _fail(spec.name, f"expected a number for the {spec.dtype} scalar, got {describe(value)}")
    kinds = (bool, int, float) if spec.dtype.startswith("float") else (bool, int)
    if not isinstance(number, kinds):
        raise _fail(spec.name, f"expected a number for the {spec.dtype} scalar, got {describe(value)}")
    low, high = _INT_RANGES.get(spec.dtype, (None, None))
    if low is not None and not low <= number <= high:
        raise _fail(spec.name, f"{number} does not fit the {spec.dtype} scalar")
    return number


def symbol_value(name: str, value: Any) -> int:
    """A symbol's value given by the caller: an integer (Python or numpy, or a one-element integer array or
    CPU tensor, as a trip count given as an argument was taken before it became a symbol), else
    `ArgumentError`."""
    if isinstance(value, np.ndarray) and value.size == 1 and np.issubdtype(value.dtype, np.integer):
        value = value.item()
    elif (isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type == "cpu"
          and not value.is_floating_point() and value.dtype != torch.bool):
        value = value.item()
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise ArgumentError(f"symbol '{name}' must be an int, got {describe(value)}")


_LIMITS = {"int32": 2**31 - 1, "int64": 2**63 - 1, "int16": 2**15 - 1, "int8": 2**7 - 1}


def check_symbol_range(symbols: Mapping[str, int], plans: Iterable[Any]) -> None:
    """Every symbol value must fit the C type the compiled SDFG takes it as (DaCe uses `int`)."""
    for plan in plans:
        for a in plan.args:
            if a.kind == "symbol" and a.name in symbols:
                limit = _LIMITS.get(a.dtype)
                value = int(symbols[a.name])
                if value < 0 or (limit is not None and value > limit):
                    raise ArgumentError(f"symbol '{a.name}' = {value} does not fit the compiled SDFG's "
                                        f"{a.dtype} (or is negative)")
