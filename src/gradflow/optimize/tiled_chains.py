"""`tile_element_chains`: a chain of one-dimensional element-wise maps, each reading what the maps before it
wrote at constant offsets, runs block by block, so that what one map writes is read back from the cache.

A Runge-Kutta step over a vector (GradBench's ode) is five maps over the vector: each stage reads the one
before it one element to the left (`k2[i + 1] = x[i + 1] * (y[i] + h / 2 * k1[i])`), and the update reads
all four. Run map after map, every stage streams its inputs back from memory; run in blocks of a few
hundred elements, each map's block, then the next map's, its inputs are still in the first-level cache.
XLA fuses such a chain into one loop and recomputes the shifted elements; this pass keeps every map and
every store and only changes the order in which their iterations run.

The proof. The chain is a run of states that follow each other on unconditional edges without
assignments (`analysis.access.runs_right_after`), holding only access nodes (no views), maps whose bodies
are tasklets and scope-local data (`transforms.fusion.elementwise_scope`), tasklets, and copies between
access nodes. Its *pieces* are ordered: by state, and within a state by the paths of its dataflow (two
pieces of one state that touch the same data, one of them writing, must be joined by a path, else the
chain is left alone). A *tiled* piece is a top-level map over one parameter `i`, step 1, whose every
access to data some tiled piece writes is the one element `i + c` of a one-dimensional array, `c` free of
`i`. Every other piece is *invariant*: it reads nothing a tiled piece writes, does not read what it
writes, is the only non-tiled writer of what it writes, every other access to that data comes after it,
and the elements tiled pieces write there are provably others.

Tiled piece `m`, over `[lo_m, hi_m)`, is shifted by an integer `o_m` and runs, in the block starting at
`t`, its iterations in `[t + o_m, t + o_m + B)`; blocks run in ascending order, and in each the chain runs
as before (state by state, dataflow order), invariant pieces included. An iteration `i` of `m` runs in
block `floor((i - o_m - t0) / B)`, so iteration order within each map is unchanged, and for two tiled
pieces `j` before `k` touching one element `e` (at `i_j = e - c_j`, `i_k = e - c_k`, one of them
writing; a sum counts as a write) `j`'s access still comes first when `i_j - o_j <= i_k - o_k`, that is
`o_k <= o_j + c_j - c_k`. Every such constraint leads from an earlier piece to a later one, so the
offsets are solved in one pass in order (`o_k` the least of 0 and its bounds), and the constraint must be
an integer for the chain to be tiled. Every element is then touched in the original order, sums included,
by the same operations (the compiled loops may still round apart where GCC contracts `a * b + c` into one
instruction in one loop and not in the other: ode's primal at s = 10 differs by 1.7e-18, and equals
numpy's there). Invariant pieces compute the same values in every block: their inputs are not written in
the chain after them, and nothing reads their outputs before them.

Blocks run one after another, so a tiled chain has no parallel loop. It runs when the program has one
OpenMP thread (`omp_get_max_threads()`, asked at each run of the chain); with more, the untouched chain
runs as before (its maps parallel where `choose_schedules` makes them so). Nor does it run when its
longest map has fewer than `min_blocks` blocks (the arrays fit the caches as they are; the block loop would
only cost): a chain whose extents are constants that small is left alone, a symbolic one is asked at run
time.
"""

from __future__ import annotations

import copy
import math
from typing import ClassVar, Iterator

import attrs
import dace
import networkx as nx
import sympy
from dace.properties import CodeBlock
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.analysis.access import control_names, runs_right_after
from gradflow.analysis.loops import assigned_symbols
from gradflow.analysis.versions import PREFIX
from gradflow.core.names import private_copies, rename_data
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass
from gradflow.optimize.schedules import make_sequential
from gradflow.transforms.fusion import elementwise_scope

#: bytes one block of the chain's arrays may take (the first-level data cache of common x86 cores)
_BLOCK_BYTES = 32768
#: the most elements an invariant map or copy may have (it runs once per block)
_INVARIANT_ELEMENTS = 64


@attrs.frozen
class _Access:
    data: str
    write: bool
    subset: object
    #: for a tiled piece's access to one element `i + c` (in one dimension, the other indices free of `i`):
    #: `c`, and `where` that dimension and the other indices are
    offset: object = None
    where: object = None


@attrs.frozen(eq=False)
class _Piece:
    state: dace.SDFGState
    #: where the piece starts and ends in its state's dataflow (a map's entry and exit, a tasklet twice,
    #: a copy's two access nodes)
    source: object
    sink: object
    accesses: tuple[_Access, ...]
    #: a tiled map's entry, else None
    entry: nd.MapEntry | None = None
    lo: object = None
    hi: object = None

    @property
    def tiled(self) -> bool:
        return self.entry is not None


def _offset(subset, param: sympy.Symbol):
    """(where, c) where `subset` is one element whose index is `param + c` in one dimension and free of
    `param` in the others (`where`: that dimension and the other indices, as text), else None."""
    found, rest = None, []
    for d, (begin, end, _) in enumerate(subset):
        if dace.symbolic.simplify(begin - end) != 0:
            return None
        if param in dace.symbolic.pystr_to_symbolic(begin).free_symbols:
            c = dace.symbolic.simplify(begin - param)
            if found is not None or param in c.free_symbols:
                return None
            found = (d, c)
        else:
            rest.append(str(begin))
    if found is None:
        return None
    return (found[0], tuple(rest)), found[1]


def _scope_local(state: dace.SDFGState, entry: nd.MapEntry, name: str) -> bool:
    """`name` is a transient every access node of which in the whole SDFG is inside `entry`'s scope."""
    sdfg = state.sdfg
    if not sdfg.arrays[name].transient:
        return False
    inside = set(state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes())
    for other in sdfg.states():
        for node in other.data_nodes():
            if node.data == name and node not in inside:
                return False
    return True


def _edge_accesses(state: dace.SDFGState, edge, exit_=None) -> list[tuple[str, bool, object]] | None:
    """(data, written, subset) of what `edge` reads and writes: the array of the access node at either end
    (or, at a map's entry or exit `exit_`, the array its memlet names); a sum also reads. None where a
    subset is unknown."""
    memlet, found = edge.data, []
    if memlet.is_empty():
        return found
    if edge.dst is exit_:
        found.append((memlet.data, True, memlet.subset))
    elif isinstance(edge.dst, nd.AccessNode):
        found.append((edge.dst.data, True, memlet.get_dst_subset(edge, state)))
    if isinstance(edge.src, nd.AccessNode):
        found.append((edge.src.data, False, memlet.get_src_subset(edge, state)))
    elif isinstance(edge.src, nd.MapEntry):
        found.append((memlet.data, False, memlet.subset))
    if memlet.wcr is not None:
        found += [(name, False, subset) for name, written, subset in found if written]
    return None if any(subset is None for _, _, subset in found) else found


def _scope_accesses(state: dace.SDFGState, entry: nd.MapEntry) -> list[tuple[str, bool, object]] | None:
    """(data, written, subset) of every memlet in or at the boundary of `entry`'s scope, scope-local data
    left out; None where one cannot be told."""
    exit_ = state.exit_node(entry)
    scope = state.scope_subgraph(entry, include_entry=True, include_exit=True)
    inner = {n.data for n in scope.nodes() if isinstance(n, nd.AccessNode)}
    local = {name for name in inner if _scope_local(state, entry, name)}
    found = []
    for edge in scope.edges():
        if edge.src is exit_ or edge.dst is entry:
            continue  # the edges outside the scope only summarize the inner ones
        accesses = _edge_accesses(state, edge, exit_)
        if accesses is None:
            return None
        found += [a for a in accesses if a[0] not in local]
    return found


def _map_piece(state: dace.SDFGState, entry: nd.MapEntry) -> _Piece | None:
    """`entry`'s map as a tiled piece where it is one (offsets filled in later), else as an invariant one;
    None where it is neither (a body that is not element-wise, dynamic range inputs)."""
    if not elementwise_scope(state, entry) or any(not c.startswith("IN_") for c in entry.in_connectors):
        return None
    inside = _scope_accesses(state, entry)
    if inside is None:
        return None
    accesses = tuple(_Access(d, w, s) for d, w, s in inside)
    exit_ = state.exit_node(entry)
    if len(entry.map.params) == 1 and entry.map.range[0][2] == 1:
        begin, end, _ = entry.map.range[0]
        return _Piece(state, entry, exit_, accesses, entry, begin, end + 1)
    return _Piece(state, entry, exit_, accesses)


def _pieces(state: dace.SDFGState) -> list[_Piece] | None:
    """The pieces of `state` in a topological order of its dataflow, or None where it holds anything else."""
    sdfg, scopes, found = state.sdfg, state.scope_dict(), []
    for node in dace.sdfg.utils.dfs_topological_sort(state):
        if scopes[node] is not None or isinstance(node, nd.MapExit):
            continue
        if isinstance(node, nd.AccessNode):
            desc = node.desc(sdfg)
            if isinstance(desc, (dace.data.View, dace.data.Stream)):
                return None
            for edge in state.out_edges(node):
                if isinstance(edge.dst, nd.AccessNode) and not edge.data.is_empty():
                    accesses = _edge_accesses(state, edge)
                    if accesses is None or edge.data.wcr is not None:
                        return None
                    found.append(_Piece(state, node, edge.dst, tuple(_Access(*a) for a in accesses)))
        elif isinstance(node, nd.MapEntry):
            piece = _map_piece(state, node)
            if piece is None:
                return None
            found.append(piece)
        elif isinstance(node, nd.Tasklet):
            accesses = [_edge_accesses(state, e) for e in (*state.in_edges(node), *state.out_edges(node))]
            if any(a is None for a in accesses) or any(e.data.wcr is not None for e in state.out_edges(node)):
                return None
            found.append(_Piece(state, node, node, tuple(_Access(*a) for group in accesses for a in group)))
        else:
            return None  # nested SDFGs, library nodes
    return found


def _disjoint(first, second) -> bool:
    """The two subsets of one array provably share no element."""
    if len(first) != len(second):
        return False
    for (b1, e1, _), (b2, e2, _) in zip(first, second):
        for low, high in ((b1, e2), (b2, e1)):
            gap = dace.symbolic.simplify(low - high)
            if gap.is_number and gap > 0:
                return True
    return False


def _element_range(piece: _Piece, access: _Access):
    """The elements a tiled piece's access covers."""
    dim, rest = access.where
    ranges = [(r, r, 1) for r in rest]
    ranges.insert(dim, (piece.lo + access.offset, piece.hi - 1 + access.offset, 1))
    return dace.subsets.Range([tuple(dace.symbolic.pystr_to_symbolic(v) for v in r) for r in ranges])


@attrs.frozen(eq=False)
class _Chain:
    region: ControlFlowRegion
    states: tuple[dace.SDFGState, ...]
    pieces: tuple[_Piece, ...]
    #: per tiled piece (by position in `pieces`): its shift
    shifts: dict
    block: int
    #: the fewest iterations of its longest map at which the chain runs tiled
    least: int


def _before(a: _Piece, b: _Piece, states: tuple, reach: dict) -> bool:
    """Piece `a` runs before piece `b` (b later in the list): an earlier state, or a dataflow path."""
    if a.state is not b.state:
        return states.index(a.state) < states.index(b.state)
    return b.source in reach[a.state][a.sink]


def _with_offsets(pieces: list[_Piece], written_by_tiled: set[str]) -> list[_Piece]:
    """The pieces, each tiled piece's accesses to data a tiled piece writes given their offset where they
    are `i + c` (`_offset`; the others keep none)."""
    found = []
    for piece in pieces:
        if not piece.tiled:
            found.append(piece)
            continue
        param = dace.symbolic.pystr_to_symbolic(piece.entry.map.params[0])
        accesses = []
        for access in piece.accesses:
            where = _offset(access.subset, param) if access.data in written_by_tiled else None
            accesses.append(access if where is None else attrs.evolve(access, where=where[0], offset=where[1]))
        found.append(attrs.evolve(piece, accesses=tuple(accesses)))
    return found


def _demote(pieces: list[_Piece]) -> list[_Piece]:
    """Tiled pieces whose accesses to data tiled pieces write are not all `i + c`, made invariant, until
    every tiled piece's are (a piece made invariant may stop another's data from being tiled-written)."""
    while True:
        written = {a.data for p in pieces if p.tiled for a in p.accesses if a.write}
        trial = _with_offsets(pieces, written)
        bad = [k for k, p in enumerate(trial) if p.tiled and any(
            a.data in written and a.offset is None for a in p.accesses)]
        if not bad:
            return trial
        for k in bad:
            pieces[k] = attrs.evolve(pieces[k], entry=None, lo=None, hi=None)


def _shifts(pieces: list[_Piece], states: tuple, reach: dict) -> dict | None:
    """The shifts that keep every dependence (module docstring), or None where the chain cannot be tiled."""
    written_by_tiled = {a.data for p in pieces if p.tiled for a in p.accesses if a.write}
    invariant_writes: dict[str, int] = {}
    for k, piece in enumerate(pieces):
        if piece.tiled:
            continue
        reads = {a.data for a in piece.accesses if not a.write}
        writes = {a.data for a in piece.accesses if a.write}
        if reads & written_by_tiled or reads & writes:
            return None
        for name in writes:
            if name in invariant_writes:
                return None
            invariant_writes[name] = k
    # every other access to what an invariant piece writes comes after it; tiled writes there are elsewhere
    for name, k in invariant_writes.items():
        writer = pieces[k]
        mine = [a for a in writer.accesses if a.write and a.data == name]
        for j, piece in enumerate(pieces):
            if j == k:
                continue
            touching = [a for a in piece.accesses if a.data == name]
            if not touching:
                continue
            for access in touching:
                if access.write and not (piece.tiled and all(
                        _disjoint(_element_range(piece, access), m.subset) for m in mine)):
                    return None
            # writes elsewhere need no order; a read must come after the invariant write
            if any(not a.write for a in touching) and (j < k or not _before(writer, piece, states, reach)):
                return None
    shifts: dict[int, int] = {}
    for k, piece in enumerate(pieces):
        if not piece.tiled:
            continue
        bound = 0
        for j in range(k):
            earlier = pieces[j]
            if not earlier.tiled:
                continue
            for a in earlier.accesses:
                for b in piece.accesses:
                    if a.data != b.data or not (a.write or b.write) or a.offset is None or b.offset is None:
                        continue
                    if a.where != b.where or not _before(earlier, piece, states, reach):
                        return None  # other rows of a tape may be the same: not proved apart
                    gap = dace.symbolic.simplify(a.offset - b.offset)
                    if not gap.is_Integer:
                        return None
                    bound = min(bound, shifts[j] + int(gap))
        shifts[k] = bound
    return shifts


def _reachability(state: dace.SDFGState) -> dict:
    graph = state.nx
    return {node: nx.descendants(graph, node) | {node} for node in state.nodes()}


def _worth_it(pieces: list[_Piece], min_extent: int) -> bool:
    """Two or more tiled maps, one reading what an earlier one writes, and one of them large or symbolic."""
    tiled = [p for p in pieces if p.tiled]
    if len(tiled) < 2:
        return False
    written: set[str] = set()
    reused = False
    for piece in tiled:
        if any(not a.write and a.data in written for a in piece.accesses):
            reused = True
        written |= {a.data for a in piece.accesses if a.write}
    if not reused:
        return False
    for piece in tiled:
        extent = dace.symbolic.simplify(piece.hi - piece.lo)
        if not extent.is_number or int(extent) >= min_extent:
            return True
    return False


def _block_size(sdfg: dace.SDFG, pieces: list[_Piece]) -> int:
    """Elements per block: one block of each array the chain's maps step through fills `_BLOCK_BYTES`."""
    names = set()
    for piece in pieces:
        if piece.tiled:
            param = piece.entry.map.params[0]
            names |= {a.data for a in piece.accesses if param in map(str, a.subset.free_symbols)}
    per_element = sum(sdfg.arrays[n].dtype.bytes for n in names) or 8
    return max(256, min(4096, 2 ** int(math.log2(max(1, _BLOCK_BYTES // per_element)))))


def _shapes_known_at_start(sdfg: dace.SDFG, names: set[str]) -> bool:
    """The transients `names` have sizes the program knows from its start (its arguments' symbols): DaCe
    then allocates one shared by two branches once, before both."""
    known = set(sdfg.arglist()) | set(sdfg.constants)
    return all(str(s) in known for n in names for s in sdfg.arrays[n].free_symbols)


def _unused_name(sdfg: dace.SDFG, base: str) -> str:
    """`base`, or `base_k`, named by no array, symbol or interstate assignment of `sdfg`. DaCe's
    `temp_data_name` counts arrays only: its `__tmp2` was the frontend's symbol of an `if`'s condition
    (`__tmp2 = (... > 0.0)` on an edge), and the program no longer validated."""
    taken = set(sdfg.arrays) | set(sdfg.symbols) | control_names(sdfg) | assigned_symbols(sdfg)
    name, k = base, 0
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _in_tiled(block) -> bool:
    """`block` is inside a conditional block this pass made."""
    region = block.parent_graph
    while region is not None and not isinstance(region, dace.SDFG):
        if isinstance(region, ConditionalBlock) and region.label.startswith(PREFIX):
            return True
        region = region.parent_graph
    return False


def _runs(sdfg: dace.SDFG) -> Iterator[tuple[ControlFlowRegion, list[dace.SDFGState], dict]]:
    """Maximal runs of states of a region, each running right after the one before, with their pieces
    (state -> `_pieces`, each state's found once)."""
    pieces: dict = {}

    def pieces_of(state: dace.SDFGState) -> list[_Piece] | None:
        if state not in pieces:
            pieces[state] = _pieces(state)
        return pieces[state]

    for region in sdfg.all_control_flow_regions():
        for state in region.nodes():
            if not isinstance(state, dace.SDFGState) or _in_tiled(state):
                continue
            preds = region.in_edges(state)
            if len(preds) == 1 and isinstance(preds[0].src, dace.SDFGState) and runs_right_after(
                    region, preds[0].src, state) and pieces_of(preds[0].src) is not None:
                continue  # not the first of its run
            run = []
            current = state
            while current is not None and pieces_of(current) is not None:
                run.append(current)
                nxt = region.out_edges(current)
                current = (nxt[0].dst if len(nxt) == 1 and isinstance(nxt[0].dst, dace.SDFGState)
                           and runs_right_after(region, current, nxt[0].dst) else None)
            if run:
                yield region, run, {s: pieces[s] for s in run}


def _cheap(piece: _Piece) -> bool:
    """An invariant piece runs once per block: a tasklet, or a map or copy of a few elements."""
    if isinstance(piece.source, nd.Tasklet):
        return True
    if isinstance(piece.source, nd.MapEntry):
        count = dace.symbolic.simplify(piece.source.map.range.num_elements())
    else:
        count = dace.symbolic.simplify(piece.accesses[-1].subset.num_elements())
    return count.is_number and int(count) <= _INVARIANT_ELEMENTS


def _chain(region: ControlFlowRegion, states: list[dace.SDFGState], min_blocks: int, pieces_of: dict,
           reach: dict, block: int | None = None) -> _Chain | None:
    """The chain of `states` where it can be tiled and is worth it, else None (`pieces_of`: state -> its
    pieces; `reach`: state -> its reachability, filled on the way)."""
    pieces = _demote([p for s in states for p in pieces_of[s]])
    block = block or _block_size(region.sdfg, pieces)
    if not _worth_it(pieces, min_blocks * block) or not all(p.tiled or _cheap(p) for p in pieces):
        return None
    states_t = tuple(states)
    for state in states:
        if state not in reach:
            reach[state] = _reachability(state)
    shifts = _shifts(pieces, states_t, reach)
    if shifts is None:
        return None
    sdfg = region.sdfg
    shared = {n.data for s in states for n in s.data_nodes() if n.desc(sdfg).transient}
    if not _shapes_known_at_start(sdfg, shared):
        return None
    return _Chain(region, states_t, tuple(pieces), shifts, block, min_blocks * block)


def _chains(region: ControlFlowRegion, states: list[dace.SDFGState], pieces_of: dict, min_blocks: int,
            block: int | None = None) -> Iterator[_Chain]:
    """Chains within a run of states (`pieces_of`: state -> its pieces): from its first state the longest
    that can be tiled, then on after it (a state that cannot be part of any is passed over)."""
    reach: dict = {}
    start = 0
    while start < len(states):
        for end in range(len(states), start, -1):
            chain = _chain(region, states[start:end], min_blocks, pieces_of, reach, block)
            if chain is not None:
                yield chain
                start = end
                break
        else:
            start += 1


def _scope_locals(states) -> set[str]:
    """Transients accessed only inside one map scope of `states`."""
    found = set()
    for state in states:
        scopes = state.scope_dict()
        for node in state.data_nodes():
            entry = scopes[node]
            if entry is not None and _scope_local(state, entry, node.data):
                found.add(node.data)
    return found


def _tile(chain: _Chain) -> None:
    region, sdfg = chain.region, chain.region.sdfg
    first, last = chain.states[0], chain.states[-1]
    label = f"{first.label}_tiled"
    threads = sdfg.find_new_symbol("gf_threads")
    t = sdfg.find_new_symbol("gf_block")
    sdfg.add_symbol(threads, dace.int32)

    # the tiled copy: the same states, their maps' ranges limited to the block
    copies = [copy.deepcopy(s) for s in chain.states]
    for state_copy in copies:
        state_copy.label = f"{state_copy.label}_block"
    block, tsym = chain.block, dace.symbolic.pystr_to_symbolic(t)
    limited, starts, ends = [], [], []
    for k, piece in enumerate(chain.pieces):
        if piece.tiled:
            o = chain.shifts[k]
            state_copy = copies[chain.states.index(piece.state)]
            entry = state_copy.nodes()[piece.state.nodes().index(piece.entry)]
            limited.append((state_copy, entry, sympy.Max(piece.lo, tsym + o), sympy.Min(piece.hi, tsym + o + block)))
            starts.append(piece.lo - o)
            ends.append(piece.hi - o)
    loop = LoopRegion(f"{label}_blocks", condition_expr=f"{t} < {dace.symbolic.symstr(sympy.Max(*ends))}",
                      loop_var=t, initialize_expr=f"{t} = {dace.symbolic.symstr(sympy.Min(*starts))}",
                      update_expr=f"{t} = {t} + {block}", sdfg=sdfg)
    for k, state_copy in enumerate(copies):
        loop.add_node(state_copy, is_start_block=k == 0)
        if k:
            loop.add_edge(copies[k - 1], state_copy, dace.InterstateEdge())

    # the untouched chain, for more than one thread
    incoming = [(e.src, e.data) for e in region.in_edges(first)]
    outgoing = [(e.dst, e.data) for e in region.out_edges(last)]
    was_start = region.start_block is first
    inner = [(e.src, e.dst, e.data) for s in chain.states[:-1] for e in region.out_edges(s)]
    for state in chain.states:
        region.remove_node(state)
    untouched = ControlFlowRegion(f"{label}_threads", sdfg=sdfg)
    for k, state in enumerate(chain.states):
        untouched.add_node(state, is_start_block=k == 0)
    for src, dst, data in inner:
        untouched.add_edge(src, dst, data)
    tiled = ControlFlowRegion(f"{label}_one_thread", sdfg=sdfg)
    tiled.add_node(loop, is_start_block=True)

    ask = dace.SDFGState(f"{label}_ask_threads")
    count = sdfg.add_scalar(_unused_name(sdfg, "gf_thread_count"), dace.int32, transient=True)[0]
    tasklet = ask.add_tasklet("omp_threads", {}, {"__out"}, "__out = omp_get_max_threads();",
                              language=dace.Language.CPP, code_global="#include <omp.h>")
    ask.add_edge(tasklet, "__out", ask.add_access(count), None, dace.Memlet(f"{count}[0]"))
    choice = ConditionalBlock(f"{PREFIX}{first.label}", sdfg=sdfg)
    longest = sympy.Max(*(p.hi - p.lo for p in chain.pieces if p.tiled))
    condition = f"{threads} == 1"
    if not dace.symbolic.simplify(longest).is_number:
        condition += f" and ({dace.symbolic.symstr(longest, cpp_mode=False)}) >= {chain.least}"
    choice.add_branch(CodeBlock(condition), tiled)
    choice.add_branch(None, untouched)
    region.add_node(ask, is_start_block=was_start)
    region.add_node(choice)
    region.add_edge(ask, choice, dace.InterstateEdge(assignments={threads: count}))
    for src, data in incoming:
        region.add_edge(src, ask, data)
    for dst, data in outgoing:
        region.add_edge(choice, dst, data)

    # in place: the copies' scope-local data of their own, their limited maps sequential
    fresh = private_copies(sdfg, _scope_locals(chain.states), "_blk")
    for state_copy in copies:
        rename_data(state_copy, fresh)
    for state_copy, entry, low, high in limited:
        entry.map.range = dace.subsets.Range([(low, high - 1, 1)])
        make_sequential(state_copy, entry)


@register_pass
@attrs.frozen
class TileElementChains(RewritePass):
    """Chains of element-wise maps reading each other at constant offsets run block by block on one
    thread (see the module docstring)."""

    #: the fewest blocks of the longest map at which the chain runs tiled
    min_blocks: int = 4
    #: elements per block (None: `_BLOCK_BYTES` of the chain's arrays); tests and the fuzzer take a few
    #: elements, so that small programs cross block edges (`GRADFLOW_TILE_BLOCK`, `optimize/__init__.py`)
    block: int | None = None
    name: ClassVar[str] = "tile_element_chains"
    strategy: ClassVar[str] = ONE_AT_A_TIME
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> Iterator[_Chain]:
        for region, states, pieces_of in _runs(sdfg):
            yield from _chains(region, states, pieces_of, self.min_blocks, self.block)

    def rewrite(self, sdfg: dace.SDFG, match: _Chain) -> None:
        _tile(match)
