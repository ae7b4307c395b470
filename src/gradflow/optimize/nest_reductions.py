"""`nest_reductions`: a map whose iterations sum into shared elements runs those sums without atomics.

A map `out[i, j] += a[i, k] * b[k, j]` over (i, j, k) adds into each output element from every k: a
write-conflict sum that DaCe emits as one atomic update per iteration (a compare-and-swap loop on
floating types, also on one thread) because the map is parallel over k too. Contractions lowered from
ONNX (convolutions, Einsum) have this form in the forward, and reverse mode creates it everywhere: the
adjoint of a read that ignores a parameter (`w[m, c]` read for every n) is a sum over that parameter
(`gw[m, c] += ...` over n). Max and min reductions (a MaxPool window; a minimum `reduce_in_maps` moved
into the map computing its terms) get the same nesting, registers included, starting from the identity
(minus or plus infinity for floats): for them DaCe's atomic update on floating types is an OpenMP
critical section.

The parameters that *own* the outputs are those that index some dimension of every conflicting output
alone, as `a * p + b` with `a >= 1` and no other parameter in that dimension: two iterations with
different values of them write different elements. This pass expands the map into nested maps: the
outermost (the first owner) stays parallel, the others are sequential loops inside it. Where the owners
alone fix the element each sum adds to (and the sum is long enough), they go first and the sum runs in
registers; otherwise the other parameters keep the map's order (its memory layout). Each thread then
owns the elements it adds into, and the sums are plain `+=` (DaCe decides atomics per enclosing map from
the same criterion). A target summed through several subsets (`gb[q]`, `gb[q + 256]`) is owned where
they never meet across owner values (`_apart`), and each subset then leaves the map through a connector of
its own. Maps with no owner are left alone (parallel with atomics, or sequential where DaCe's own check
would let their adds race: `runtime/races.py`; `choose_schedules` handles the one-element case), as are
maps whose sum targets are also written plainly in the map.

Where the one owner is the unit-stride index of every access that uses it (a bias gradient `gb[j] +=
g[i, j]`, a LayerNorm weight's), owners first would walk every array down its columns: 32 rows 2 KiB
apart fall into two sets of the L1 cache, and the MLP's bias gradients (reading `g`, writing its copy)
missed it on every access (74 us per 32x512 map, a fifth of the MLP's forward+backward). Such a map is
instead cut into tiles of `OWNER_TILE` consecutive owner values, parallel over tiles, with the owner the
innermost loop: rows are read along memory and each element of a tile is added to, in the rows' order,
by the one thread that owns the tile (3.4 us).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs
import dace
import sympy
from dace import symbolic
from dace.frontend.operations import detect_reduction_type
from dace.sdfg import nodes as nd
from dace.sdfg.propagation import propagate_memlet
from dace.transformation.dataflow import MapExpansion, StripMining

from gradflow.analysis import indices
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass

#: write-conflict reductions this pass reorders, also through registers. A max or min DaCe makes an OpenMP
#: critical section per update on floating types (a MaxPool's window: 22% of LeNet's time at two threads in
#: GOMP_critical_start/end)
_REORDERED = (dace.dtypes.ReductionType.Sum, dace.dtypes.ReductionType.Max, dace.dtypes.ReductionType.Min)


def owns(subset, param: str, params: set[str]) -> bool:
    """Some single-element dimension of `subset` is `a * param + b`, a >= 1, with no other parameter."""
    sym = symbolic.pystr_to_symbolic(param)
    for begin in indices.point_indices(subset):
        row = indices.affine_row(begin, [sym], params - {param})
        if row is not None and row[0] >= 1:
            return True
    return False


def _image(begin, param: str, bounds) -> tuple[int, int] | None:
    """The constant interval `begin` (an expression in `param` alone) spans while `param` runs over
    `bounds` (first, last), or None where it is not a constant interval."""
    lo, hi = (sympy.sympify(begin).subs(symbolic.pystr_to_symbolic(param), b) for b in bounds)
    lo, hi = symbolic.simplify(lo), symbolic.simplify(hi)
    if not (lo.is_Integer and hi.is_Integer):
        return None
    return min(int(lo), int(hi)), max(int(lo), int(hi))


def _apart(subsets: list, param: str, params: set[str], bounds) -> bool:
    """Sums into one array through several subsets (`gb[q]` and `gb[q + 256]`: an LSTM's two bias
    vectors stored end to end; `g[b, j + 64 k]`: its four gate blocks) meet no other value of `param`'s
    elements when, in some dimension, every subset is an expression in `param` alone that `param` owns,
    and any two of them are the same expression or span disjoint intervals over `param`'s range."""
    for dim in range(len(subsets[0])):
        exprs = []
        for subset in subsets:
            begin, end, _ = subset.ndrange()[dim]
            names = {str(x) for x in sympy.sympify(begin).free_symbols}
            if symbolic.simplify(begin - end) != 0 or names & params != {param}:
                break
            exprs.append(sympy.sympify(begin))
        else:
            if all(_same_or_disjoint(x, y, param, bounds) for i, x in enumerate(exprs) for y in exprs[i + 1:]):
                return True
    return False


def _same_or_disjoint(x, y, param: str, bounds) -> bool:
    if symbolic.simplify(x - y) == 0:
        return True
    a, b = _image(x, param, bounds), _image(y, param, bounds)
    return a is not None and b is not None and (a[1] < b[0] or b[1] < a[0])


def owners(state: dace.SDFGState, entry: nd.MapEntry) -> list[str] | None:
    """The parameters owning every write-conflict sum leaving the map (in the map's order), or None when
    there is nothing to change: no sums, sums already owned by every parameter, or outputs written in
    ways the criterion cannot vouch for (a sum target also written otherwise; written through several
    subsets, unless `_apart` shows they never meet)."""
    params = list(entry.map.params)
    out_edges = [e for e in state.in_edges(state.exit_node(entry)) if not e.data.is_empty()]
    sums = [e for e in out_edges if e.data.wcr is not None]
    if not sums or any(e.data.subset is None for e in out_edges):
        return None
    if any(detect_reduction_type(e.data.wcr) not in _REORDERED for e in sums):
        return None
    summed = {e.data.data for e in sums}
    if any(e.data.wcr is None and e.data.data in summed for e in out_edges):
        return None  # a sum target also written plainly
    targets: dict[str, dict[str, object]] = {}
    for e in sums:
        targets.setdefault(e.data.data, {})[str(e.data.subset)] = e.data.subset
    bounds = {p: (b, e) for p, (b, e, _) in zip(params, entry.map.range.ranges)}
    shared = [list(subsets.values()) for subsets in targets.values() if len(subsets) > 1]
    owned = [p for p in params if all(owns(e.data.subset, p, set(params)) for e in sums)
             and all(_apart(subsets, p, set(params), bounds[p]) for subsets in shared)]
    if not owned or len(owned) == len(params):
        return None
    return owned


def _candidates(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.MapEntry, list[str]]]:
    found = []
    for state in sdfg.states():
        for node in state.nodes():
            if (isinstance(node, nd.MapEntry) and state.entry_node(node) is None
                    and node.map.schedule == dace.ScheduleType.Default):
                owned = owners(state, node)
                if owned is not None:
                    found.append((state, node, owned))
    return found


def _fixed_by(state: dace.SDFGState, entry: nd.MapEntry, owned: list[str]) -> bool:
    """Some sum's element depends on the owners alone (`y[i] += A[i, k] x[k]`, `gscale[c] += ...`), so
    the loops over the other parameters, run inside the owners', add into one element: a register can
    hold it."""
    params = set(entry.map.params)
    sums = [e for e in state.in_edges(state.exit_node(entry)) if e.data.wcr is not None and not e.data.is_empty()]
    if any(detect_reduction_type(e.data.wcr) not in _REORDERED for e in sums):
        return False  # the register code starts from the identity of a sum, a max or a min
    return any(fixed_by(e.data.subset, owned, params) for e in sums)


def fixed_by(subset, owned, params: set[str]) -> bool:
    """The element `subset` names depends on no map parameter but the `owned` ones."""
    return {str(s) for s in subset.free_symbols} & params <= set(owned)


#: a sum over fewer iterations than this per element is not worth a register (zeroing and adding it back
#: cost about as much), and the map's own order may vectorize instead
MIN_REGISTER_SUM = 16


def _summed(entry: nd.MapEntry, owned):
    """How many iterations the non-owner parameters span (symbolic where the map is)."""
    count = 1
    for p, (begin, end, step) in zip(entry.map.params, entry.map.range.ranges):
        if p not in owned:
            count *= (end - begin + 1) // step
    return symbolic.simplify(count)


def long_enough(entry: nd.MapEntry, owned) -> bool:
    """Whether each element the `owned` parameters fix gets `MIN_REGISTER_SUM` terms or more (or a symbolic
    count) from the other parameters: worth a register."""
    summed = _summed(entry, owned)
    return not (summed.is_Integer and int(summed) < MIN_REGISTER_SUM)


def _split_sum_connectors(state: dace.SDFGState, entry: nd.MapEntry) -> None:
    """Sums into one array through several subsets leave a map through one connector, whose memlet spans
    them all (`gb[q:q + 17]` for `gb[q]` and `gb[q + 16]`): DaCe would call that a conflict between the
    owner's iterations and make every add atomic, and no register could hold it. One connector per
    subset keeps each memlet an element of the owner's. (MapExpansion merges connectors by array, so
    this runs on the expanded chain.)"""
    exit_ = state.exit_node(entry)
    for conn in sorted(exit_.in_connectors):
        inner = [e for e in state.in_edges(exit_) if e.dst_conn == conn]
        groups: dict[str, list] = {}
        for e in inner:
            groups.setdefault(str(e.data.subset), []).append(e)
        if len(groups) < 2 or any(e.data.wcr is None for e in inner):
            continue
        [outer] = [e for e in state.out_edges(exit_) if e.src_conn == "OUT_" + conn[3:]]
        for k, edges in enumerate(groups.values()):
            name = f"{conn[3:]}_part{k}"
            exit_.add_in_connector("IN_" + name)
            exit_.add_out_connector("OUT_" + name)
            for e in edges:
                state.remove_edge(e)
                state.add_edge(e.src, e.src_conn, exit_, "IN_" + name, e.data)
            spread = propagate_memlet(state, edges[0].data, entry, False)
            spread.wcr = outer.data.wcr
            state.add_edge(exit_, "OUT_" + name, outer.dst, outer.dst_conn, spread)
        state.remove_edge(outer)
        exit_.remove_in_connector(conn)
        exit_.remove_out_connector("OUT_" + conn[3:])


#: consecutive owner values one thread sums, innermost, where the owner is the unit-stride index (module doc)
OWNER_TILE = 64


def _unit_stride_owner(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry,
                       owned: list[str]) -> tuple[int, bool] | None:
    """(tile size, whether it divides the owner's extent) for `_tile_owner` when the map has one owner,
    every memlet in the map that uses the owner moves by one element per owner step (its row-major offset
    has derivative 1 in the owner), and each sum target is written through one subset; else None. A
    constant extent is tiled when `OWNER_TILE` (or half of it) divides it into two tiles or more; a symbolic
    one (k-means' K centroids) in tiles of `OWNER_TILE`, the last one cut short."""
    if len(owned) != 1:
        return None
    owner = owned[0]
    begin, end, step = entry.map.range.ranges[entry.map.params.index(owner)]
    extent = symbolic.simplify(end - begin + 1)
    if step != 1:
        return None
    if extent.is_Integer:
        tile = next((t for t in (OWNER_TILE, OWNER_TILE // 2) if int(extent) % t == 0 and int(extent) >= 2 * t),
                    None)
        if tile is None:
            return None
        found = (tile, True)
    elif extent.is_Number:
        return None
    else:
        found = (OWNER_TILE, False)
    sym = symbolic.pystr_to_symbolic(owner)
    edges = [*state.out_edges(entry), *state.in_edges(state.exit_node(entry))]
    subsets: dict[str, set[str]] = {}
    for e in edges:
        if e.data.wcr is not None and not e.data.is_empty():
            subsets.setdefault(e.data.data, set()).add(str(e.data.subset))
    if any(len(found) > 1 for found in subsets.values()):
        return None  # sums into one array through several subsets: the tile's memlet would span them
    used = 0
    for e in edges:
        if e.data.is_empty() or e.data.subset is None:
            continue
        if e.data.subset.num_elements() != 1:
            return None
        desc = sdfg.arrays[e.data.data]
        flat = sum((sympy.sympify(b) * s for (b, _, _), s in zip(e.data.subset.ndrange(), desc.strides)),
                   sympy.Integer(0))
        slope = symbolic.simplify(sympy.diff(flat, sym))
        if slope == 0:
            continue
        if slope != 1:
            return None
        used += 1
    return found if used else None


def _tile_owner(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry, owner: str, tile: int,
                divides: bool) -> None:
    """Parallel over tiles of `tile` owner values; inside, the other parameters in the map's order, then
    the owner's values of the tile (module doc). Each tile's sums stay within its own elements, so DaCe
    emits plain additions (its check of the tile map's memlets agrees)."""
    outer = _outer_memlets(state, entry)
    m = entry.map
    order = [p for p in m.params if p != owner] + [owner]
    perm = [m.params.index(p) for p in order]
    ranges, tiles = m.range.ranges, m.range.tile_sizes
    m.params = order
    m.range = dace.subsets.Range([ranges[k] for k in perm])
    m.range.tile_sizes = [tiles[k] for k in perm]
    StripMining.apply_to(sdfg, options={"dim_idx": len(order) - 1, "tile_size": tile, "divides_evenly": divides},
                         map_entry=entry, save=False, verify=False)
    m.schedule = dace.ScheduleType.Sequential  # the tile map StripMining put outside keeps the old schedule
    # an uneven last tile's bound is a `SymExpr` (exact `Min(end, t + tile - 1)`, approximate `t + tile - 1`):
    # the exact expression, which the passes after this one read
    m.range = dace.subsets.Range([tuple(x.expr if isinstance(x, symbolic.SymExpr) else x for x in r)
                                  for r in m.range.ranges])
    MapExpansion.apply_to(sdfg, options={"inner_schedule": dace.ScheduleType.Sequential}, map_entry=entry,
                          save=False, verify=False)
    _restore_outer_memlets(state, outer)


def _outer_edges(state: dace.SDFGState, entry: nd.MapEntry) -> list:
    """(the outside end of the edge, the edge) for each edge between a map and the rest of its state."""
    return [*((("in", e.src, e.src_conn), e) for e in state.in_edges(entry)),
            *((("out", e.dst, e.dst_conn), e) for e in state.out_edges(state.exit_node(entry)))]


def _outermost_maps(state: dace.SDFGState) -> set:
    return {n for n, scope in state.scope_dict().items() if isinstance(n, nd.MapEntry) and scope is None}


def _outer_memlets(state: dace.SDFGState, entry: nd.MapEntry) -> tuple[set, dict]:
    """The state's other outermost maps, and copies of the memlets between `entry`'s map and the rest of
    its state by the outside end of each edge (none when two edges share an end: then nothing is put back)."""
    edges = _outer_edges(state, entry)
    memlets = {key: dace.Memlet.from_memlet(e.data) for key, e in edges}
    return _outermost_maps(state) - {entry}, (memlets if len(memlets) == len(edges) else {})


def _restore_outer_memlets(state: dace.SDFGState, outer: tuple[set, dict]) -> None:
    """Strip mining a map whose last tile is cut short leaves its outer memlets as DaCe's propagation
    re-derives them: over `Min(end, t + tile - 1)` they come out dynamic and bounded by an expression no
    analysis can compare, so the map's whole-array write (what `overwritten_before_read` and the runner's
    allocation of left-out gradients rest on) is lost. Tiling only regroups the same iterations, each
    accessing what it did before, so the outer memlets are the map's own: put back on the one outermost
    map the tiling left in the state's place of the old one."""
    others, memlets = outer
    new = list(_outermost_maps(state) - others)
    if len(new) != 1 or not memlets:
        return
    for key, e in _outer_edges(state, new[0]):
        if key in memlets:
            e.data = dace.Memlet.from_memlet(memlets[key])


def _nest(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry, owned: list[str]) -> None:
    tiling = _unit_stride_owner(sdfg, state, entry, owned)
    if tiling is not None:
        _tile_owner(sdfg, state, entry, owned[0], *tiling)
        return
    m = entry.map
    registers = _fixed_by(state, entry, owned) and long_enough(entry, owned)
    # Owners first where the sums can then run in registers (and are long enough to pay for one);
    # otherwise only the first owner moves out and the rest keep the map's order, the one the lowering
    # chose for its memory layout: for the adjoint of an unfolding (`gx[n, c, o + k] += gcol[..]`) owners
    # first would read gcol with a stride of its row. A depthwise 3x3 convolution (9 terms per output)
    # adds into its output directly (the MobileNet stack: 5.5 ms with registers, 5.2 ms without, one run).
    order = owned + [p for p in m.params if p not in owned] if registers else \
        [owned[0]] + [p for p in m.params if p != owned[0]]
    perm = [m.params.index(p) for p in order]
    ranges, tiles = m.range.ranges, m.range.tile_sizes
    m.params = order
    m.range = dace.subsets.Range([ranges[k] for k in perm])
    m.range.tile_sizes = [tiles[k] for k in perm]
    MapExpansion.apply_to(sdfg, options={"inner_schedule": dace.ScheduleType.Sequential}, map_entry=entry,
                          save=False, verify=False)
    # the expansion is a chain of one-parameter maps, owners outermost
    chain = [entry]
    while True:
        inner = [n for n in state.scope_children()[chain[-1]] if isinstance(n, nd.MapEntry)]
        if len(inner) != 1 or len(chain) == len(order):
            break
        chain.append(inner[0])
    for level in reversed(chain):  # innermost first: each level propagates the parts of the one inside
        _split_sum_connectors(state, level)
    if registers and len(chain) == len(order):
        _accumulate_in_registers(sdfg, state, chain[len(owned) - 1], chain[len(owned)], chain[-1])


#: lanes a register accumulator gets: the innermost loop's extent, when it is a constant in this range
#: (below a vector's width of lanes the zeroing and folding cost more than they save)
MIN_LANES, MAX_LANES = 8, 64


def _lanes(loop: nd.MapEntry) -> tuple[str, int, object] | None:
    """(parameter, extent, begin) of the innermost sequential loop when its extent is a constant from
    MIN_LANES to MAX_LANES with unit step: its iterations then sum into lanes of their own."""
    (begin, end, step), = loop.map.range.ranges
    extent = symbolic.simplify(end - begin + 1)
    if step != 1 or not extent.is_Integer or not MIN_LANES <= int(extent) <= MAX_LANES:
        return None
    return loop.map.params[0], int(extent), begin


def _accumulate_in_registers(sdfg: dace.SDFG, state: dace.SDFGState, owner: nd.MapEntry,
                             loop: nd.MapEntry, innermost: nd.MapEntry) -> None:
    """Each sum into one element per iteration of the owner maps goes through local lanes (see
    `accumulate_in_register`). Iteration q of the innermost loop adds into lane q, so that loop has no
    dependence from one iteration to the next and vectorizes; without -ffast-math a single accumulator
    chains every add on the previous one (4 cycles each: a BatchNorm's channel sums ran at 0.8 ns per
    element). The lanes are summed in order at the end; a single loop of unknown or large extent gets one
    lane."""
    owner_exit, loop_exit = state.exit_node(owner), state.exit_node(loop)
    lanes = _lanes(innermost)
    for e in list(state.edges_between(loop_exit, owner_exit)):
        if e.data.wcr is None or e.data.is_empty() or e.data.subset.num_elements() != 1:
            continue
        accumulate_in_register(sdfg, state, e, loop, lanes, opener=owner)


def _identity_and_combine(kind, dtype) -> tuple[str, Callable[[str, str], str]]:
    """C++ for the start of an accumulator of a sum, a max or a min of `dtype` elements (the identity: for a
    max of floats minus infinity, so that a max of infinities is one), and for combining two values."""
    ctype = dtype.ctype
    floating = dtype in (dace.float16, dace.float32, dace.float64)
    if kind == dace.dtypes.ReductionType.Max:
        low = f"-std::numeric_limits<{ctype}>::infinity()" if floating else f"std::numeric_limits<{ctype}>::lowest()"
        return low, lambda a, b: f"({b} > {a} ? {b} : {a})"
    if kind == dace.dtypes.ReductionType.Min:
        high = f"std::numeric_limits<{ctype}>::infinity()" if floating else f"std::numeric_limits<{ctype}>::max()"
        return high, lambda a, b: f"({b} < {a} ? {b} : {a})"
    return f"{ctype}(0)", lambda a, b: f"{a} + {b}"


def accumulate_in_register(sdfg: dace.SDFG, state: dace.SDFGState, edge, loop: nd.MapEntry,
                           lanes: tuple[str, int, object] | None = None, opener: nd.Node | None = None) -> None:
    """The sum (or max, or min) `edge` carries out of `loop`'s exit into one element goes through a local
    `Register` transient (registers: the C++ compiler cannot keep an element of a heap array in one, as it
    may alias the other arrays the loop touches): set to the identity before `loop` (after `opener`, when
    given), combined into by the loop's iterations (`lanes`: iteration q of that loop parameter into lane
    q, `_lanes`), and combined into the element once after it."""
    loop_exit = state.exit_node(loop)
    # in the element's type: float64 accumulators for float32 elements were tried and made a float32
    # ResNet block's gradients 100x further from float64 torch's (1.2e-2 vs 9e-5), not closer
    dtype = sdfg.arrays[edge.data.data].dtype
    width = lanes[1] if lanes is not None else 1
    # one lane is a scalar, not a one-element array: `omp simd reduction` over an array section makes
    # GCC 12 add the vector's lanes into it one by one (a dependent chain), over a scalar it keeps
    # partial sums in vector registers (`simd_sums`)
    if width == 1:
        acc, _ = sdfg.add_scalar(f"gradflow_acc_{edge.data.data}", dtype, transient=True,
                                 storage=dace.StorageType.Register, find_new_name=True)
    else:
        acc, _ = sdfg.add_array(f"gradflow_acc_{edge.data.data}", [width], dtype, transient=True,
                                storage=dace.StorageType.Register, find_new_name=True)
    whole = f"0:{width}"
    state.remove_edge(edge)
    total = state.add_access(acc)
    into = state.add_edge(loop_exit, edge.src_conn, total, None, dace.Memlet(data=acc, subset=whole, wcr=edge.data.wcr))
    for t in state.memlet_tree(into):
        if t is into:
            continue
        leaf = not isinstance(t.src, nd.ExitNode)
        lane = f"{lanes[0]} - ({lanes[2]})" if lanes is not None and leaf else "0"
        # a dynamic write (a tasklet adding only on some paths) stays dynamic
        t.data = dace.Memlet(data=acc, subset=lane if leaf or lanes is None else whole, wcr=t.data.wcr,
                             dynamic=t.data.dynamic)
    ctype = dtype.ctype
    start_value, combine = _identity_and_combine(detect_reduction_type(edge.data.wcr), dtype)
    # a one-element memlet reaches a tasklet as a value, a longer one as a pointer; connector names no
    # program array can have (DaCe rejects a connector named like an array: nb_go_fast has an `a`)
    clear = (f"for (int l = 0; l < {width}; ++l) __gf_o[l] = {start_value};" if width > 1
             else f"__gf_o = {start_value};")
    zero = state.add_tasklet(f"zero_{acc}", {}, {"__gf_o": None}, clear, language=dace.dtypes.Language.CPP)
    start = state.add_access(acc)
    if opener is not None:
        state.add_nedge(opener, zero, dace.Memlet())
    state.add_edge(zero, "__gf_o", start, None, dace.Memlet(data=acc, subset=whole))
    state.add_nedge(start, loop, dace.Memlet())
    summed = (f"{ctype} gradflow_lanes = __gf_a[0];\n"
              f"for (int l = 1; l < {width}; ++l) gradflow_lanes = {combine('gradflow_lanes', '__gf_a[l]')};\n"
              "__gf_o = gradflow_lanes;") if width > 1 else "__gf_o = __gf_a;"
    fold = state.add_tasklet(f"fold_{acc}", {"__gf_a": None}, {"__gf_o": None}, summed,
                             language=dace.dtypes.Language.CPP)
    state.add_edge(total, None, fold, "__gf_a", dace.Memlet(data=acc, subset=whole))
    # one addition into the element (not a dynamic write, which DaCe leaves to the tasklet's code)
    state.add_edge(fold, "__gf_o", edge.dst, edge.dst_conn,
                   dace.Memlet(data=edge.data.data, subset=edge.data.subset, wcr=edge.data.wcr))


@register_pass
@attrs.frozen
class NestReductions(RewritePass):
    """Maps summing into elements some of their parameters own: parallel over those, sequential over
    the rest (see the module docstring)."""

    name: ClassVar[str] = "nest_reductions"

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        state, entry, owned = match
        _nest(sdfg, state, entry, owned)
