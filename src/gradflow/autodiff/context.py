"""The reverse-mode context: what a reverse rule may ask of the engine while it emits backward code.

Rules never look up gradient names or decide where a forward value comes from themselves: the context
answers "which array holds the gradient of A" and "where do I read A's value as operation k saw it"
(the original array, a working copy that the backward sweep restores from the tape, or a recomputed
copy). Rules only append states to the region the engine is currently filling (a reversed loop body,
a branch, or the top of the backward sweep).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping

import attrs
import dace
from dace import subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import ControlFlowBlock, ControlFlowRegion, SDFGState

from gradflow.analysis.activity import Activity
from gradflow.analysis.loops import in_loop
from gradflow.analysis.ops import Op
from gradflow.autodiff.spec import ADSpec, ADTables, Differentiate
from gradflow.core.exact_subsets import union
from gradflow.core.stop_gradient import only_stopped


@attrs.define
class ReverseContext:
    sdfg: dace.SDFG
    region: ControlFlowRegion
    activity: Activity
    grad_buffers: Mapping[str, str]  # forward array -> gradient buffer
    tables: ADTables  # the tables of the pass (rules that delegate, e.g. to library rules, look up here)
    spec: ADSpec  # what is being built (rules that recurse, e.g. into nested SDFGs, reuse its policy)
    #: reverse mode of a sub-program with the same tables (the nested rule's vjp of a nested SDFG)
    differentiate: Differentiate
    values: dict[str, str] = attrs.field(factory=dict)  # forward array -> array the backward reads instead
    rules_used: dict[str, None] = attrs.field(factory=dict)  # names of the rules applied, in order
    #: the checked loops of nested SDFGs (`LoopLimit`), numbered after the program's own ones
    inner_bounded: list = attrs.field(factory=list)
    overflow_base: int = 0  # the number of bounded loops numbered before those of nested SDFGs
    #: (site, array) -> whether the backward's value of the array holds what the site wrote, when the site is
    #: reversed (`Reversal.keeps_result`; set by the engine once the tape is planned, never before `needs`)
    keeps_result: Callable[[OpSite, str], bool] | None = None
    #: (id of the state, array) of every result a rule's `needs` said its reverse reads back (`note_result_read`:
    #: exp's value, a max): kept as much as the values it read; the engine collects them after `needs`
    #: (`results_read`) for the budget model and recomputation
    finals_read: set[tuple[int, str]] = attrs.field(factory=set)
    _last: dict[int, ControlFlowBlock] = attrs.field(factory=dict)  # region id -> its last block
    _memo: dict = attrs.field(factory=dict)

    def memo(self, key, compute):
        """`compute()` once per build for `key` (facts about the forward program that rules ask for more than
        once, e.g. an operation's composed element function in `needs` and in `reverse`)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def note_rule(self, name: str) -> None:
        """Record that a rule took part (reported in `ADInterface.rules_used`; tests check table coverage)."""
        self.rules_used.setdefault(name, None)

    def grad_of(self, array: str) -> str | None:
        return self.grad_buffers.get(array)

    def final_value(self, state: SDFGState, array: str) -> str | None:
        """`array` itself when what the operation in `state` writes into it is what the array holds while the
        whole backward sweep runs: no working copy restores it, `state` is in no loop, and no other
        access node of the forward program writes it (a rule may then read an operation's result instead
        of recomputing it). None otherwise."""
        if (array in self.values or self.sdfg.arrays[array].lifetime != dace.dtypes.AllocationLifetime.Scope
                or in_loop(state)):
            return None
        writers = [(n, s) for n, s in self.sdfg.all_nodes_recursive()
                   if isinstance(n, nd.AccessNode) and n.data == array and isinstance(s, SDFGState) and s.in_degree(n)]
        return array if writers and all(s is state for _, s in writers) and len(writers) == 1 else None

    def note_result_read(self, state: SDFGState, array: str) -> None:
        """A rule's `needs` says that its reverse reads `array` as the operation in `state` wrote it (a
        `final_value`): kept for the backward as much as what the operation read, or rebuilt by rerunning it."""
        self.finals_read.add((id(state), array))

    def results_read(self, state: SDFGState) -> frozenset[str]:
        """The results of the operation in `state` that its rule said it reads back (`note_result_read`)."""
        return frozenset(a for sid, a in self.finals_read if sid == id(state))

    def value_of(self, op_index: int, array: str) -> str:
        """The array holding `array`'s value as operation `op_index` read it, at the point where the
        backward sweep reverses that operation."""
        return self.values.get(array, array)

    def add_block(self, block: ControlFlowBlock, assignments: Mapping[str, str] | None = None) -> None:
        """Append `block` to the current region; `assignments` go on the edge into it."""
        last = self._last.get(id(self.region))
        if assignments and last is None:
            last = self.region.add_state(f"{self.region.label}_entry", is_start_block=True)
        self.region.add_node(block, is_start_block=last is None, ensure_unique_name=True)
        if last is not None:
            self.region.add_edge(last, block, dace.InterstateEdge(assignments=dict(assignments or {})))
        self._last[id(self.region)] = block

    def new_state(self, label: str, assignments: Mapping[str, str] | None = None) -> SDFGState:
        state = SDFGState(label, self.sdfg)
        self.add_block(state, assignments)
        return state

    @contextlib.contextmanager
    def inside(self, region: ControlFlowRegion) -> Iterator[None]:
        """Emit into `region` (a reversed loop body or branch) until the block ends."""
        outer, self.region = self.region, region
        try:
            yield
        finally:
            if id(region) not in self._last:
                self.new_state(f"{region.label}_empty")
            self.region = outer


@attrs.frozen
class OpSite:
    """A forward operation as a rule sees it: the state holding it (alone), its position in program
    order, and the loops around it (outermost first)."""

    index: int
    state: SDFGState
    op: Op
    loops: tuple = ()

    def members(self) -> list:
        return [self.state.node(i) for i in sorted(self.op.nodes)]

    def read_arrays(self) -> frozenset[str]:
        return frozenset(self.state.node(i).data for i in self.op.reads)

    def written_arrays(self) -> frozenset[str]:
        return frozenset(self.state.node(i).data for i in self.op.writes)

    def differentiable_reads(self) -> frozenset[str]:
        """The arrays read here through which a derivative can flow: those with a use other than a tasklet
        connector read only through a stop (a softmax's max, `exp(x - stop(m))`, carries no gradient)."""
        state = self.state
        found = set()
        for i in self.op.reads:
            node = state.node(i)
            leaves = [leaf for e in state.out_edges(node) for leaf in state.memlet_tree(e).leaves()]
            if not leaves or not all(isinstance(leaf.dst, nd.Tasklet) and leaf.dst_conn
                                     and only_stopped(leaf.dst, leaf.dst_conn) for leaf in leaves):
                found.add(node.data)
        return frozenset(found)

    def _box(self, array: str, reads: bool) -> subsets.Range | None:
        """The bounding box of the subsets of `array` the operation reads (or writes); None when some
        edge cannot tell, or when it touches none of it."""
        state = self.state
        box = None
        for i in self.op.reads if reads else self.op.writes:
            node = state.node(i)
            if node.data != array:
                continue
            for e in state.out_edges(node) if reads else state.in_edges(node):
                if e.data.is_empty():
                    return None
                sub = e.data.get_src_subset(e, state) if reads else e.data.get_dst_subset(e, state)
                if sub is None:
                    return None
                box = sub if box is None else union(box, sub)
                if not isinstance(box, subsets.Range):
                    return None
        return box

    def read_subset(self, array: str) -> subsets.Range | None:
        """The bounding box of what the operation reads of `array` (None when it cannot tell)."""
        return self._box(array, reads=True)

    def written_subset(self, array: str) -> subsets.Range:
        """The bounding box of what the operation writes to `array` (the whole array when it cannot tell)."""
        box = self._box(array, reads=False)
        return box if box is not None else subsets.Range.from_array(self.state.sdfg.arrays[array])
