"""Symbols that hold values computed from data: DaCe's interstate assignments (`x = A[i]`), and the types
DaCe infers for them. Differentiation must see them: a floating-point symbol computed from an array that
depends on the inputs carries a derivative its readers would otherwise take for a constant."""

from __future__ import annotations

import re

import dace


def assigned_types(sdfg: dace.SDFG) -> dict[str, dace.typeclass]:
    """The type DaCe infers for every symbol assigned on an interstate edge of `sdfg` (int64 when it cannot
    tell). An edge's inference that cannot tell (`None`, e.g. for `sinh(t)`) leaves the type the SDFG
    declares: DaCe's frontend declares a scalar it turned into a symbol with the scalar's type (taking the
    `None` for int64 hid a float64 symbol computed from the inputs, whose gradient was then dropped)."""
    types: dict[str, dace.typeclass] = dict(sdfg.symbols)
    edges = list(sdfg.all_interstate_edges())
    for _ in range(2):  # a symbol may be assigned from one assigned on a later edge
        for edge in edges:
            for name, dtype in edge.data.new_symbols(sdfg, types).items():
                if isinstance(dtype, dace.typeclass) or name not in sdfg.symbols:
                    types[name] = dtype
    return {k: (v if isinstance(v, dace.typeclass) and v in _TYPES else dace.int64)
            for k, v in types.items() if any(k in e.data.assignments for e in edges)}


_TYPES = (dace.int8, dace.int16, dace.int32, dace.int64, dace.uint8, dace.uint16, dace.uint32, dace.uint64,
          dace.bool_, dace.float32, dace.float64)


def data_symbols(sdfg: dace.SDFG, varied: frozenset[str]) -> dict[str, str]:
    """Floating-point symbols assigned on interstate edges from arrays in `varied` (directly or through
    other such symbols) -> the array their value comes from."""
    types = assigned_types(sdfg)
    edges = [e for e in sdfg.all_interstate_edges() if e.data.assignments]
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for edge in edges:
            for name, expr in edge.data.assignments.items():
                if name in found or types.get(name) not in (dace.float32, dace.float64):
                    continue
                read = set(re.findall(r"[A-Za-z_]\w*", str(expr)))
                source = sorted(read & set(varied)) or sorted(found[s] for s in read & set(found))
                if source:
                    found[name] = source[0]
                    changed = True
    return found
