"""Pure analysis: which arrays a program writes, and which it certainly overwrites before reading.

Callers that allocate arrays for the user (`value_and_grad`'s omitted arguments, the torch dispatchers'
outputs) and callers that check arguments (read-only arrays the program would write) share these
answers. Both questions are answered conservatively (`overwritten_before_read` False,
`may_read_before_write` True whenever the analysis cannot tell), so a caller zero-fills or asks for the
array, never hands the program uninitialised memory to read.
"""

from __future__ import annotations

import enum
import itertools

import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.analysis.access import covers_array, scope_ranges
from gradflow.analysis.indices import same_value
from gradflow.analysis.ops import constant_beta
from gradflow.analysis.versions import kept_version
from gradflow.core.exact_subsets import covers


def written(sdfg: dace.SDFG) -> frozenset[str]:
    """Arrays some state writes (an access node with an incoming edge), in any control-flow region
    (nested SDFGs write through the access nodes around them)."""
    return frozenset(node.data for state in sdfg.states() for node in state.data_nodes()
                     if state.in_degree(node) > 0)


class _First(enum.Enum):
    """How a block first touches an array."""

    UNTOUCHED = "untouched"
    OVERWRITES = "overwrites"  # writes every element, reading nothing of it before
    UNSURE = "unsure"  # reads it, writes part of it, or cannot be analysed


def overwritten_before_read(sdfg: dace.SDFG, name: str) -> bool:
    """True when every run of the program writes every element of `name` before anything reads it.

    Followed: a straight chain of blocks from the start block, into plain control-flow regions; the first
    block that touches `name` decides. A state decides when its only accesses to `name` write it without
    write-conflict resolution, without dynamic memlets and not from a nested SDFG (whose memlet is only a
    bound), over subsets that cover the array. Loops, conditionals, branching control flow and interstate
    edges that read `name` before that are answered False."""
    if name not in sdfg.arrays:
        return False
    return _region(sdfg, name, subsets.Range.from_array(sdfg.arrays[name])) is _First.OVERWRITES


def overwritten_before_read_in(sdfg: dace.SDFG, name: str, region: subsets.Range) -> bool:
    """As `overwritten_before_read`, for the elements of `region` only (e.g. the part a loop body writes:
    its other elements are never written, so their value is what the caller passed)."""
    if name not in sdfg.arrays:
        return False
    return _region(sdfg, name, region) is _First.OVERWRITES


def overwrites_first(block, name: str) -> bool:
    """True when `block` (a state, a conditional, a plain region) writes every element of the array `name`
    of its SDFG before anything in it reads one, as `overwritten_before_read` decides for a program."""
    sdfg = block.sdfg
    if name not in sdfg.arrays:
        return False
    return _block(block, name, subsets.Range.from_array(sdfg.arrays[name])) is _First.OVERWRITES


def may_read_before_write(sdfg: dace.SDFG, name: str) -> bool:
    """False when no run of the program reads an element of `name` it has not written first: the array
    is overwritten before being read (as in `overwritten_before_read`) or not touched at all. What a
    caller may leave for gradflow to allocate (zero-filled)."""
    if name not in sdfg.arrays:
        return True
    return _region(sdfg, name, subsets.Range.from_array(sdfg.arrays[name])) is _First.UNSURE


def exposed_read(region: ControlFlowRegion, name: str) -> bool:
    """False when no run of `region` reads an element of `name` that the same run has not written before
    in it (the array's value on entry never matters), True whenever the analysis cannot tell.

    Weaker than `overwrites_first`, which also needs every element written on every path: a branch or a
    loop body that writes a temporary before reading it (`t = x[N - 1]; y[i] *= t` under an `if`) exposes
    no read, though it may leave the array unwritten. Followed: the straight chain of blocks from the start
    block, up to a block that overwrites the array whole; each block on it must expose no read on its own
    (a state reads only what it has set whole; a conditional's conditions do not read it and no branch
    exposes a read; a loop's header does not read it and its body exposes no read in any iteration).
    Blocks off that chain must not touch the array."""
    blocks = list(region.nodes())
    block, seen, entering = region.start_block if blocks else None, set(), None
    while block is not None and block not in seen:
        seen.add(block)
        if entering is not None and _reads(entering, name):
            return True
        if _block_exposes(block, name):
            return True
        if isinstance(block, dace.SDFGState) and _state(block, name, subsets.Range.from_array(
                block.sdfg.arrays[name])) is _First.OVERWRITES:
            return False
        out = region.out_edges(block)
        if len(out) != 1 or not out[0].data.is_unconditional():
            break
        entering, block = out[0], out[0].dst
    rest = [b for b in blocks if b not in seen]
    return any(_touches(b, name) for b in rest) or any(_reads(e, name) for e in region.edges()
                                                         if e.src not in seen or e.dst not in seen)


def _block_exposes(block, name: str) -> bool:
    if isinstance(block, dace.SDFGState):
        for node in block.data_nodes():
            if node.data != name or block.out_degree(node) == 0:
                continue
            full = subsets.Range.from_array(block.sdfg.arrays[name])
            if not any(_sets(block, e) and _covers(block, e, name, full) for e in block.in_edges(node)):
                return True
        return False
    if isinstance(block, ConditionalBlock):
        if any(c is not None and name in set(map(str, c.get_free_symbols())) for c, _ in block.branches):
            return True
        kept = kept_version(block)
        if kept is not None:
            return exposed_read(kept, name)  # every version computes what this one does
        return any(exposed_read(body, name) for _, body in block.branches)
    if isinstance(block, LoopRegion):
        header = [c for c in (block.loop_condition, block.init_statement, block.update_statement) if c is not None]
        if any(name in set(map(str, c.get_free_symbols())) for c in header):
            return True
        return exposed_read(block, name)
    if isinstance(block, ControlFlowRegion):
        return exposed_read(block, name)
    return _touches(block, name)


def _reads(edge, name: str) -> bool:
    return name in set(map(str, edge.data.free_symbols))


def _region(region: ControlFlowRegion, name: str, full: subsets.Range) -> _First:
    """Follow the region's blocks from its start block while each has one unconditional successor."""
    blocks = list(region.nodes())
    if not blocks:
        return _First.UNTOUCHED
    block, seen, entering = region.start_block, set(), None
    while block is not None and block not in seen:
        seen.add(block)
        if entering is not None and _reads(entering, name):
            return _First.UNSURE
        found = _block(block, name, full)
        if found is not _First.UNTOUCHED:
            return found
        out = region.out_edges(block)
        if len(out) != 1 or not out[0].data.is_unconditional():
            break
        entering, block = out[0], out[0].dst
    if len(seen) == len(blocks) and not any(_reads(e, name) for e in region.edges()):
        return _First.UNTOUCHED
    return _First.UNSURE if _touches(region, name) else _First.UNTOUCHED


def _touches(block, name: str) -> bool:
    """Whether a block reads or writes `name` anywhere (its states, conditions, interstate edges)."""
    if isinstance(block, dace.SDFGState):
        return any(n.data == name for n in block.data_nodes())
    return any(n.data == name for s in block.states() for n in s.data_nodes()) or name in set(
        map(str, block.free_symbols))


def _block(block, name: str, full: subsets.Range) -> _First:
    if isinstance(block, dace.SDFGState):
        return _state(block, name, full)
    if isinstance(block, ConditionalBlock):
        return _branches(block, name, full)
    if isinstance(block, LoopRegion) or not isinstance(block, ControlFlowRegion):
        return _First.UNSURE if _touches(block, name) else _First.UNTOUCHED
    return _region(block, name, full)


def _branches(block: ConditionalBlock, name: str, full: subsets.Range) -> _First:
    """A conditional overwrites when it has an `else` and every branch overwrites, its conditions reading
    nothing of the array (`if x[i] > 0: y[i] = a else: y[i] = b` in a map body)."""
    if not _touches(block, name):
        return _First.UNTOUCHED
    conditions = [c for c, _ in block.branches]
    if any(c is not None and name in set(map(str, c.get_free_symbols())) for c in conditions):
        return _First.UNSURE
    kept = kept_version(block)
    if kept is not None:
        return _region(kept, name, full)  # every version computes what this one does
    if any(c is None for c in conditions):
        found = {_region(body, name, full) for _, body in block.branches}
        if found == {_First.OVERWRITES}:
            return _First.OVERWRITES
    return _First.UNSURE


def _state(state: dace.SDFGState, name: str, full: subsets.Range) -> _First:
    accesses = [n for n in state.data_nodes() if n.data == name]
    if not accesses:
        return _First.UNTOUCHED
    # A node's out-edges read what its in-edges wrote (DaCe orders them so): a node that is read must
    # itself be written whole first; nodes only written may be any.
    covered = False
    for node in accesses:
        whole = False
        for e in state.in_edges(node):
            if not _sets(state, e):
                return _First.UNSURE
            whole = whole or _covers(state, e, name, full)
        if state.out_degree(node) > 0 and not whole:
            return _First.UNSURE
        covered = covered or whole
    return _First.OVERWRITES if covered else _First.UNSURE


def _covers(state: dace.SDFGState, edge, name: str, full: subsets.Range) -> bool:
    """Whether the write `edge` sets every element of `full` of the array `name`. Out of a map, the
    edge's subset is only the bounding box DaCe propagated from the writes inside (a map writing 10 of each
    4 x 4 block names the whole array): there, the elements the writes inside set are counted instead
    (`map_writes_cover`)."""
    sub = edge.data.subset if edge.data.data == name else edge.data.other_subset
    if sub is None and isinstance(edge.src, nd.AccessNode) and edge.data.data == edge.src.data:
        sub = _copied_into(state, edge, full)
    if sub is None or not covers(sub, full):
        return False
    return not isinstance(edge.src, nd.MapExit) or map_writes_cover(state, edge, full)


def _copied_into(state: dace.SDFGState, edge, full: subsets.Range) -> subsets.Range | None:
    """What a copy whose memlet names only its source writes of its destination (`full`, all of it): all of
    it when the copy reads all of a source of the destination's shape (DaCe then copies element to element;
    of a part of the source it writes the same part of the destination, `test_writes`); else None."""
    source = state.sdfg.arrays[edge.src.data]
    if len(source.shape) != len(full) or not covers_array(state.sdfg, edge.data):
        return None
    if any(symbolic.simplify(a - b) != 0 for a, b in zip(source.shape, full.size_exact())):
        return None
    return full


def map_writes_cover(state: dace.SDFGState, edge, full: subsets.Range) -> bool:
    """Whether the writes inside the map whose exit `edge` leaves set every element of `full` (an
    under-approximation: False whenever it cannot be shown).

    Each write inside (a leaf of the edge's memlet tree) sets, over the maps around it, a box when every
    dimension of its subset is either free of the maps' parameters or one parameter plus or minus a shift
    free of them (step 1, ranges free of other parameters, no parameter in two dimensions); boxes equal but
    in one dimension, where they meet or overlap, are joined; the writes cover `full` when one box does."""
    boxes = []
    for leaf in state.memlet_tree(edge).leaves():
        sub = leaf.data.subset if leaf.data.data == edge.data.data else leaf.data.other_subset
        if sub is None or leaf.data.dynamic or not isinstance(leaf.src, (nd.Tasklet, nd.AccessNode, nd.LibraryNode)):
            return False
        ranges, tiles = _untiled(scope_ranges(state, leaf.src))
        bounds = {str(f) for r in ranges.values() for x in r for f in symbolic.pystr_to_symbolic(x).free_symbols}
        if bounds & (set(ranges) | tiles):  # a triangular nest: no box
            return False
        if any(tiles & {str(f) for f in symbolic.pystr_to_symbolic(x).free_symbols} for r in sub for x in r):
            return False  # an index that reads the tile itself, not only the element
        box: list[tuple] = []
        used: set[str] = set()
        for begin, end, step in sub:
            names = {str(f) for x in (begin, end, step) for f in symbolic.pystr_to_symbolic(x).free_symbols}
            if not names & set(ranges):
                box.append((begin, end, step))
                continue
            image = _shifted_range(begin, end, ranges, used)
            if image is None:
                return False
            box.append(image)
        boxes.append(box)
    return any(covers(subsets.Range(b), full) for b in _joined(boxes))


def _untiled(ranges: dict[str, tuple]) -> tuple[dict[str, tuple], set[str]]:
    """`ranges` with each strip-mined pair joined, and the tile parameters so removed. A pair is a tile
    parameter `t` over `B:E` in steps of a constant `k` and one parameter `p` over `t .. Min(E, t + k - 1)`
    in steps of 1 (the last tile cut short, as `nest_reductions` tiles a symbolic extent), or over
    `t .. t + k - 1` when `k` divides the constant extent: as `t` and `p` run, `p` takes each value of
    `B .. E` once (`t = B + k * floor((p - B) / k)`), so `p` ranges over `B:E` and `t` goes. A tile
    parameter that bounds more than one range stays (the pairs would move together)."""
    out = dict(ranges)
    bounding: dict[str, int] = {}
    for r in ranges.values():
        for name in {str(f) for x in r for f in symbolic.pystr_to_symbolic(x).free_symbols} & set(ranges):
            bounding[name] = bounding.get(name, 0) + 1
    tiles: set[str] = set()
    for p, (begin, end, step) in ranges.items():
        tile = str(begin)
        if step != 1 or tile == p or tile not in ranges or bounding.get(tile) != 1:
            continue
        low, high, k = ranges[tile]
        k = symbolic.pystr_to_symbolic(str(k))
        if not (k.is_Integer and k >= 1) or {str(f) for x in (low, high) for f in
                                             symbolic.pystr_to_symbolic(x).free_symbols} & set(ranges):
            continue
        last = symbolic.pystr_to_symbolic(str(end))
        full_tile = symbolic.pystr_to_symbolic(tile) + k - 1
        if isinstance(last, sympy.Min) and len(last.args) == 2:
            a, b = last.args
            joined = ((same_value(a, full_tile) and same_value(b, high))
                      or (same_value(b, full_tile) and same_value(a, high)))
        else:
            extent = symbolic.pystr_to_symbolic(str(high - low + 1))
            joined = same_value(last, full_tile) and extent.is_Integer and int(extent) % int(k) == 0
        if joined:
            out[p] = (low, high, 1)
            del out[tile]
            tiles.add(tile)
    return out, tiles


def _shifted_range(begin, end, ranges: dict[str, tuple], used: set[str]) -> tuple | None:
    """The indices one dimension `begin == end == p + c` (or `c - p`) takes while the map parameter `p` runs
    over its range of step 1, `c` free of the maps' parameters; None for any other form or a parameter
    already used by another dimension. Marks `p` used."""
    if begin != end:
        return None
    index = symbolic.pystr_to_symbolic(str(begin))
    params = {str(f) for f in index.free_symbols} & set(ranges)
    if len(params) != 1 or params & used:
        return None
    param = params.pop()
    low, high, step = ranges[param]
    symbol = symbolic.pystr_to_symbolic(param)
    slope = index.diff(symbol)
    shift = index - slope * symbol
    if step != 1 or slope not in (1, -1) or symbol in shift.free_symbols:
        return None
    used.add(param)
    return (low + shift, high + shift, 1) if slope == 1 else (shift - high, shift - low, 1)


def _joined(boxes: list[list[tuple]]) -> list[list[tuple]]:
    """`boxes` with any two that are equal but in one dimension of step 1, where their ranges meet or
    overlap, joined into one, until none are."""
    boxes = [list(b) for b in boxes]
    changed = True
    while changed:
        changed = False
        for a, b in itertools.combinations(range(len(boxes)), 2):
            x, y = boxes[a], boxes[b]
            differ = [d for d in range(len(x)) if x[d] != y[d]]
            if len(differ) != 1:
                continue
            d = differ[0]
            (xb, xe, xs), (yb, ye, ys) = x[d], y[d]
            if xs != 1 or ys != 1 or not (_known(xe + 1 - yb >= 0) and _known(ye + 1 - xb >= 0)):
                continue
            low = xb if _known(xb <= yb) else yb if _known(yb <= xb) else None
            high = xe if _known(xe >= ye) else ye if _known(ye >= xe) else None
            if low is None or high is None:
                continue
            boxes[a] = x[:d] + [(low, high, 1)] + x[d + 1:]
            del boxes[b]
            changed = True
            break
    return boxes


def _known(relation) -> bool:
    """A symbolic comparison that holds for certain (False when SymPy cannot decide)."""
    try:
        return bool(relation)
    except TypeError:
        return False


def _sets(state: dace.SDFGState, edge) -> bool:
    """Whether the write `edge` carries sets the elements it names, whatever they held: not a sum into
    them (a write-conflict resolution, a BLAS call with beta != 0, a gradient convolution, a `Reduce`
    without identity, which all add into their output without an edge that reads it), not a nested SDFG
    or a dynamic write, which may leave some unwritten. A map's write sets when every write inside the map
    that reaches it does."""
    if edge.data.wcr is not None or edge.data.dynamic:
        return False
    src = edge.src
    if isinstance(src, (nd.Tasklet, nd.AccessNode)):
        return True
    if isinstance(src, nd.MapExit):
        inner = [e for e in state.in_edges(src) if e.dst_conn == "IN_" + (edge.src_conn or "")[len("OUT_"):]]
        return bool(inner) and all(_sets(state, e) for e in inner)
    if isinstance(src, nd.LibraryNode):
        return _library_sets(src)
    return False


def _library_sets(node: nd.LibraryNode) -> bool:
    """Library nodes known to overwrite their output: BLAS products with beta = 0, a `Reduce` with an
    identity. Any other (gradflow's gradient convolutions add into theirs) is taken to read it."""
    kind = type(node).__name__
    if kind in ("Gemm", "Gemv", "MatMul", "BatchedMatMul", "Dot"):  # (`Ger` always adds: A += x y^T)
        return constant_beta(node) == 0.0
    if kind == "Reduce":
        return node.identity is not None
    return False
