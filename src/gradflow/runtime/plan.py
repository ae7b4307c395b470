"""The call plan: one frozen description of how a compiled SDFG is called.

A `CallPlan` lists the arguments of `__program_<name>` in the order of its C signature (the SDFG state
pointer comes first and is not listed), what kind each one is (array pointer, scalar by value, symbol by
value), its dtype, and its symbolic shape and strides. Every dispatcher reads this one record: the ctypes
fast path (`gradflow.runtime.calling`), the argument validation (`gradflow.runtime.validate`) and the C++
torch extension generator (`gradflow.torch.cpp`), so they cannot disagree about the calling convention.

The plan is derived from the SDFG the library was compiled from, in exactly the order DaCe itself uses
(`SDFG.arglist()` / `signature_arglist()`; the init function takes the free symbols in that order).
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any, Mapping

import attrs
import dace
import numpy as np
import sympy
from dace import data as dt
from dace import symbolic

from gradflow.analysis.writes import written
from gradflow.core.errors import InvalidArgumentError

ARRAY = "array"
SCALAR = "scalar"
SYMBOL = "symbol"

#: dace dtype name -> (numpy dtype name, C type); the dtypes a plan may carry.
_SUPPORTED = {
    "float64": "double", "float32": "float", "float16": "dace::float16",
    "int64": "int64_t", "int32": "int", "int16": "short", "int8": "char", "uint8": "unsigned char",
    "bool": "bool",
}


#: the functions SymPy and DaCe print in extents (`ceiling(N/2)` of a strided slice, `int_floor(N - 1, 2)`)
_FUNCTIONS = {"__builtins__": {}, "Min": min, "Max": max, "ceiling": math.ceil, "floor": math.floor,
              "int_floor": lambda a, b: a // b, "int_ceil": lambda a, b: -(-a // b), "Mod": lambda a, b: a % b,
              "Abs": abs}


@attrs.frozen
class Dim:
    """One symbolic extent or stride: its Python text (evaluable with symbol values) and its C++ text."""

    py: str
    cpp: str
    #: the symbol this dimension *is* (a bare symbol), else None: dims like this fix a symbol's value.
    symbol: str | None = None
    #: the value when the dimension is a constant, else None.
    const: int | None = None
    #: the symbols the expression reads (sorted)
    free: tuple[str, ...] = ()

    @classmethod
    def of(cls, expr: Any) -> "Dim":
        expr = symbolic.pystr_to_symbolic(expr) if isinstance(expr, str) else expr
        if symbolic.issymbolic(expr) and hasattr(expr, "replace"):
            # DaCe's compilation rewrites integer powers as `ipow(a, n)`: one spelling, so plans compare.
            expr = expr.replace(lambda e: type(e).__name__ == "ipow", lambda e: sympy.Pow(*e.args))
        if symbolic.issymbolic(expr):
            sym = str(expr) if isinstance(expr, symbolic.symbol) or getattr(expr, "is_Symbol", False) else None
            free = tuple(sorted(str(f) for f in expr.free_symbols))
            return cls(py=str(expr), cpp=symbolic.symstr(expr, cpp_mode=True), symbol=sym, free=free)
        value = int(expr)
        return cls(py=str(value), cpp=str(value), const=value)

    def evaluate(self, symbols: Mapping[str, int]) -> int:
        if self.const is not None:
            return self.const
        if self.symbol is not None:
            return int(symbols[self.symbol])
        return int(eval(self.py, _FUNCTIONS, dict(symbols)))  # noqa: S307


@attrs.frozen
class ArgSpec:
    """One argument of `__program_<name>` (after the state pointer)."""

    name: str
    kind: str  # ARRAY, SCALAR or SYMBOL
    dtype: str  # numpy dtype name
    ctype: str  # C type of the element (arrays) or of the value (scalars, symbols)
    shape: tuple[Dim, ...] = ()
    strides: tuple[Dim, ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def ctypes_type(self) -> Any:
        """The ctypes type the argument is passed as (arrays: an address)."""
        if self.kind == ARRAY:
            return ctypes.c_void_p
        return np.ctypeslib.as_ctypes_type(np.dtype(self.dtype))

    def default_strides(self) -> bool:
        """True when the strides are the C-contiguous ones of the shape."""
        expected = []
        acc = "1"
        for dim in reversed(self.shape):
            expected.append(acc)
            acc = f"({acc})*({dim.py})"
        expected.reverse()
        if len(expected) != len(self.strides):
            return False
        try:
            return all(
                symbolic.pystr_to_symbolic(s.py) == symbolic.pystr_to_symbolic(e)
                for s, e in zip(self.strides, expected)
            )
        except (sympy.SympifyError, SyntaxError, TypeError, ValueError):  # unparsable: treated as custom
            return False


@attrs.frozen
class CallPlan:
    """How to call one compiled SDFG: its entry points and arguments in C signature order."""

    sdfg_name: str
    args: tuple[ArgSpec, ...]
    #: names of the arguments passed (in this order) to `__dace_init_<name>`: the free symbols.
    init_args: tuple[str, ...]
    #: the array arguments the program writes (sorted): what it is given for them must be writable
    writes: tuple[str, ...] = ()

    @property
    def program_symbol(self) -> str:
        return f"__program_{self.sdfg_name}"

    @property
    def init_symbol(self) -> str:
        return f"__dace_init_{self.sdfg_name}"

    @property
    def exit_symbol(self) -> str:
        return f"__dace_exit_{self.sdfg_name}"

    def arg(self, name: str) -> ArgSpec:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    @functools.cached_property  # (read on every call)
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    @functools.cached_property  # (read on every call)
    def arrays(self) -> tuple[ArgSpec, ...]:
        return tuple(a for a in self.args if a.kind == ARRAY)

    @functools.cached_property  # (read on every call)
    def symbols(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.kind == SYMBOL)

    def c_signature(self) -> str:
        """The parameter list of `__program_<name>` after the state pointer, as C++ text."""
        return ", ".join(f"{a.ctype}*" if a.kind == ARRAY else a.ctype for a in self.args)


def _dtype_name(desc: dt.Data, where: str) -> tuple[str, str]:
    name = np.dtype(desc.dtype.as_numpy_dtype()).name
    if name not in _SUPPORTED:
        raise InvalidArgumentError(
            f"{where} has dtype {desc.dtype}, which gradflow cannot pass to a compiled SDFG",
            f"supported dtypes: {', '.join(_SUPPORTED)}",
        )
    return name, _SUPPORTED[name]


def positional_names(sdfg: dace.SDFG, plan: CallPlan) -> list[str]:
    """The names positional arguments bind to: the program's declared arguments, a trip count declared as
    one and made a symbol (`count_arguments_to_symbols`) included (an SDFG without `arg_names` takes names
    only)."""
    return [n for n in sdfg.arg_names if n in plan.names]


def plan_for(sdfg: dace.SDFG) -> CallPlan:
    """The call plan of an SDFG, in the argument order of the library DaCe generates for it."""
    arglist = sdfg.arglist()
    order = sdfg.signature_arglist(with_types=False, arglist=arglist)
    free = set(map(str, sdfg.free_symbols))
    args = []
    for name in order:
        desc = arglist[name]
        where = f"argument '{name}' of SDFG '{sdfg.name}'"
        if isinstance(desc, dt.Array) and not isinstance(desc, (dt.View, dt.Reference)):
            if any(symbolic.issymbolic(o) or int(o) != 0 for o in (*desc.offset, desc.start_offset)):
                raise InvalidArgumentError(f"{where} has a non-zero offset {desc.offset}; gradflow cannot call it")
            dtype, ctype = _dtype_name(desc, where)
            args.append(ArgSpec(
                name, ARRAY, dtype, ctype,
                tuple(Dim.of(s) for s in desc.shape), tuple(Dim.of(s) for s in desc.strides),
            ))
        elif isinstance(desc, dt.Scalar):
            dtype, ctype = _dtype_name(desc, where)
            kind = SYMBOL if name in sdfg.symbols and name not in sdfg.arrays else SCALAR
            args.append(ArgSpec(name, kind, dtype, ctype))
        else:
            raise InvalidArgumentError(
                f"{where} is a {type(desc).__name__}; gradflow calls SDFGs with arrays, scalars and symbols only"
            )
    init_args = tuple(a.name for a in args if a.name in free)
    writes = tuple(sorted(written(sdfg) & {a.name for a in args if a.kind == ARRAY}))
    return CallPlan(sdfg.name, tuple(args), init_args, writes)
