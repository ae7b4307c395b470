"""Element types: which ONNX types gradflow represents, how they are stored, and the typed error for the rest.

A logical element type is a numpy dtype. Types without a C++ type in DaCe but with a wider exact
superset are *stored* in that wider type (bfloat16 in float32, see `STORAGE`) and converted back at the
call boundary. Every other type (float8, float4, 2-/4-bit integers, strings, complex) and every
non-tensor value (sequence, optional, map) is rejected with an `UnsupportedTypeError` naming the type.
"""

from __future__ import annotations

import numpy as np
import onnx

from gradflow.frontend.onnx.errors import UnsupportedTypeError

#: Element types without a C++ type, stored (and computed) in a wider one; converted at the call boundary.
try:
    import ml_dtypes

    STORAGE = {np.dtype(ml_dtypes.bfloat16): np.dtype(np.float32)}
except ImportError:  # pragma: no cover
    STORAGE = {}

#: Element types the lowering handles (DaCe has C++ types for them, or they have a storage type).
SUPPORTED_DTYPES = frozenset(
    np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                          np.uint64, np.float16, np.float32, np.float64)
) | frozenset(STORAGE)

TYPE_HINT = (
    "gradflow represents tensors of bool, (u)int8-64, float16/32/64 and bfloat16 (computed in float32); "
    "convert the model's inputs, weights and casts to one of those"
)


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype an SDFG array of logical element type `dtype` has (bfloat16 -> float32)."""
    dtype = np.dtype(dtype)
    return STORAGE.get(dtype, dtype)


def type_name(elem_type: int) -> str:
    """ONNX's name of an element type (e.g. 'FLOAT8E4M3FN'), or its number when unknown."""
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


def elem_dtype(elem_type: int, what: str) -> np.dtype:
    """The numpy dtype of ONNX element type `elem_type`; `UnsupportedTypeError` naming it when gradflow has none.
    `what` says where the type occurs (e.g. "graph input 'x'", "the Cast target")."""
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        dtype = None
    if dtype not in SUPPORTED_DTYPES:
        name = type_name(elem_type)
        raise UnsupportedTypeError(f"{what} has element type {name}, which gradflow does not support", TYPE_HINT, name)
    return dtype


def check_dtype(dtype: np.dtype, what: str) -> np.dtype:
    """`dtype` (of a value met while lowering: an initializer, a constant) if supported, else the typed error."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        try:
            name = type_name(onnx.helper.np_dtype_to_tensor_dtype(dtype))
        except Exception:
            name = str(dtype)
        raise UnsupportedTypeError(f"{what} has element type {name}, which gradflow does not support", TYPE_HINT, name)
    return dtype


def input_dtype(vi: onnx.ValueInfoProto) -> np.dtype:
    """The element type of graph input `vi`; sequences, optionals and maps are rejected by kind."""
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        kind = (kind or "untyped").replace("_type", "")
        article = "an" if kind[0] in "aeiou" else "a"
        raise UnsupportedTypeError(
            f"graph input '{vi.name}' is {article} {kind} value, which gradflow does not support "
            "(it lowers tensors only)",
            "pass the elements as separate tensor inputs",
            kind,
        )
    return elem_dtype(vi.type.tensor_type.elem_type, f"graph input '{vi.name}'")
