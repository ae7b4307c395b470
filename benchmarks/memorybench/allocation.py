"""Memory a compiled fwd+bwd SDFG allocates: counted from its data descriptors, and measured as peak RSS.

*Counted* (`allocated_bytes`): every transient array and scalar of the SDFG and of its nested SDFGs (views and
references excluded: they allocate nothing), its size evaluated at the benchmark's symbols, by category of
name: the tape stacks (`gradflow_tape_*`, the per-overwrite stacks and the stack tops), the buffers of
recomputed values (`gradflow_re_*`), gradient buffers of intermediate arrays (`gradflow_g_*`), working copies
of inputs the program overwrites (`gradflow_work_*`), and the program's own temporaries (everything else; the
forward's temporaries, which the backward reads when they are kept, are here). A nested SDFG's transients are
counted once, with its symbols mapped from the outer ones; where DaCe allocates them per iteration of an
enclosing map (one thread here) they exist once at a time. A size that still depends on a symbol the outer
sizes do not fix (a map parameter) is reported in `unresolved` and not summed. The program's arguments
(inputs, outputs, gradients) are not counted: the caller owns them.

*Measured* (`peak_rss`, run in a fresh process by `memory.py --rss`): the arguments are loaded first (their
pages touched), then Linux's high-water mark is reset (`/proc/self/clear_refs` with 5) and the SDFG's state is
initialised (DaCe allocates persistent transients there), then reset again and one fwd+bwd call is made.
`VmHWM` after each step minus `VmRSS` before it is the peak increase; it counts pages actually touched (a
stack sized for a loop bound but filled halfway counts halfway), plus whatever the runtime allocates on first
use (OpenMP, BLAS buffers). `MALLOC_MMAP_THRESHOLD_` is fixed in the worker so that large allocations are
fresh mappings, and freed heap memory is returned (`malloc_trim`) before each reset, so that no allocation
reuses memory that is already resident.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import dace
import numpy as np
import sympy
from dace import data as dt
from dace.sdfg import nodes as nd

CATEGORIES = (("tape", "gradflow_tape_"), ("recomputed", "gradflow_re_"), ("gradient buffers", "gradflow_g_"),
              ("working copies", "gradflow_work_"))
OTHER = "temporaries"
#: glibc: allocations of at least this many bytes are separate mappings, returned to the system when freed
MMAP_THRESHOLD = 64 * 1024


@dataclasses.dataclass
class Allocation:
    by_category: dict[str, int] = dataclasses.field(default_factory=dict)
    unresolved: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.by_category.values())

    def as_dict(self) -> dict:
        return {"total": self.total, "by_category": dict(self.by_category), "unresolved": list(self.unresolved)}


def category(name: str) -> str:
    return next((label for label, prefix in CATEGORIES if name.startswith(prefix)), OTHER)


def _value(expr, values: Mapping[str, int]):
    """`expr` at `values`: an int, or None when symbols remain."""
    sym = dace.symbolic.pystr_to_symbolic(str(expr)) if not isinstance(expr, (int, sympy.Basic)) else sympy.sympify(expr)
    sym = sym.subs({dace.symbolic.symbol(k): v for k, v in values.items()})
    return None if getattr(sym, "free_symbols", None) else int(sympy.ceiling(sym))


def allocated_bytes(sdfg: dace.SDFG, symbols: Mapping[str, int]) -> Allocation:
    """Bytes of the transients `sdfg` and its nested SDFGs allocate at `symbols`, by category."""
    out = Allocation({label: 0 for label, _ in CATEGORIES} | {OTHER: 0})
    _count(sdfg, {**{k: int(v) for k, v in symbols.items()}, **_constants(sdfg)}, out, "")
    return out


def _constants(sdfg: dace.SDFG) -> dict[str, int]:
    return {k: int(v) for k, v in sdfg.constants.items() if isinstance(v, (int, np.integer))}


def _count(sdfg: dace.SDFG, values: dict[str, int], out: Allocation, where: str) -> None:
    for name, desc in sdfg.arrays.items():
        if not desc.transient or isinstance(desc, (dt.View, dt.Reference)):
            continue
        size = _value(desc.total_size * desc.dtype.bytes, values)
        if size is None:
            out.unresolved.append(f"{where}{name}: {desc.total_size * desc.dtype.bytes}")
        else:
            out.by_category[category(name)] += size
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, nd.NestedSDFG) and node.sdfg.parent_sdfg is sdfg:
            inner = {k: v for k, v in ((k, _value(e, values)) for k, e in node.symbol_mapping.items())
                     if v is not None}
            _count(node.sdfg, {**inner, **_constants(node.sdfg)}, out, f"{where}{node.label}/")


# ------------------------------------------------------------------------------------------ measured RSS


def _status() -> dict[str, int]:
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                found[key] = int(rest.split()[0]) * 1024
    return found


def reset_peak() -> None:
    """Return freed heap memory to the system, then set the high-water mark to the current RSS (Linux 4.0+).
    Without the first step, memory freed before the measure (a MILP solve's, a build's: small blocks, below
    the mmap threshold, in glibc's heap) stays resident, and a measured call reusing it counts nothing: the
    transformer layer's 10% budget measured 0 bytes after planning at the call had freed 257 MB."""
    _trim()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim() -> None:
    """glibc's `malloc_trim(0)`: free pages of every arena go back to the system (no-op elsewhere)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


def rss_supported() -> str | None:
    """None when the peak RSS can be reset and read here, else why not."""
    try:
        reset_peak()
        _status()["VmHWM"]
    except (OSError, KeyError) as exc:
        return f"cannot reset/read the peak RSS: {exc}"
    return None


def peak_rss(kernel, symbols: Mapping[str, int], args: list) -> dict[str, int]:
    """Peak RSS increases (bytes) of initialising `kernel`'s state for `symbols` and of one call with `args`
    (see the module docstring); `init` + `call` is the increase over the RSS before both."""
    before = _status()["VmRSS"]
    reset_peak()
    handle = kernel.handle_for(symbols)
    init_peak = _status()["VmHWM"]
    ready = _status()["VmRSS"]
    reset_peak()
    kernel(handle, *args)
    call_peak = _status()["VmHWM"]
    return {"init": init_peak - before, "call": call_peak - ready, "total": max(init_peak, call_peak) - before,
            "baseline_rss": before}


def worker_env() -> dict[str, str]:
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
