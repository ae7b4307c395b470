"""Normalization pass `count_arguments_to_symbols`: an integer scalar argument read only by control flow
becomes a symbol of the same name.

Users write trip counts as arguments (`def jacobi(A, B, T: dace.int64): for t in range(1, T): ...`). DaCe
keeps `T` a scalar data container that the loop condition reads, so to gradflow's analyses the loop's
count is "data": its tape cannot be sized before the loop runs (growable stacks) and a byte budget cannot
price it. Its value is known when the program is called, though, exactly like a size symbol's: as a
symbol, the loop is counted with a bound in the program's arguments, stacks are sized by it, and a planner
given the call's values prices it.

The rewrite is sound when the argument is never written and nothing but control-flow expressions
(interstate edges, loop headers, branch conditions) reads it: no access node of it exists in any state
of the program. Those expressions name it the same way before and after, and its value for the whole run
is the one the caller passed, which is what a symbol is. The argument keeps its place in `arg_names`, so
callers pass it by position or by name as before.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd

from gradflow.analysis.access import named_by_control
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass


def count_arguments(sdfg: dace.SDFG) -> list[str]:
    """The integer scalar arguments of `sdfg` that its control flow reads and no access node reads or writes,
    and that are not already symbols. (One nothing reads stays an argument: as a symbol, unused, it would
    leave the program's signature.)"""
    accessed = {n.data for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nd.AccessNode)}
    return sorted(name for name, desc in sdfg.arrays.items()
                  if isinstance(desc, dace.data.Scalar) and not desc.transient
                  and desc.dtype in dace.dtypes.INTEGER_TYPES and name not in accessed and name not in sdfg.symbols
                  and named_by_control(sdfg, name))


@register_pass
@attrs.frozen
class CountArgumentsToSymbols(RewritePass):
    """Integer scalar arguments read only by control flow become symbols (see the module docstring)."""

    name: ClassVar[str] = "count_arguments_to_symbols"
    nested: ClassVar[bool] = False  # a nested SDFG's scalars are its parent's data, passed in by memlets

    def matches(self, sdfg: dace.SDFG) -> list[str]:
        return count_arguments(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match: str) -> None:
        dtype = sdfg.arrays[match].dtype
        sdfg.remove_data(match, validate=False)
        sdfg.add_symbol(match, dtype)
