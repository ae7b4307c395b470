"""The memory limit on one tensor, checked before anything is allocated.

A model can declare a tensor far larger than the machine (2^52 elements): DaCe would try to allocate it
and the process would abort in `std::bad_alloc`. Every tensor size is therefore checked against a limit
the user can raise: `load(..., max_tensor_bytes=N)`, else the environment variable
`GRADFLOW_MAX_TENSOR_BYTES`, else `DEFAULT_MAX_TENSOR_BYTES`. Sizes known while loading (declared shapes,
initializers, every array the lowering creates) are checked then; sizes that depend on input shapes are
checked at each call, once the symbols are bound.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

import numpy as np
import sympy

from gradflow.core.errors import InvalidArgumentError
from gradflow.frontend.onnx.errors import TensorTooLargeError

#: The environment variable that raises (or lowers) the limit.
ENV = "GRADFLOW_MAX_TENSOR_BYTES"

#: 16 GiB: larger than any tensor of the models gradflow is used with, smaller than what aborts a process.
DEFAULT_MAX_TENSOR_BYTES = 1 << 34

HINT = (f"if the model really needs it, raise the limit: gradflow.onnx.load(..., max_tensor_bytes=...) or the "
        f"environment variable {ENV}")


def max_tensor_bytes(given: int | None = None) -> int:
    """The limit in force: `given`, else `$GRADFLOW_MAX_TENSOR_BYTES`, else the default."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given <= 0:
            raise InvalidArgumentError(f"max_tensor_bytes must be a positive integer, got {given!r}")
        return int(given)
    text = os.environ.get(ENV)
    if text is None or not text.strip():
        return DEFAULT_MAX_TENSOR_BYTES
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidArgumentError(f"{ENV}={text!r} is not a positive integer (bytes)", f"e.g. {ENV}=34359738368")
    return value


def nbytes(shape: Iterable[int], dtype: np.dtype) -> int:
    """Bytes of a dense tensor (Python integers: no overflow however large the shape)."""
    count = 1
    for d in shape:
        count *= int(d)
    return count * np.dtype(dtype).itemsize


def check_static(shape: Iterable, dtype: np.dtype, what: str, limit: int) -> None:
    """Raise `TensorTooLargeError` when `shape` (integers, or SymPy expressions skipped until call time)
    needs more than `limit` bytes."""
    dims = list(shape)
    if not all(isinstance(d, (int, np.integer)) for d in dims):
        return
    size = nbytes(dims, dtype)
    if size > limit:
        raise TensorTooLargeError(f"{what} of shape {tuple(int(d) for d in dims)} needs {size} bytes, more than "
                                  f"the limit of {limit} bytes", HINT)


def check_bound(sizes: Mapping[str, tuple[sympy.Expr, int]], bindings: Mapping[str, int], limit: int) -> None:
    """At call time: each array's element count (a SymPy expression of the symbols) times its item size,
    with the symbols bound (by name), against the limit."""
    for name, (count, itemsize) in sizes.items():
        count = sympy.sympify(count)
        value = count.xreplace({s: sympy.Integer(bindings[s.name]) for s in count.free_symbols if s.name in bindings})
        if value.is_Integer and int(value) * itemsize > limit:
            raise TensorTooLargeError(
                f"with the shapes of this call, array '{name}' needs {int(value) * itemsize} bytes, more than the "
                f"limit of {limit} bytes", HINT)
