"""`share_dead_buffers`: a transient array whose value is dead takes the place of a later one of the same
layout, so that a program holds at once only the arrays that are live at once.

DaCe allocates a transient used in several states for the whole call. A backward sweep is a long chain of
states, each writing one gradient buffer (or recomputing one forward value) that the next few states read:
allocated for the whole call, they all exist at once. Measured on the model zoo's MLP (batch 2048,
float32, `benchmarks/memory_peak.py`): 41 MiB resident at the peak of one training step where eager torch
needs 16, and a smaller byte budget *raised* that peak, since every value the budget reruns got a buffer of
its own in the backward while every gradient buffer stayed allocated.

The pass splits each candidate array into live ranges and places every range in a buffer, its own array's
or another's. A range is moved (its access nodes and memlets renamed; an array left without access nodes is
removed) only when, in gradflow's own analysis of the top-level program:
- the arrays are transient arrays of the top-level SDFG with equal layouts (dtype, shape, strides, offsets,
  storage, alignment), `Scope` lifetime (DaCe allocates them; nothing outside the call sees them), not views
  and not viewed, with no access node inside a map scope (DaCe allocates an array used in one state only
  inside a map once per iteration: shared with another state, the iterations would share one array),
  named by no interstate edge, loop or branch code, tasklet code or nested symbol mapping, and sized by no
  symbol the program sets while it runs (an interstate assignment, a loop variable);
- or, for arrays of other shapes (a gradient and the gradient of its reshape or transpose), both are dense
  (their elements fill addresses 0 .. n-1 once each: row-major or another dimension order, no padding, no
  offset) with as many elements of one dtype, storage and alignment. The range is then renamed to a View of
  its own shape and strides, each of its access nodes joined by a `views` edge to an access node of the
  buffer (a node both written and read becomes the writing View, the buffer, then the reading View). The
  View's elements are the buffer's memory at the moved array's own offsets (its strides), so the range
  reads and writes exactly the elements it did, in memory no live range holds;
- the program is read as a chain of positions: the blocks of the top-level region and, inside a plain
  control-flow region that is a chain itself, its blocks; a loop, a conditional or a region that is no chain
  is one position (whatever happens inside it happens at that position). An array's touches are the
  positions whose states access it;
- a range starts at a touch whose block writes all of the array before reading any of it
  (`analysis.writes.overwrites_first`: a state or a conditional, never a loop, which may run no iteration),
  or at the array's first touch, and runs to the touch before the next such start. A range that does not
  start with an overwrite (the array's first touch reads what the array held) stays in its own array;
- a range moves into a buffer only when it starts with an overwrite and the buffer's previous range ended
  at an earlier position (strictly): nothing reads that buffer's old value again, and whatever it held is
  overwritten before it is read.

A range that starts with a whole copy of another candidate A of the same layout (`whole_copy_into`: the
range's array has one access node in that state, written only by the copy, which reads all of A; the state
does not write A) takes A's buffer when A's range ends in that state: the copy's destination would hold
what its source holds, and the source is dead after it, so one memory serves both and the copy is dropped.
The backward's working copies of the forward's temporaries, which the tape restores, are such copies.

Every read then reads the value the original program's read did: that value was written in the same range,
and no other range in that buffer touches it between the write and the read. Greedy interval colouring (by
first position) gives each range the earliest buffer whose last range is over, its own when free; a later
range of an array whose buffer is taken gets a new array of the same layout; a buffer of the same layout
is preferred to one entered through a View. The pass runs last in `OPTIMIZE`, after every pass that names
arrays (`sink_fills` before it moves the reverse's zero-fills of gradient buffers to their first use, where
their ranges start), and changes nothing when any of the above cannot be shown.
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import ClassVar

import attrs
import dace
from dace import subsets, symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.state import ControlFlowRegion, LoopRegion

from gradflow.analysis.access import accesses, chain_of, control_names
from gradflow.analysis.writes import overwrites_first
from gradflow.core.exact_subsets import covers
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass


def _layout(desc: dace.data.Array) -> tuple:
    """What two arrays must share to share memory under one name."""
    return (desc.dtype, tuple(map(str, desc.shape)), tuple(map(str, desc.strides)), tuple(map(str, desc.offset)),
            str(desc.total_size), str(desc.start_offset), desc.storage, desc.alignment, desc.may_alias)


def _block(desc: dace.data.Array) -> tuple | None:
    """What two arrays of other shapes must share for one to be a View of the other's memory: both dense
    (their elements fill addresses 0 .. n-1, each once: row-major, or dimensions in another order, as
    `transient_layouts` leaves them) and as many elements of one type; None if not dense."""
    if any(symbolic.simplify(o) != 0 for o in desc.offset) or symbolic.simplify(desc.start_offset) != 0:
        return None
    left = [(size, stride) for size, stride in zip(desc.shape, desc.strides) if symbolic.simplify(size - 1) != 0]
    expected = 1
    while left:  # the dimension of stride `expected` comes next; none, or two: not dense
        found = [k for k, (_, stride) in enumerate(left) if symbolic.simplify(stride - expected) == 0]
        if len(found) != 1:
            return None
        size, _ = left.pop(found[0])
        expected = expected * size
    if symbolic.simplify(desc.total_size - expected) != 0:
        return None
    return (desc.dtype, str(symbolic.simplify(expected)), desc.storage, desc.alignment, desc.may_alias)


def varying_symbols(sdfg: dace.SDFG) -> set[str]:
    """Symbols the program sets while it runs (interstate assignments, loop variables)."""
    varying = {k for e in sdfg.all_interstate_edges(recursive=True) for k in e.data.assignments}
    return varying | {r.loop_variable for r in sdfg.all_control_flow_regions(recursive=True)
                      if isinstance(r, LoopRegion) and r.loop_variable}


def candidates(sdfg: dace.SDFG) -> set[str]:
    """Transient arrays the pass may rename (module doc, first condition)."""
    viewed = set()
    for state in sdfg.states():
        for node in state.data_nodes():
            if isinstance(sdfg.arrays[node.data], dace.data.View):
                viewed |= {n.data for e in state.all_edges(node) for n in (e.src, e.dst)
                           if isinstance(n, nd.AccessNode)}
    nodes = [n for n, _ in sdfg.all_nodes_recursive()]
    code = " ".join([n.code.as_string for n in nodes if isinstance(n, nd.Tasklet)]
                    + [str(v) for n in nodes if isinstance(n, nd.NestedSDFG) for v in n.symbol_mapping.values()])
    words = set(re.findall(r"\w+", code))
    varying = varying_symbols(sdfg)  # an array sized by one has another size at another position
    # DaCe allocates an array used in one state only inside a map inside that map, one per iteration (a
    # fused map's temporary); used in a second state too, it would be one array for the whole call, which
    # the map's iterations share: slower, and a race once the map runs in parallel.
    scoped = {n.data for state in sdfg.states() for n in state.data_nodes() if state.entry_node(n) is not None}
    by_control = control_names(sdfg)
    return {name for name, desc in sdfg.arrays.items()
            if type(desc) is dace.data.Array and desc.transient and desc.lifetime == dace.AllocationLifetime.Scope
            and desc.storage in (dace.StorageType.Default, dace.StorageType.CPU_Heap)
            and name not in viewed and name not in scoped and name not in words and name not in sdfg.constants_prop
            and name not in by_control and not set(map(str, desc.free_symbols)) & varying}


class Positions:
    """Every position touching each candidate, with the block there, in the chain of positions (module doc)."""

    def __init__(self, sdfg: dace.SDFG, names: set[str]) -> None:
        self.names = names
        self.touches: dict[str, list[tuple[int, object]]] = {}
        self.position = 0
        self._region(sdfg)

    def _region(self, region: ControlFlowRegion) -> None:
        order = chain_of(region) if region.nodes() else []
        for block in [region] if order is None else order:  # (interstate edges name no candidate)
            if type(block) is ControlFlowRegion and block is not region:
                self._region(block)
                continue
            for name in _named(block) & self.names:
                self.touches.setdefault(name, []).append((self.position, block))
            self.position += 1


def _named(block) -> set[str]:
    """Arrays a block touches: access nodes of its states (a candidate is named by no control code, and a
    nested SDFG reaches it only through access nodes around it)."""
    states = [block] if isinstance(block, dace.SDFGState) else list(block.states())
    return {n.data for s in states for n in s.data_nodes()}


@attrs.frozen
class Segment:
    """A live range of one array: from a position that writes all of it before reading any (`fresh`; else
    the array's first touch, whose initial contents may be read) to the last touch before the next such."""

    array: str
    first: int
    last: int
    blocks: tuple
    fresh: bool


def segments(name: str, touches: list[tuple[int, object]]) -> list[Segment]:
    """The live ranges of array `name` from its touches in order: a new range starts at every touch whose
    block overwrites the array before reading it; the first range starts at the first touch either way."""
    found: list[Segment] = []
    for position, block in touches:
        fresh = overwrites_first(block, name)
        if found and not fresh:
            seg = found[-1]
            found[-1] = attrs.evolve(seg, last=position, blocks=seg.blocks + (block,))
        else:
            found.append(Segment(name, position, position, (block,), fresh))
    return found


def whole_copy_into(state, name: str) -> tuple[nd.AccessNode, nd.AccessNode] | None:
    """The copy's (source node, destination node) when `state`'s one write of array `name` is a copy of all
    of an array A of the same layout that the state only reads: `name`'s one access node there, its one
    in-edge from an access node of A, no write-conflict resolution, both subsets the whole array (a memlet
    without its other subset names the same elements on both sides)."""
    if not isinstance(state, dace.SDFGState):
        return None
    mine = accesses(state, name)
    if len(mine) != 1 or state.in_degree(mine[0]) != 1:
        return None
    edge = state.in_edges(mine[0])[0]
    source, memlet = edge.src, edge.data
    if not isinstance(source, nd.AccessNode) or source.data == name or memlet.wcr is not None:
        return None
    desc = state.sdfg.arrays[name]
    if _layout(state.sdfg.arrays[source.data]) != _layout(desc) or memlet.data not in (source.data, name):
        return None
    if any(state.in_degree(n) for n in accesses(state, source.data)):
        return None  # the state writes A too
    whole = subsets.Range.from_array(desc)  # A's too: one layout
    if not all(covers(sub, whole) for sub in (memlet.subset, memlet.other_subset) if sub is not None):
        return None
    return source, mine[0]


@attrs.frozen
class Plan:
    """Where the live ranges go: `placed`, (range, buffer) for every range placed in another array than its
    own; `joined`, the (state, source node, destination node) of each whole copy whose two arrays now share
    one buffer (the copy reads and writes the same memory: the rewrite drops it)."""

    placed: list
    joined: list


def plan(sdfg: dace.SDFG) -> Plan:
    """Each live range's buffer: an earlier array's whose range is over, the buffer of the array a range
    starts as a whole copy of when that array's range ends in the copy's state (the copy is then dropped),
    or a new one of the same layout (a later range of an array whose own buffer is taken)."""
    names = candidates(sdfg)
    if not names:
        return Plan([], [])
    where = Positions(sdfg, names)
    ranges = [seg for name in sorted(where.touches) for seg in segments(name, where.touches[name])]
    buffers: dict[str, tuple[tuple, tuple | None]] = {}  # buffer -> (layout, block)
    tenants: dict[str, Segment] = {}  # buffer -> the last range placed there (its end frees the buffer)
    placed, joined = [], []
    for seg in sorted(ranges, key=lambda r: (r.first, r.array)):
        desc = sdfg.arrays[seg.array]
        layout, block = _layout(desc), _block(desc)
        copied = whole_copy_into(seg.blocks[0], seg.array) if seg.fresh else None
        # the range starts as a copy of A, and A's range ends in that state: A's buffer holds the value
        same = [b for b, t in tenants.items() if copied is not None and t.array == copied[0].data
                and t.last == seg.first and buffers[b][0] == layout]
        over = [b for b, t in tenants.items() if t.last < seg.first]
        free = [b for b in over if buffers[b][0] == layout]
        # a buffer of another shape, entered through a View, when none of this layout is free
        free += [b for b in over if block is not None and buffers[b][1] == block and b not in free]
        free = free if seg.fresh else []
        if same:
            buffer = same[0]
            joined.append((seg.blocks[0], *copied))
        elif seg.array in free or (seg.array not in buffers and not free):
            buffer = seg.array
        elif free:
            buffer = free[0]
        else:  # its own buffer holds another range now
            taken = set(sdfg.arrays) | set(sdfg.symbols) | set(buffers)
            buffer = next(name for k in itertools.count(1) if (name := f"{seg.array}_{k}") not in taken)
        buffers.setdefault(buffer, (layout, block))
        tenants[buffer] = seg
        if buffer != seg.array:
            placed.append((seg, buffer))
    return Plan(placed, joined)


def sharing(sdfg: dace.SDFG) -> list[tuple[Segment, str]]:
    """(a live range, the buffer it is placed in) for every range placed in another array than its own."""
    return plan(sdfg).placed


@register_pass
@attrs.frozen
class ShareDeadBuffers(RewritePass):
    """Transient arrays whose live ranges are apart share one buffer (module doc)."""

    name: ClassVar[str] = "share_dead_buffers"
    nested: ClassVar[bool] = False  # the top-level program's transients

    def matches(self, sdfg: dace.SDFG) -> list[Plan]:
        found = plan(sdfg)
        return [found] if found.placed or found.joined else []

    def rewrite(self, sdfg: dace.SDFG, found: Plan) -> None:
        match = found.placed
        # All renames at once, from the original names: a block where range B moves into A's buffer may
        # also hold a range of A that moves elsewhere, and renaming one array after another would move B's
        # accesses twice.
        renames: dict[int, dict[str, str]] = {}
        views: dict[tuple[str, str], str] = {}  # (array, buffer of another layout) -> the View placed there
        for seg, buffer in match:
            desc = sdfg.arrays[seg.array]
            if buffer not in sdfg.arrays:
                sdfg.add_datadesc(buffer, copy.deepcopy(desc))
            target = buffer
            if _layout(sdfg.arrays[buffer]) != _layout(desc):
                if (seg.array, buffer) not in views:
                    views[seg.array, buffer] = sdfg.add_datadesc(f"{seg.array}_in_{buffer}",
                                                                 dace.data.View.view(desc), find_new_name=True)
                target = views[seg.array, buffer]
            for block in seg.blocks:
                for state in [block] if isinstance(block, dace.SDFGState) else block.states():
                    renames.setdefault(id(state), {})[seg.array] = target
        viewing = {view: buffer for (_, buffer), view in views.items()}
        for state in sdfg.states():
            rename = renames.get(id(state))
            if not rename:
                continue
            for node in state.data_nodes():
                node.data = rename.get(node.data, node.data)
            for edge in state.edges():
                if edge.data.data in rename:
                    edge.data.data = rename[edge.data.data]
            for node in [n for n in state.data_nodes() if n.data in viewing]:
                _join_view(state, node, viewing[node.data])
        for state, source, dest in found.joined:
            _drop_copy(state, source, dest)
        left = {n.data for state in sdfg.states() for n in state.data_nodes()}
        for array in {seg.array for seg, _ in match} - left:
            sdfg.remove_data(array, validate=False)


def _drop_copy(state: dace.SDFGState, source: nd.AccessNode, dest: nd.AccessNode) -> None:
    """Drop the copy `source` -> `dest`, now of one buffer into itself: what read `dest` reads `source`."""
    assert source.data == dest.data, (source.data, dest.data)
    for e in state.in_edges(dest):
        state.remove_edge(e)
    for e in state.out_edges(dest):
        state.add_edge(source, e.src_conn, e.dst, e.dst_conn, e.data)
    state.remove_node(dest)
    if state.degree(source) == 0:
        state.remove_node(source)


def _join_view(state: dace.SDFGState, node: nd.AccessNode, buffer: str) -> None:
    """Join the View node `node` to a new access node of `buffer` by a `views` edge over all of it: from the
    buffer when the node is read, to it when written. A node both written and read becomes two, the writing
    View, the buffer, then the reading View, so that each View has one edge to what it views."""
    whole = dace.Memlet.from_array(buffer, state.sdfg.arrays[buffer])
    writes = [e for e in state.in_edges(node) if not e.data.is_empty()]
    reads = state.out_edges(node)
    array = state.add_access(buffer)
    if writes:
        state.add_edge(node, "views", array, None, copy.deepcopy(whole))
        node.add_out_connector("views")
    if reads and writes:
        reader = state.add_access(node.data)
        for e in reads:
            state.add_edge(reader, e.src_conn, e.dst, e.dst_conn, e.data)
            state.remove_edge(e)
        node = reader
    if reads or not writes:
        state.add_edge(array, None, node, "views", copy.deepcopy(whole))
        node.add_in_connector("views")
