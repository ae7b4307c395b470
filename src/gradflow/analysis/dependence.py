"""Pure analysis: may the iterations of a counted loop run in any order (as the iterations of a map)?

gradflow's own dependence test, the proof obligation of every pass that turns a loop into a map. DaCe's
`LoopToMap` does not count a write-conflict sum that another iteration reads as a dependence (`m[0] +=
0.5 * (x[i] - m[0])` became a map: a wrong gradient), so its applicability check is never taken as the
proof.

The loop's body must be one state. Every element the body touches is described by the innermost memlet
that touches it (the one at a tasklet, a copy or a nested node), per dimension as an interval over the
loop variable: the parameters of maps inside the body are eliminated by their extreme values (exact for
affine indices; anything else is the whole dimension). Each access is a *read*, a *write* or a write-conflict
resolution (*sum*, ...). Two accesses to one array conflict across iterations unless both are reads, or
both resolve conflicts the same way (sums commute), or some dimension proves that no two distinct
iterations `i1 != i2` touch a common element:

- *hull*: over all iterations, the two intervals are disjoint (`A[i]` against `A[0:i]` in a loop over `j`);
- *lattice*: both intervals move with the loop variable at the same rate `a` (`a*i + p .. a*i + q`), and
  no nonzero multiple of `a * step` (the distance between two iterations' intervals), bounded by the trip
  count when it is known, lies in `[p1 - q2, q1 - p2]` (`A[i + 1]` against `A[i]` with step 2).

A transient of one element that the body writes before every read of it, and that nothing outside the
body touches, is private to an iteration. Anything the analysis cannot see through (views, tasklets with
side effects, maps with data-dependent ranges, differences of bounds that are not numbers) is a
conflict: the answer is conservative.
"""

from __future__ import annotations

import math
from typing import Iterator

import attrs
import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion

from gradflow.analysis.loops import CountedLoop, assigned_symbols, counted_loop, upper_bound

#: an interval per dimension (inclusive bounds over the loop variable and constants); None: unknown
Bounds = tuple[tuple[sympy.Expr, sympy.Expr] | None, ...]


@attrs.frozen
class Access:
    """One memlet's worth of elements of `array` that an iteration touches."""

    array: str
    kind: str  # "read", "write", or the write-conflict resolution of a write ("sum", ...)
    bounds: Bounds
    subset: str  # the innermost memlet's subset, over the parameters of the maps around it


@attrs.frozen
class Conflict:
    """Two accesses that distinct iterations may make to a common element."""

    array: str
    first: str
    second: str

    def describe(self) -> str:
        return f"'{self.array}' ({self.first} in one iteration, {self.second} in another)"


@attrs.frozen
class Independence:
    """The verdict on a loop: `independent` when no two iterations depend on each other."""

    independent: bool
    conflicts: tuple[Conflict, ...] = ()
    reason: str | None = None  # why the loop could not be analysed at all
    counted: CountedLoop | None = None  # the loop's counted form, when it has one

    def describe(self) -> str:
        if self.independent:
            return "independent iterations"
        if self.reason:
            return self.reason
        return "iterations depend on each other through " + ", ".join(c.describe() for c in self.conflicts)


def _not_analysed(reason: str) -> Independence:
    return Independence(False, (), reason)


def loop_independence(loop: LoopRegion) -> Independence:
    """Whether the iterations of `loop` (a counted loop with a one-state body) are independent."""
    counted = counted_loop(loop, assigned_symbols(loop))
    if counted is None:
        return _not_analysed("not a counted loop")
    body = loop.nodes()
    if len(body) != 1 or not isinstance(body[0], dace.SDFGState):
        return _not_analysed("the body is not one state")
    state = body[0]
    blocker = _opaque(state)
    if blocker is not None:
        return _not_analysed(blocker)
    accesses = [a for a in body_accesses(state) if a.array not in _private(state)]
    return attrs.evolve(_verdict(accesses, counted), counted=counted)


def _opaque(state: dace.SDFGState) -> str | None:
    """What keeps the body's accesses from being read off its memlets, if anything."""
    for node in state.nodes():
        if isinstance(node, nd.AccessNode) and isinstance(node.desc(state.sdfg), (dace.data.View,
                                                                                  dace.data.Reference)):
            return f"the body accesses '{node.data}' through a view"
        if isinstance(node, nd.Tasklet) and node.side_effects:
            return f"tasklet '{node.label}' has side effects"
        if isinstance(node, nd.MapEntry) and any(not c.startswith("IN_") for c in node.in_connectors):
            return f"map '{node.label}' has a range read from data"
    return None


def _private(state: dace.SDFGState) -> frozenset[str]:
    """One-element transients that only this state touches, written (plainly) before any read of them."""
    sdfg = state.sdfg
    elsewhere = {n.data for s in sdfg.states() if s is not state for n in s.data_nodes()}
    for edge in sdfg.all_interstate_edges():
        elsewhere |= edge.data.free_symbols
    candidates = {n.data for n in state.data_nodes()
                  if n.desc(sdfg).transient and n.desc(sdfg).total_size == 1 and n.data not in elsewhere}
    private = set()
    for name in candidates:
        nodes = [n for n in state.data_nodes() if n.data == name]
        if all(state.entry_node(n) is None for n in nodes) and all(
                state.out_degree(n) == 0 or (state.in_degree(n) > 0 and all(e.data.wcr is None
                                                                            for e in state.in_edges(n)))
                for n in nodes):
            private.add(name)
    return frozenset(private)


def body_accesses(state: dace.SDFGState) -> list[Access]:
    """Every access the state makes to data outside its map scopes, from the innermost memlets."""
    found = []
    for node in state.data_nodes():
        if state.entry_node(node) is not None:
            continue
        for edge in state.out_edges(node):
            if edge.data.is_empty():
                continue
            for leaf in _leaves(state, edge):
                found.append(Access(node.data, "read", _bounds(state, node, leaf, inner=leaf.dst),
                                    _subset_text(state, node, leaf)))
        for edge in state.in_edges(node):
            if edge.data.is_empty():
                continue
            for leaf in _leaves(state, edge):
                kind = "write" if leaf.data.wcr is None and edge.data.wcr is None else _wcr_kind(
                    leaf.data.wcr or edge.data.wcr)
                found.append(Access(node.data, kind, _bounds(state, node, leaf, inner=leaf.src),
                                    _subset_text(state, node, leaf)))
    return found


def _leaves(state: dace.SDFGState, edge) -> Iterator:
    """The innermost edges of the memlet tree that starts or ends at a top-level access node."""
    leaves = [leaf for leaf in state.memlet_tree(edge).leaves() if not leaf.data.is_empty()]
    yield from (leaves or [edge])


def _wcr_kind(wcr: str) -> str:
    from gradflow.core.wcr import reduction_type
    kind = reduction_type(wcr)
    if kind == dace.dtypes.ReductionType.Sum:
        return "sum"
    return f"conflict resolution {kind.name.lower() if kind is not None else wcr}"


def _subset_of(node: nd.AccessNode, memlet: dace.Memlet) -> subsets.Range | None:
    subset = memlet.subset if memlet.data == node.data else None
    if subset is None:
        return None
    return _as_range(subset)


def _as_range(subset) -> subsets.Range | None:
    """A subset as a `Range` (DaCe 2.0 has no other kind of subset on memlets), else None."""
    return subset if isinstance(subset, subsets.Range) else None


def _node_subset(state: dace.SDFGState, node: nd.AccessNode, leaf) -> subsets.Range | None:
    """The subset of `node`'s array that `leaf` (an edge at `node`, or the innermost edge of its memlet
    tree) names. A copy between two access nodes names both ends' subsets, one as `subset`, the other as
    `other_subset`; which is which DaCe tells by the end (a copy within one array, `a[i, :] = a[i - 1, :]`,
    names the array at both)."""
    if isinstance(leaf.src, nd.AccessNode) and isinstance(leaf.dst, nd.AccessNode):
        subset = leaf.data.get_src_subset(leaf, state) if leaf.src is node else (
            leaf.data.get_dst_subset(leaf, state) if leaf.dst is node else None)
        if subset is not None:
            return _as_range(subset)
    return _subset_of(node, leaf.data) or _other_subset(node, leaf)


def _subset_text(state: dace.SDFGState, node: nd.AccessNode, leaf) -> str:
    subset = _node_subset(state, node, leaf)
    return "" if subset is None else str(subset)


def _bounds(state: dace.SDFGState, node: nd.AccessNode, leaf, inner: nd.Node) -> Bounds:
    """Per dimension, the interval of elements of `node`'s array that `leaf` touches in one iteration of the
    loop, with the parameters of the maps around `inner` eliminated."""
    desc = node.desc(state.sdfg)
    subset = _node_subset(state, node, leaf)
    if subset is None or subset.dims() != len(desc.shape):
        return tuple(None for _ in desc.shape)
    intervals = {}
    scope = state.entry_node(inner) if not isinstance(inner, nd.MapEntry) else inner
    while scope is not None:
        if isinstance(scope, nd.MapEntry):
            for param, (begin, end, _step) in zip(scope.map.params, scope.map.range):
                intervals[param] = (sympy.sympify(begin), sympy.sympify(end))
        scope = state.entry_node(scope)
    bounds = []
    for begin, end, _step in subset:
        lo = upper_bound(sympy.sympify(begin), intervals, maximize=False)
        hi = upper_bound(sympy.sympify(end), intervals, maximize=True)
        leftover = {str(s) for s in (lo.free_symbols | hi.free_symbols)} & set(intervals) if lo is not None \
            and hi is not None else {"?"}
        bounds.append(None if leftover else (sympy.expand(lo), sympy.expand(hi)))
    return tuple(bounds)


def _other_subset(node: nd.AccessNode, leaf) -> subsets.Range | None:
    """The subset of `node`'s array on an edge whose memlet names the other end's data (a copy)."""
    memlet = leaf.data
    if memlet.data != node.data and memlet.other_subset is not None:
        return _as_range(memlet.other_subset)
    return None


def _verdict(accesses: list[Access], loop: CountedLoop) -> Independence:
    conflicts = []
    by_array: dict[str, list[Access]] = {}
    for access in accesses:
        by_array.setdefault(access.array, []).append(access)
    for array, group in sorted(by_array.items()):
        for k, first in enumerate(group):
            for second in group[k:]:
                if first.kind == "read" and second.kind == "read":
                    continue
                if first.kind == second.kind and first.kind != "write":
                    continue  # two updates with the same commutative resolution
                if not _apart(first.bounds, second.bounds, loop):
                    kinds = sorted((first.kind, second.kind), key=lambda kind: kind == "read")  # the update first
                    conflict = Conflict(array, *kinds)
                    if conflict not in conflicts:
                        conflicts.append(conflict)
    return Independence(not conflicts, tuple(conflicts))


def _apart(first: Bounds, second: Bounds, loop: CountedLoop) -> bool:
    """Some dimension proves that two distinct iterations never touch a common element."""
    return any(a is not None and b is not None and (_hulls_apart(a, b, loop) or _lattice_apart(a, b, loop))
               for a, b in zip(first, second))


def _number(expr: sympy.Expr) -> sympy.Number | None:
    value = sympy.simplify(expr)
    return value if value.is_number and value.is_real else None


def _hulls_apart(a, b, loop: CountedLoop) -> bool:
    domain = {loop.var: loop.interval()}
    lo_a, hi_a = upper_bound(a[0], domain, maximize=False), upper_bound(a[1], domain, maximize=True)
    lo_b, hi_b = upper_bound(b[0], domain, maximize=False), upper_bound(b[1], domain, maximize=True)
    if lo_a is None or hi_a is None or lo_b is None or hi_b is None:
        return False
    for gap in (lo_b - hi_a, lo_a - hi_b):
        value = _number(gap)
        if value is not None and value > 0:
            return True
    return False


def _rate(expr: sympy.Expr, var: sympy.Symbol) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(a, c) with expr == a * var + c, a a number; None when expr is not of that form."""
    a = sympy.diff(expr, var)
    if not a.is_number:
        return None
    rest = sympy.expand(expr - a * var)
    return (a, rest) if var not in rest.free_symbols else None


def _lattice_apart(a, b, loop: CountedLoop) -> bool:
    var = sympy.Symbol(loop.var)
    var = next((s for s in (*a[0].free_symbols, *a[1].free_symbols, *b[0].free_symbols, *b[1].free_symbols)
                if s.name == loop.var), var)
    found = [_rate(e, var) for e in (*a, *b)]
    rates = [r for r in found if r is not None]
    if len(rates) != len(found) or len({r[0] for r in rates}) != 1:
        return False
    rate = rates[0][0]
    if rate == 0:
        return False  # no movement: the hull test decides
    (_, p1), (_, q1), (_, p2), (_, q2) = rates
    low, high = _number(p1 - q2), _number(q1 - p2)
    if low is None or high is None:
        return False
    gap = abs(rate * loop.step)  # how far the intervals of two consecutive iterations are apart
    first, last = math.ceil(low / gap), math.floor(high / gap)  # the multiples k * gap in [low, high]
    trips = _trips(loop)
    reach = math.inf if trips is None else trips - 1  # |k| of two distinct iterations is at most this
    return not (_meets(first, last, 1, reach) or _meets(first, last, -reach, -1))


def _meets(first: int, last: int, low, high) -> bool:
    return max(first, low) <= min(last, high)


def _trips(loop: CountedLoop) -> int | None:
    numerator, divisor = loop.trip_count()
    value = _number(numerator)
    return None if value is None else max(int(value) // divisor, 0)


def apart_over(first: subsets.Range, second: subsets.Range, intervals: dict) -> bool:
    """Whether two subsets, over all values of the variables in `intervals` (name -> inclusive (low, high)),
    never share an element: some dimension's hulls are disjoint (e.g. a map reading row `N - 2` of an array
    and writing row `N - 3`)."""
    if first.dims() != second.dims():
        return False
    for (b1, e1, _), (b2, e2, _) in zip(first, second):
        lo1, hi1 = upper_bound(sympy.sympify(b1), intervals, False), upper_bound(sympy.sympify(e1), intervals, True)
        lo2, hi2 = upper_bound(sympy.sympify(b2), intervals, False), upper_bound(sympy.sympify(e2), intervals, True)
        if lo1 is None or hi1 is None or lo2 is None or hi2 is None:
            continue
        for gap in (lo2 - hi1, lo1 - hi2):
            value = _number(gap)
            if value is not None and value > 0:
                return True
    return False


def _element_accesses(state: dace.SDFGState, entry: nd.MapEntry) -> dict[str, list[tuple[str, subsets.Range]]]:
    """Per array, the (kind, subset) of every memlet at a tasklet or copy inside the map scope."""
    found: dict[str, list] = {}
    for edge in state.scope_subgraph(entry, include_entry=False, include_exit=False).edges():
        if edge.data.is_empty() or edge.data.data is None:
            continue
        kind = "read" if isinstance(edge.dst, nd.Tasklet) else "write" if edge.data.wcr is None else "sum"
        found.setdefault(edge.data.data, []).append((kind, edge.data.subset))
    for edge in state.in_edges(state.exit_node(entry)):
        if not edge.data.is_empty() and edge.data.data is not None and not isinstance(edge.src, nd.Tasklet):
            found.setdefault(edge.data.data, []).append(("write", edge.data.subset))
    return found


def _injective_element(subset, params: list[str]) -> bool:
    """A single element whose index determines every parameter (each is `p + c` alone in a dimension)."""
    if not isinstance(subset, subsets.Range) or any(b != e for b, e, _ in subset):
        return False
    alone = set()
    for begin, _, _ in subset:
        expr = _plain(begin)
        names = {str(s) for s in expr.free_symbols} & set(params)
        if len(names) == 1:
            var = next(s for s in expr.free_symbols if str(s) in names)
            if sympy.diff(expr, var) in (1, -1):
                alone |= names
    return alone == set(params)


def fusion_keeps_results(state: dace.SDFGState, first: nd.MapEntry, second: nd.MapEntry) -> bool:
    """Whether running `second`'s body right after `first`'s in each iteration (vertical map fusion) computes
    what running all of `first` before all of `second` does: both maps range over the same space, and every
    array both touch, one of them writing it, is touched element by element at the same index in both (an
    injective function of the iteration), so no iteration meets an element another iteration touched in the
    other map. The proof obligation of `fuse_maps`; DaCe's `MapFusionVertical` check is not taken as it."""
    if len(first.map.params) != len(second.map.params) or len(first.map.range) != len(second.map.range):
        return False
    rename = {symbolic.symbol(b): symbolic.symbol(a) for a, b in zip(first.map.params, second.map.params)}
    for (b1, e1, s1), (b2, e2, s2) in zip(first.map.range, second.map.range):
        if any(_number(_plain(x) - _plain(y).subs(rename, simultaneous=True)) != 0
               for x, y in ((b1, b2), (e1, e2), (s1, s2))):
            return False
    params = list(first.map.params)
    ones, twos = _element_accesses(state, first), _element_accesses(state, second)
    for array in set(ones) & set(twos):
        group = ones[array] + [(k, _renamed(s, second.map.params, first.map.params)) for k, s in twos[array]]
        if all(kind == "read" for kind, _ in group):
            continue
        texts = set()
        for _, subset in group:
            if not _injective_element(subset, params):
                return False
            texts.add(tuple(sympy.simplify(_plain(b)) for b, _, _ in subset))
        if len(texts) != 1:
            return False
    return True


def _plain(expr) -> sympy.Expr:
    """An index expression over fresh DaCe symbols: the same name then means the same symbol (expressions of
    different origins carry symbols with different assumptions, which SymPy does not cancel)."""
    return symbolic.pystr_to_symbolic(str(expr))


def _renamed(subset, old: list[str], new: list[str]):
    if not isinstance(subset, subsets.Range):
        return subset
    mapping = {symbolic.symbol(o): symbolic.symbol(n) for o, n in zip(old, new)}
    return subsets.Range([tuple(_plain(x).subs(mapping, simultaneous=True) for x in r) for r in subset])


def read_part_of_a_map(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry) -> subsets.Range | None:
    """The iterations of `entry`'s map whose results are ever read, when that is fewer than it runs: the map
    writes one transient `T` at `T[i]` (each iteration its own element, nothing else), `T` has this one
    access node in the whole SDFG and is read from it by one edge, whose subset is a box inside the map's
    range. The other iterations write elements no one reads and have no other effect: dropping them keeps
    every result (`fuse_maps` then fuses the map with its reader when their ranges agree:
    `x = y + h * k; z[1:] = w[1:] * x[:-1]`). None when that cannot be shown or every iteration is read."""
    exit_node = state.exit_node(entry)
    outs, ins = state.out_edges(exit_node), state.in_edges(exit_node)
    if len(outs) != 1 or len(ins) != 1 or not isinstance(outs[0].dst, nd.AccessNode):
        return None
    name, params = outs[0].dst.data, list(entry.map.params)
    desc = sdfg.arrays.get(name)
    inner = ins[0].data
    if (desc is None or not desc.transient or isinstance(desc, dace.data.View) or inner.wcr is not None
            or outs[0].data.wcr is not None or inner.data != name or not isinstance(inner.subset, subsets.Range)
            or len(inner.subset) != len(params) or len(desc.shape) != len(params)):
        return None
    if [sympy.simplify(_plain(b) - _plain(p)) for (b, e, s), p in zip(inner.subset, params)] != [0] * len(params) \
            or any(_plain(b) != _plain(e) for b, e, _ in inner.subset):
        return None  # not T[i] in iteration i
    if not accessed_at_one_node(sdfg, name):
        return None
    readers = state.out_edges(outs[0].dst)
    if len(readers) != 1 or readers[0].data.wcr is not None:
        return None
    read = readers[0].data.get_src_subset(readers[0], state)
    if not isinstance(read, subsets.Range) or len(read) != len(params):
        return None
    smaller = False
    for (rb, re_, rs), (mb, me, ms) in zip(read, entry.map.range):
        low, high = _number(_plain(rb) - _plain(mb)), _number(_plain(me) - _plain(re_))
        if _number(_plain(rs) - 1) != 0 or _number(_plain(ms) - 1) != 0 or low is None or high is None \
                or low < 0 or high < 0:
            return None
        smaller = smaller or low > 0 or high > 0
    return subsets.Range([(b, e, 1) for b, e, _ in read]) if smaller else None


def accessed_at_one_node(sdfg: dace.SDFG, name: str) -> bool:
    """`name` has exactly one access node in `sdfg` (nested SDFGs reach it only through access nodes here)
    and no interstate edge or control-flow condition reads it."""
    nodes = sum(1 for state in sdfg.states() for n in state.data_nodes() if n.data == name)
    if nodes != 1 or any(name in edge.data.free_symbols for edge in sdfg.all_interstate_edges()):
        return False
    for region in sdfg.all_control_flow_regions():
        codes = []
        if isinstance(region, LoopRegion):
            codes = [region.loop_condition, region.init_statement, region.update_statement]
        elif isinstance(region, dace.sdfg.state.ConditionalBlock):
            codes = [c for c, _ in region.branches]
        if any(c is not None and name in c.as_string for c in codes):
            return False
    return True
