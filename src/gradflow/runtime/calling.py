"""The fast call path: a compiled SDFG's entry points called through ctypes with prebuilt arguments.

`CompiledSDFG.__call__` rebuilds and type-converts its whole argument vector on every call (~90 us). Here a
`Kernel` binds `__program_<name>`, `__dace_init_<name>` and `__dace_exit_<name>` once, with ctypes argument
types taken from the `CallPlan`, so a call passes plain Python integers (tensor `data_ptr()`s and symbol
values) and costs about as much as `CompiledSDFG.fast_call`.

DaCe's state (persistent transients, symbol-sized allocations made at init) belongs to an init handle that
was created for particular symbol values, so a `Kernel` keeps one handle per tuple of init-symbol values and
finalizes all of them when it is collected. Calls on one kernel are serialised by a lock when the SDFG
keeps memory in its state (persistent/global transients), which concurrent calls must not share. A
`Runner` compiles its program with persistent temporaries (`optimize.persistent_transients`) and keeps the
handles of the last `MAX_HANDLES` sets of sizes it was called at (`Kernel.call_at`), so that a program
called at ever new sizes does not hold a set of temporaries for each.

`Runner` is the validated, general entry point for arrays by name (numpy or torch, zero-copy): it checks
every argument (`gradflow.runtime.validate`), infers the symbols, and caches per signature (shapes and
dtypes) everything that does not depend on the data pointers.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any, Mapping

import dace
import numpy as np
import torch
from dace.codegen.compiled_sdfg import CompiledSDFG

from gradflow.core.errors import ArgumentError, GradflowError
from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg
from gradflow.runtime.plan import ARRAY, SCALAR, SYMBOL, CallPlan, plan_for
from gradflow.runtime.validate import (
    check_array,
    check_symbol_range,
    data_pointer,
    infer_symbols,
    scalar_value,
    symbol_value,
)


#: state handles a `Runner` keeps per program (one per set of sizes; a stateful program's persistent
#: temporaries are allocated per handle)
MAX_HANDLES = 8

_STATEFUL = (dace.dtypes.AllocationLifetime.Persistent, dace.dtypes.AllocationLifetime.Global,
             dace.dtypes.AllocationLifetime.External)


def is_stateful(sdfg: dace.SDFG) -> bool:
    """True when the SDFG keeps memory in its DaCe state between calls (persistent, global or external
    transients): concurrent calls on one state handle must then be serialised."""
    return any(desc.transient and desc.lifetime in _STATEFUL for _, _, desc in sdfg.arrays_recursive())


def entry_point(compiled: CompiledSDFG, symbol: str) -> int:
    """The address of an exported function of the compiled library."""
    func = compiled._lib.get_symbol(symbol)  # noqa: SLF001 - DaCe exposes no public accessor
    return ctypes.cast(func, ctypes.c_void_p).value


def library_path(compiled: CompiledSDFG) -> str:
    """The file the compiled library was loaded from."""
    return compiled.filename


def _finalize_handles(exit_fn: Any, handles: dict, compiled: CompiledSDFG) -> None:
    # `compiled` is an argument only to keep its library loaded until every handle has been finalized.
    for handle in list(handles.values()):
        try:
            exit_fn(handle)
        except (TypeError, AttributeError, NameError, OSError):  # at interpreter shutdown ctypes may be gone
            pass
    handles.clear()


class Kernel:
    """`__program_<name>` and its init/exit pair, bound with the argument types of a `CallPlan`."""

    def __init__(self, compiled: CompiledSDFG, plan: CallPlan | None = None) -> None:
        self.compiled = compiled
        self.plan = plan if plan is not None else plan_for(compiled.sdfg)
        argtypes = [a.ctypes_type for a in self.plan.args]
        by_name = {a.name: a for a in self.plan.args}
        init_types = [by_name[n].ctypes_type for n in self.plan.init_args]
        self.program = ctypes.CFUNCTYPE(None, ctypes.c_void_p, *argtypes)(
            entry_point(compiled, self.plan.program_symbol))
        self._init = ctypes.CFUNCTYPE(ctypes.c_void_p, *init_types)(entry_point(compiled, self.plan.init_symbol))
        self._exit = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(entry_point(compiled, self.plan.exit_symbol))
        self._handles: dict[tuple, int] = {}
        self.lock = threading.Lock()
        #: False when the SDFG keeps nothing in its state between calls (no persistent, global or external
        #: transients): then concurrent calls on one handle are safe and need no lock
        self.stateful = is_stateful(compiled.sdfg)
        self._finalizer = weakref.finalize(self, _finalize_handles, self._exit, self._handles, compiled)

    def handle(self, init_values: tuple) -> int:
        """The state handle for these init-symbol values (created on first use)."""
        handle = self._handles.get(init_values)
        if handle is None:
            handle = self._init(*init_values)
            if not handle:
                raise GradflowError(f"initialising compiled SDFG '{self.plan.sdfg_name}' failed")
            self._handles[init_values] = handle
        return handle

    def call_at(self, init_values: tuple, *args: Any) -> None:
        """Call the program on the handle for `init_values`, keeping at most `MAX_HANDLES` handles of a
        stateful program: the least recently used one is finalized (its persistent memory freed) when a new
        one is made. Only for a kernel whose handles no one else holds (`Runner`'s own); the lookup and
        the call are under the lock, so no call runs on a handle being finalized."""
        if not self.stateful:
            self.program(self.handle(init_values), *args)
            return
        with self.lock:
            handles = self._handles
            handle = handles.pop(init_values, None)
            if handle is None:
                if len(handles) >= MAX_HANDLES:
                    self._exit(handles.pop(next(iter(handles))))
                handle = self.handle(init_values)
            else:
                handles[init_values] = handle  # most recently used last
            self.program(handle, *args)

    def handle_for(self, symbols: Mapping[str, int]) -> int:
        return self.handle(tuple(int(symbols[n]) for n in self.plan.init_args))

    def __call__(self, handle: int, *args: Any) -> None:
        """Call `__program_<name>(handle, *args)`; `args` in plan order (addresses and numbers)."""
        if self.stateful:
            with self.lock:
                self.program(handle, *args)
        else:
            self.program(handle, *args)

    def close(self) -> None:
        """Finalize every handle now (also done when the kernel is collected)."""
        self._finalizer()


def layout_key(value: Any) -> tuple:
    """Everything `check_array` looks at, as a hashable tuple (no evaluation, no allocation of numpy)."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.shape, value.stride(), value.layout, value.device, value.is_neg(),
                value.is_conj())
    if isinstance(value, np.ndarray):
        return (value.dtype, value.shape, value.strides, value.flags.writeable)  # dtype: byte order too
    return (type(value),)


def _with_persistent_transients(program: dace.SDFG | Graph) -> dace.SDFG | Graph:
    """The program with its tape stacks and the temporaries whose value on entry no call reads allocated
    once per state handle (`optimize.persistent_transients`): a `Runner` calls through a `Kernel`, which
    keeps one handle per set of sizes, so they always fit. A call no longer maps, page-faults and frees
    them (nb_durbin's row stack is 36 MB, k-means' product of points and centroids 80 MB)."""
    from gradflow.optimize.persistent_transients import PersistentTransients

    return PersistentTransients()(Graph.of(program)).unwrap()


class Runner:
    """A validated, zero-copy call of a compiled SDFG with numpy arrays or torch tensors by name.

    `runner(X=x, W=w, Y=y)`: arrays are passed by pointer (the SDFG reads and writes their memory), numbers
    for scalars, symbols inferred from the shapes (or given by name). A program given as an SDFG or graph
    is compiled with its tape stacks and temporaries persistent (`_with_persistent_transients`). Every
    array is checked first; the outcome of the checks is cached by the layout of the arguments (dtype,
    shape, strides, device, ...), so a repeated call with arrays of the same layout costs a dictionary
    lookup.
    """

    def __init__(self, program: Any) -> None:
        if isinstance(program, CompiledSDFG):
            compiled = program
        else:
            compiled = compile_sdfg(_with_persistent_transients(
                program if isinstance(program, (dace.SDFG, Graph)) else Graph.of(program)))
        self.kernel = Kernel(compiled)
        self.plan = self.kernel.plan
        self._arrays = self.plan.arrays
        self._names = frozenset(self.plan.names)
        #: layout key of the arguments -> (symbols, the init-symbol values that select the state handle)
        self._signatures: dict[tuple, tuple[dict, tuple]] = {}

    def __call__(self, **kwargs: Any) -> None:
        symbols, init_values = self.signature(kwargs)
        self.kernel.call_at(init_values, *self.arguments(kwargs, symbols))

    def signature(self, kwargs: Mapping[str, Any]) -> tuple[dict, tuple]:
        """(symbols, init-symbol values) of a call with `kwargs`, every argument checked the first time
        their layout is seen (`ArgumentError` otherwise)."""
        plan = self.plan
        if not self._names.issuperset(kwargs):
            unknown = sorted(set(kwargs) - self._names)
            raise ArgumentError(f"unknown argument(s) {', '.join(unknown)}; "
                                f"'{plan.sdfg_name}' takes {', '.join(plan.names)}")
        key = tuple(layout_key(kwargs[a.name]) if a.name in kwargs else None for a in self._arrays) \
            + tuple((n, kwargs[n]) for n in plan.symbols if n in kwargs)
        try:
            entry = self._signatures.get(key)
        except TypeError:  # an unhashable symbol value: `_signature` names it
            entry = None
        if entry is None:
            entry = self._signature(kwargs)
            if len(self._signatures) >= 256:
                self._signatures.clear()
            self._signatures[key] = entry
        return entry

    def arguments(self, kwargs: Mapping[str, Any], symbols: Mapping[str, int]) -> list:
        """The kernel's arguments in plan order: the arrays' addresses, the scalars, the symbols."""
        args = []
        for a in self.plan.args:
            if a.kind == ARRAY:
                args.append(data_pointer(kwargs[a.name]))
            elif a.kind == SCALAR:
                args.append(scalar_value(a, kwargs[a.name]))
            else:
                args.append(symbols[a.name])
        return args

    def _signature(self, kwargs: Mapping[str, Any]) -> tuple[dict, tuple]:
        """Check the arguments (first call with this layout): symbols and the init-symbol values."""
        plan = self.plan
        for a in self._arrays:
            value = kwargs.get(a.name)
            if a.name in kwargs and not isinstance(value, (torch.Tensor, np.ndarray)):
                check_array(a, value, {})  # raises: names the argument and what it got
        missing = [a.name for a in plan.args if a.kind != SYMBOL and a.name not in kwargs]
        if missing:
            raise ArgumentError(f"missing argument(s) {', '.join(missing)} of '{plan.sdfg_name}'")
        for a in plan.args:
            if a.kind == SCALAR:
                scalar_value(a, kwargs[a.name])
        fixed = {n: symbol_value(n, kwargs[n]) for n in plan.symbols if n in kwargs}
        symbols = infer_symbols([(a, tuple(kwargs[a.name].shape)) for a in self._arrays], plan.symbols, fixed)
        check_symbol_range(symbols, (plan,))
        writes = set(plan.writes)
        for a in self._arrays:
            check_array(a, kwargs[a.name], symbols, written=a.name in writes)
        return symbols, tuple(int(symbols[n]) for n in plan.init_args)

    def symbols_for(self, arrays: Mapping[str, Any], fixed: Mapping[str, int] | None = None) -> dict[str, int]:
        """The symbol values the given arrays (a subset of the arguments, by name) imply; every symbol of
        the SDFG must be determined by them or by `fixed`. The first array (in `arrays` order) whose extent is
        a symbol fixes it; a later one that disagrees is the one reported."""
        specs = {a.name: a for a in self._arrays}
        given = [(specs[n], tuple(v.shape)) for n, v in arrays.items() if n in specs]
        return infer_symbols(given, self.plan.symbols, fixed)
