"""Normalization pass `bound_transient_shapes`: transients sized by loop variables get a fixed size.

DaCe's frontend gives a temporary inside a loop the size of what it holds in that iteration
(`A[:i + 1] * A[i]` makes a transient of shape `(i + 1,)`), allocated anew in every iteration. Reverse
mode needs such arrays outside the iteration that made them: working copies and gradient buffers are
allocated (and zeroed) once, before the backward sweep, where `i` has no value, and the backward sweep
reads what the last iteration left. This pass gives each such transient the upper bound of its extents
over the loops (exact for the affine bounds of counted loops, triangular nests included, see
`analysis/loops.upper_bound`), and lifetime `SDFG` so that it is allocated once and outlives the loop.
Every access keeps its subset, so the program computes the same values; strides follow the new shape.
A transient whose extents cannot be bounded is left as it is (reverse mode then reports it if it matters).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace import symbolic
from dace.sdfg.state import LoopRegion

from gradflow.analysis.loops import counted_loop, upper_bound
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass


def _loop_intervals(sdfg: dace.SDFG) -> dict[str, tuple]:
    """Value ranges of the variables of the counted loops of `sdfg` (its own control flow)."""
    intervals = {}
    for block in sdfg.all_control_flow_blocks():
        if isinstance(block, LoopRegion):
            assigned = {k for e in block.all_interstate_edges() for k in e.data.assignments}
            form = counted_loop(block, frozenset(assigned))
            if form is not None:
                intervals[form.var] = form.interval()
    return intervals


def _bounded(shape, intervals) -> tuple | None:
    """`shape` with every extent that depends on a loop variable replaced by its maximum, or None."""
    out, changed = [], False
    for extent in shape:
        expr = symbolic.pystr_to_symbolic(str(extent))
        free = {str(s) for s in getattr(expr, "free_symbols", ())}
        if not free & set(intervals):
            out.append(extent)
            continue
        bound = upper_bound(expr, intervals)
        if bound is None:
            return None
        out.append(bound if bound.free_symbols else max(int(bound), 0))
        changed = True
    return tuple(out) if changed else None


def loop_sized(sdfg: dace.SDFG) -> dict[str, tuple]:
    """Transient arrays of `sdfg` sized by loop variables -> their bounded shapes."""
    intervals = _loop_intervals(sdfg)
    if not intervals:
        return {}
    found = {}
    for name, desc in sdfg.arrays.items():
        if desc.transient and type(desc) is dace.data.Array:
            shape = _bounded(desc.shape, intervals)
            if shape is not None:
                found[name] = shape
    return found


@register_pass
@attrs.frozen
class BoundTransientShapes(RewritePass):
    """Give transients sized by loop variables their upper-bound size (see the module docstring)."""

    name: ClassVar[str] = "bound_transient_shapes"

    nested: ClassVar[bool] = False  # the top-level SDFG's transients

    def matches(self, sdfg: dace.SDFG) -> list[tuple[str, tuple]]:
        return list(loop_sized(sdfg).items())

    def rewrite(self, sdfg: dace.SDFG, match: tuple[str, tuple]) -> None:
        name, shape = match
        desc = sdfg.arrays[name]
        sdfg.arrays[name] = dace.data.Array(desc.dtype, shape, transient=True, storage=desc.storage,
                                            lifetime=dace.AllocationLifetime.SDFG)
