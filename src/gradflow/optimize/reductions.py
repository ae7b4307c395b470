"""`local_reductions`: reductions accumulate in a local variable, not through atomics.

DaCe expands a `Reduce` library node (what `np.sum`, `np.max`, `x.sum(axis=...)` become) by default into
one parallel map over every input element whose result is written with an atomic update: on doubles a
compare-and-swap loop per element, also on one thread (the forward of `S = np.sum(A * B)` over 160,000
elements spent most of its time there). Its "pure-seq" expansion keeps a map over the outputs, parallel,
and reduces each output's elements in a sequential loop into a register accumulator that is stored once:
each thread owns the outputs it computes, so nothing is atomic.

Where the reduction sums, multiplies, or takes a max or a min of numbers, gradflow's own "gradflow-vector"
expansion (`library/vector_reduce.py`) goes further: the same map over outputs around C++ loops the
compiler vectorizes (a scalar accumulator chain costs 4 or more cycles per element).

Both write `identity ⊕ values` to the output, so they are chosen only for reductions that have an
identity (a reduction without one accumulates into the output's old value and keeps DaCe's default).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.libraries.standard.nodes.reduce import Reduce

from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass
from gradflow.library import vector_reduce

_DEFAULT = (None, "pure")


def _candidates(sdfg: dace.SDFG) -> list[tuple[Reduce, dace.SDFGState]]:
    return [(n, state) for n, state in sdfg.all_nodes_recursive()
            if isinstance(n, Reduce) and n.identity is not None and n.implementation in _DEFAULT]


@register_pass
@attrs.frozen
class LocalReductions(RewritePass):
    """Reductions with an identity expand to per-output accumulation, vectorized where it can be (see the
    module docstring)."""

    name: ClassVar[str] = "local_reductions"

    nested: ClassVar[bool] = False  # `_candidates` walks the nested SDFGs itself

    def matches(self, sdfg: dace.SDFG) -> list[tuple[Reduce, dace.SDFGState]]:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match: tuple[Reduce, dace.SDFGState]) -> None:
        node, state = match
        node.implementation = (vector_reduce.IMPLEMENTATION if vector_reduce.supports(node, state, state.sdfg)
                               else "pure-seq")
