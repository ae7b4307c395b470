"""Calling a compiled SDFG with numpy arrays or torch tensors, by position or by name.

`Invoker` only binds: positional arguments to the SDFG's arguments in declaration order, and arrays the
caller left out to new zero-filled ones (torch tensors when any argument is a torch tensor, else numpy
arrays). An array may be left out only when the program certainly overwrites all of it before reading any
of it, or does not touch it (`gradflow.analysis.writes.may_read_before_write`: outputs and gradient
buffers, typically); leaving out one the program may read (an input, or an output it accumulates into) is
an `ArgumentError` naming it, never a silent zero. Everything else, checking every argument (dtype,
shape, symbols, strides, device), inferring the symbols and the zero-copy native call, is
`gradflow.runtime.calling.Runner`: one set of checks and one fast call path for every way of running a
compiled SDFG in gradflow.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gradflow.analysis.writes import may_read_before_write, overwritten_before_read
from gradflow.core.errors import ArgumentError
from gradflow.core.graph import Graph
from gradflow.runtime.allocation import check_fits
from gradflow.runtime.calling import Runner, layout_key
from gradflow.runtime.plan import positional_names
from gradflow.runtime.validate import check_symbol_range, symbol_value, torch_dtype


def _one_element(value: Any, shape: tuple[int, ...]) -> Any:
    """A number, or a one-element array of another rank (e.g. 0-d), given for a one-element array: a
    view of it with the descriptor's shape (numbers become a new one-element array)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        size = value.numel() if isinstance(value, torch.Tensor) else value.size
        return value.reshape(shape) if size == 1 and tuple(value.shape) != shape else value
    if isinstance(value, (bool, int, float, np.number)):
        return np.asarray(value).reshape(shape)
    return value


def _allocate(shapes: tuple, as_torch: bool, unfilled: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Zero-filled arrays (torch tensors when `as_torch`) of the `(name, shape, dtype)` triples; those named
    in `unfilled` (arrays the program overwrites whole before reading) are left as allocated."""
    if as_torch:
        return {name: (torch.empty if name in unfilled else torch.zeros)(shape, dtype=torch_dtype(dtype))
                for name, shape, dtype in shapes}
    return {name: (np.empty if name in unfilled else np.zeros)(shape, dtype=dtype) for name, shape, dtype in shapes}


class Invoker:
    """Bind positional arguments and allocate omitted arrays, then call the SDFG through `Runner`
    (compiled lazily, once, through the content cache)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._runner: Runner | None = None
        self._allocatable: frozenset[str] | None = None
        self._unfilled: frozenset[str] | None = None
        #: (the names positional arguments bind to, the one-element arrays' (name, shape)), once per program
        self._binding: tuple[list[str], list[tuple[str, tuple]]] | None = None
        #: (arrays left out, shapes given, symbols given) -> the left-out arrays' (name, shape, dtype), checked
        self._allocations: dict[tuple, tuple] = {}
        #: `_call_key` of a call by name -> its `_Prepared` call
        self._prepared: dict[tuple, _Prepared] = {}

    @property
    def allocatable(self) -> frozenset[str]:
        """The array arguments the caller may leave out: those the program never reads before writing."""
        if self._allocatable is None:
            self._allocatable = frozenset(a.name for a in self.runner.plan.arrays
                                          if not may_read_before_write(self.graph.sdfg, a.name))
        return self._allocatable

    @property
    def unfilled(self) -> frozenset[str]:
        """The array arguments every run writes whole before reading any element
        (`analysis.writes.overwritten_before_read`): one left out is allocated without zero-filling it
        (at a million elements, filling costs a millisecond of page faults and writes)."""
        if self._unfilled is None:
            self._unfilled = frozenset(a.name for a in self.runner.plan.arrays
                                       if overwritten_before_read(self.graph.sdfg, a.name))
        return self._unfilled

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = Runner(self.graph)
        return self._runner

    def _bindings(self) -> tuple[list[str], list[tuple[str, tuple]]]:
        if self._binding is None:
            plan = self.runner.plan
            self._binding = (positional_names(self.graph.sdfg, plan),
                             [(spec.name, tuple(1 for _ in spec.shape)) for spec in plan.arrays
                              if all(d.const == 1 for d in spec.shape)])
        return self._binding

    def bind(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any], dict[str, int], bool]:
        """(arrays and scalars by name, symbols given by name, whether torch tensors were given)."""
        plan = self.runner.plan
        order, one_element = self._bindings()
        if len(args) > len(order):
            raise ArgumentError(f"{len(args)} positional arguments given; the program takes {order} by position",
                                "pass the others by name")
        given = dict(zip(order, args))
        for k, v in kwargs.items():
            if k in given:
                raise ArgumentError(f"argument '{k}' given both by position and by name")
            if k not in plan.names:
                if k in self.graph.sdfg.symbols and isinstance(v, (int, np.integer)):
                    continue  # a size the program declares but no longer uses (a backward sweep's loop bound)
                raise ArgumentError(f"unknown argument '{k}'; the program takes {order + list(plan.symbols)}")
            given[k] = v
        for name, value in given.items():
            if value is None:
                raise ArgumentError(f"argument '{name}' is None",
                                    "pass an array (or leave out an array the program only writes)")
        symbols = {s: symbol_value(s, given.pop(s)) for s in plan.symbols if s in given}
        as_torch = any(isinstance(v, torch.Tensor) for v in given.values())
        for name, shape in one_element:
            if name in given:
                given[name] = _one_element(given[name], shape)
        return given, symbols, as_torch

    def symbol_values(self, given: dict[str, Any], symbols: dict[str, int]) -> dict[str, int]:
        """Every symbol's value at a call: the ones given and the ones the given arrays' shapes fix
        (checked to be in range)."""
        runner = self.runner
        values = runner.symbols_for({n: v for n, v in given.items() if hasattr(v, "shape")}, symbols)
        check_symbol_range(values, (runner.plan,))
        return values

    def zeros(self, names: Any, values: dict[str, int], as_torch: bool = False) -> dict[str, Any]:
        """Zero-filled arrays for the program's array arguments among `names`, sized by the symbol `values`."""
        return _allocate(self._shapes(names, values), as_torch)

    def _shapes(self, names: Any, values: dict[str, int]) -> tuple:
        """(name, shape, dtype) of each array among `names`, sized by `values`, all checked to fit."""
        specs = [(spec, tuple(d.evaluate(values) for d in spec.shape)) for spec in self.runner.plan.arrays
                 if spec.name in names and all(f in values for d in spec.shape for f in d.free)]
        unsized = sorted(a.name for a in self.runner.plan.arrays if a.name in names
                         and any(f not in values for d in a.shape for f in d.free))
        if unsized:
            raise ArgumentError(f"argument(s) {', '.join(map(repr, unsized))} missing, and their sizes read symbols "
                                "the program does not take", "pass them")
        for spec, shape in specs:  # all checked before any is allocated
            check_fits(f"array '{spec.name}'", shape, spec.dtype, values)
        return tuple((spec.name, shape, spec.dtype) for spec, shape in specs)

    def _omitted_shapes(self, omitted: list, given: dict[str, Any], symbols: dict[str, int]) -> tuple:
        """`_shapes` of the arrays left out, remembered by what sizes them (the shapes and symbols given): a
        repeated call skips inferring the symbols and evaluating the shapes (tens of microseconds a call, as
        much as a small program runs)."""
        shapes = tuple((n, tuple(v.shape)) for n, v in given.items() if hasattr(v, "shape"))
        key: tuple | None = (tuple(a.name for a in omitted), shapes, tuple(sorted(symbols.items())))
        found: tuple | None = None
        try:
            found = self._allocations.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable symbol value: `symbol_values` names it
            key = None
        if found is None:
            found = self._shapes({a.name for a in omitted}, self.symbol_values(given, symbols))
            if key is not None:
                if len(self._allocations) >= 256:
                    self._allocations.clear()
                self._allocations[key] = found
        return found

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], bool]:
        """Run the SDFG; returns every array argument by name (the given ones and the allocated ones,
        written in place) and whether torch tensors were given."""
        key = None if args else _call_key(kwargs)
        if key is not None:
            prepared = self._prepared.get(key)
            if prepared is not None:
                return prepared(self.runner, kwargs)
        runner = self.runner
        given, symbols, as_torch = self.bind(args, kwargs)
        omitted = [a for a in runner.plan.arrays if a.name not in given]
        shapes: tuple = ()
        if omitted:
            reads = [a.name for a in omitted if a.name not in self.allocatable]
            if reads:
                raise ArgumentError(
                    f"argument(s) {', '.join(repr(n) for n in reads)} missing: the program may read them before "
                    "writing all of them, so gradflow does not allocate them",
                    "pass them (e.g. np.zeros(...) where zeros are meant); only arrays the program certainly "
                    "overwrites before reading (outputs, gradients) may be left out")
            shapes = self._omitted_shapes(omitted, given, symbols)
            given.update(_allocate(shapes, as_torch, self.unfilled))
        given.update(symbols)
        prepared = _Prepared(runner, shapes, self.unfilled, runner.signature(given), as_torch)
        result = prepared.run(runner, given)
        if key is not None and all(given[k] is v for k, v in kwargs.items() if k in given):
            if len(self._prepared) >= 256:
                self._prepared.clear()
            self._prepared[key] = prepared
        return result


def _call_key(kwargs: dict[str, Any]) -> tuple | None:
    """What decides every check and allocation of a call by name: each argument's name and layout
    (`calling.layout_key`: what the checks look at), a float's type, an integer's value (a symbol, or an
    integer scalar whose range is checked); None for anything else (such a call takes the checked path)."""
    key = []
    for name, value in kwargs.items():
        kind = type(value)
        if kind is np.ndarray or isinstance(value, torch.Tensor):
            key.append((name, *layout_key(value)))
        elif kind is int:
            key.append((name, value))
        elif kind is float:
            key.append((name, float))
        else:
            return None
    return tuple(key)


class _Prepared:
    """A call checked once (its symbols and state handle, what it allocates): `run` calls the kernel on
    arguments bound by name; called with the arguments of a later call of the same layout (`_call_key`),
    it allocates the arrays left out and runs, without binding, checking or inferring again. Only a call by
    name whose given values were used as they are (no reshaped one-element array, no symbol given as an
    array) is kept for later calls."""

    def __init__(self, runner: Runner, shapes: tuple, unfilled: frozenset[str], entry: tuple[dict, tuple],
                 as_torch: bool) -> None:
        self.symbols, self.init_values = entry
        self.shapes, self.unfilled, self.as_torch = shapes, unfilled, as_torch
        self.arrays = tuple(a.name for a in runner.plan.arrays)

    def run(self, runner: Runner, given: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Call the kernel on `given` (every argument by name); every array argument by name, and whether
        they are torch tensors."""
        runner.kernel.call_at(self.init_values, *runner.arguments(given, self.symbols))
        return {name: given[name] for name in self.arrays}, self.as_torch

    def __call__(self, runner: Runner, kwargs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return self.run(runner, {**kwargs, **_allocate(self.shapes, self.as_torch, self.unfilled)}
                        if self.shapes else kwargs)
