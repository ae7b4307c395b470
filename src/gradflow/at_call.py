"""Forwarding plans made when a differentiated function is called, for the sizes of that call.

A byte budget (`Forwarding.budget`) and a checkpoint schedule (`Forwarding.checkpoint`) are computed for
concrete trip counts and array sizes. `grad` and `vjp` return a program before anyone calls it, so they
need `sizes=`; the functions `value_and_grad` returns (and the torch dispatchers) know every size and every
trip count given as an argument when they are called. `AtCall` builds one differentiated program per set
of those values, on the first call that has them, and reuses it for every later call with the same values:
the user gives a budget and nothing else.

The values that key a plan are the program's symbols after `count_arguments_to_symbols`: the sizes (from
the shapes of the arrays passed) and the integer arguments that only control flow reads (trip counts,
given by position or by name). Values the user gave in `sizes=` are overridden by the call's: a budget is
a promise about the run it is used for.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import attrs

from gradflow.autodiff.forwarding import Forwarding
from gradflow.core.errors import ArgumentError
from gradflow.core.graph import Graph
from gradflow.core.passes import unwrap_or_raise
from gradflow.runtime.plan import plan_for, positional_names
from gradflow.runtime.validate import infer_symbols, symbol_value
from gradflow.transforms.count_arguments import CountArgumentsToSymbols

#: at most this many plans are kept per function (each holds a compiled program)
MAX_PLANS = 32


def plans_at_call(forwarding: Forwarding) -> bool:
    """Whether `forwarding` is computed for concrete sizes (a byte budget or checkpointing)."""
    return forwarding.max_bytes is not None or forwarding.snapshots is not None


class AtCall:
    """The builds of one differentiated function, by the call values that bound its forwarding plan.

    `build(forwarding)` makes whatever the function runs for a policy with those sizes (a differentiated
    program and its caller); `AtCall(...)(args, kwargs)` returns the build for the call's values."""

    def __init__(self, graph: Graph, forwarding: Forwarding, build: Callable[[Forwarding], Any],
                 order: Sequence[str] | None = None, fixed: Mapping[str, int] | None = None) -> None:
        """`order`: the names positional arguments bind to (default: the program's arguments); `fixed`:
        symbol values the caller gave once for all calls."""
        source = unwrap_or_raise(CountArgumentsToSymbols()(graph)).sdfg
        self.forwarding = forwarding
        self.plan = plan_for(source)
        self.order = list(order) if order is not None else positional_names(source, self.plan)
        self.fixed = dict(fixed or {})
        self._build = build
        #: call values (sorted (symbol, value) pairs) -> the build for them
        self.builds: dict[tuple[tuple[str, int], ...], Any] = {}

    def sizes(self, args: tuple, kwargs: dict) -> dict[str, int]:
        """The values of the program's symbols at this call: given by name or position (trip counts), or
        read from the shapes of the arrays passed. Arguments are not checked here beyond what that needs;
        the compiled program's caller checks them all."""
        if len(args) > len(self.order):
            raise ArgumentError(f"{len(args)} positional arguments given; the program takes {self.order} by "
                                "position", "pass the others by name")
        given = dict(zip(self.order, args))
        given.update(kwargs)
        symbols = self.plan.symbols
        fixed = {**{s: v for s, v in self.fixed.items() if s in symbols},
                 **{s: symbol_value(s, given[s]) for s in symbols if s in given}}
        arrays = [(spec, tuple(given[spec.name].shape)) for spec in self.plan.arrays
                  if hasattr(given.get(spec.name), "shape")]
        inferable = {d.symbol for spec, _ in arrays for d in spec.shape if d.symbol is not None}
        missing = [s for s in symbols if s not in fixed and s not in inferable]
        if missing:
            raise ArgumentError(f"the forwarding plan ({self.forwarding.name}) is made for the sizes of the call, "
                                f"and this call does not give {', '.join(repr(s) for s in missing)} (no array "
                                "passed has it as an extent)", f"pass {missing[0]}=... by name")
        return infer_symbols(arrays, symbols, fixed)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        key = tuple(sorted(self.sizes(args, kwargs).items()))
        found = self.builds.get(key)
        if found is None:
            if len(self.builds) >= MAX_PLANS:
                self.builds.pop(next(iter(self.builds)))
            policy = attrs.evolve(self.forwarding, sizes={**dict(self.forwarding.sizes), **dict(key)},
                                  planned_at_call=True)
            found = self.builds[key] = self._build(policy)
        return found
