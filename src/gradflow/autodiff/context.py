"""The reverse-mode context: what a reverse rule may ask of the engine while it emits backward code.

Rules never look up gradient names or decide where a forward value comes from themselves: the context
answers "which array holds the gradient of A" and "where do I read A's value as operation k saw it"
(the original array, or a copy stored before it was overwritten). Rules only append states.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import dace
from dace.sdfg.state import ControlFlowRegion, SDFGState

from gradflow.analysis.activity import Activity
from gradflow.analysis.ops import Op


@attrs.define
class ReverseContext:
    sdfg: dace.SDFG
    region: ControlFlowRegion
    activity: Activity
    grad_buffers: Mapping[str, str]  # forward array -> gradient buffer
    stores: dict[tuple[int, str], str] = attrs.field(factory=dict)  # (op index, array) -> stored copy
    _last: SDFGState | None = None

    def grad_of(self, array: str) -> str | None:
        return self.grad_buffers.get(array)

    def value_of(self, op_index: int, array: str) -> str:
        """The array holding `array`'s value as operation `op_index` read it."""
        return self.stores.get((op_index, array), array)

    def new_state(self, label: str) -> SDFGState:
        state = self.region.add_state(label, is_start_block=self._last is None)
        if self._last is not None:
            self.region.add_edge(self._last, state, dace.InterstateEdge())
        self._last = state
        return state


@attrs.frozen
class OpSite:
    """A forward operation as a rule sees it: the state holding it (alone) and its position."""

    index: int
    state: SDFGState
    op: Op

    def members(self) -> list:
        return [self.state.node(i) for i in sorted(self.op.nodes)]

    def read_arrays(self) -> frozenset[str]:
        return frozenset(self.state.node(i).data for i in self.op.reads)

    def written_arrays(self) -> frozenset[str]:
        return frozenset(self.state.node(i).data for i in self.op.writes)
