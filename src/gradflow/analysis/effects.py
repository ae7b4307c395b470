"""Pure analysis: what a control-flow block reads and writes, element by element, and whether two blocks of
a straight run may run in the other order (the proof obligation of a pass that reorders blocks).

A block's *effects* are its data accesses, each an interval per dimension of the elements one run of the
block may touch (`dependence.body_accesses`: the parameters of the maps around a memlet eliminated by their
extreme values), and the symbols it reads and assigns. A region's accesses are those of every state in it;
an interval that names a symbol the region assigns (a loop's variable, an interstate assignment) is the
whole dimension, since it moves while the region runs. A data name in control code (a condition, an
assignment's right side) reads the whole array. A block is *opaque*, and moves past nothing, when it holds a
view or reference, a tasklet with side effects, a map whose range is read from data, a nested SDFG, a
library node, or a `break`, `continue` or `return`.

Two blocks *commute* when neither assigns a symbol the other reads or assigns, and every two accesses to
one array, one of them not a read, provably touch no common element: in some dimension the intervals lie
apart by a positive number. A sum counts as a write (two sums to one element commute in exact arithmetic,
not in floating point: the reordered program would round otherwise). Symbols a run of blocks never assigns
have the same value at every block of the run; a pass that keeps every two non-commuting blocks in their
order (`order`) also keeps every assignment of a symbol between the blocks that read it.
"""

from __future__ import annotations

import attrs
import dace
import sympy
from dace.sdfg import nodes as nd
from dace.sdfg.state import (
    AbstractControlFlowRegion,
    BreakBlock,
    ContinueBlock,
    LoopRegion,
    ReturnBlock,
)

from gradflow.analysis.access import control_names
from gradflow.analysis.dependence import Access, _opaque, body_accesses
from gradflow.analysis.loops import assigned_symbols


@attrs.frozen
class Effects:
    """What one block (or one edge's assignments) touches; `accesses` per `dependence.Access`."""

    accesses: tuple[Access, ...]
    reads: frozenset[str]  # symbols read (data names in control code are whole-array reads in `accesses`)
    writes: frozenset[str]  # symbols assigned


def _whole(sdfg: dace.SDFG, name: str) -> Access:
    return Access(name, "read", tuple(None for _ in sdfg.arrays[name].shape), "")


def _code_reads(sdfg: dace.SDFG, names: set[str]) -> tuple[frozenset[str], tuple[Access, ...]]:
    """Symbols and whole-array reads of names used in control code."""
    data = {n for n in names if n in sdfg.arrays}
    return frozenset(names - data), tuple(_whole(sdfg, n) for n in sorted(data))


def _state_effects(state: dace.SDFGState) -> Effects | None:
    if _opaque(state) is not None or any(isinstance(n, (nd.NestedSDFG, nd.LibraryNode)) for n in state.nodes()):
        return None
    reads, code = _code_reads(state.sdfg, set(map(str, state.used_symbols(all_symbols=True))))
    return Effects(tuple(body_accesses(state)) + code, reads, frozenset())


def _moving(bounds, assigned: frozenset[str]):
    """`bounds` with every interval that names a symbol in `assigned` made unknown."""
    return tuple(None if b is None or {str(s) for e in b for s in sympy.sympify(e).free_symbols} & assigned
                 else b for b in bounds)


def effects(block) -> Effects | None:
    """The effects of a state, conditional, loop or plain region; None when it is opaque (module doc)."""
    if isinstance(block, dace.SDFGState):
        return _state_effects(block)
    if not isinstance(block, AbstractControlFlowRegion):
        return None  # break, continue, return
    blocks = list(block.all_control_flow_blocks())
    if any(isinstance(b, (BreakBlock, ContinueBlock, ReturnBlock)) for b in blocks):
        return None
    assigned = set(assigned_symbols(block))
    if isinstance(block, LoopRegion) and block.loop_variable:
        assigned.add(block.loop_variable)
    names = set(map(str, block.used_symbols(all_symbols=True))) | control_names(block)
    accesses: list[Access] = []
    for state in (b for b in blocks if isinstance(b, dace.SDFGState)):
        inner = _state_effects(state)
        if inner is None:
            return None
        names |= inner.reads
        accesses += inner.accesses
    frozen = frozenset(assigned)
    reads, code = _code_reads(block.sdfg, names)
    moved = tuple(attrs.evolve(a, bounds=_moving(a.bounds, frozen)) for a in accesses)
    return Effects(moved + code, reads, frozen)


def assignment_effects(sdfg: dace.SDFG, edge) -> Effects:
    """The effects of an interstate edge's assignments (its condition must be `True`)."""
    reads, code = _code_reads(sdfg, set(map(str, edge.read_symbols())))
    return Effects(code, reads, frozenset(edge.assignments))


def _apart(first, second) -> bool:
    """Some dimension where the two intervals provably share no element."""
    if len(first) != len(second):
        return False
    for a, b in zip(first, second):
        if a is None or b is None:
            continue
        for low, high in ((b[0], a[1]), (a[0], b[1])):
            gap = sympy.simplify(sympy.sympify(low) - sympy.sympify(high))
            if gap.is_number and gap > 0:
                return True
    return False


def commute(first: Effects | None, second: Effects | None) -> bool:
    """Running `first` then `second` has the effects of running `second` then `first` (module doc)."""
    if first is None or second is None:
        return False
    if first.writes & (second.reads | second.writes) or second.writes & first.reads:
        return False
    for a in first.accesses:
        for b in second.accesses:
            if a.array == b.array and (a.kind != "read" or b.kind != "read") and not _apart(a.bounds, b.bounds):
                return False
    return True
