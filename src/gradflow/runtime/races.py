"""Write-conflict sums that DaCe would emit as plain additions in a parallel loop, checked before a build.

DaCe's CPU code generator writes a write-conflict sum (`y[i + k] += ...`) as a plain `+=` when it judges
that no two threads can add into the same element, and as an atomic update otherwise. Its judgement
(`is_write_conflicted` in `dace.codegen.targets.cpp`) asks, for each parameter `p` of a parallel map
separately, whether some dimension of the index is `a * p + b` with `a >= 1`; `b` may hold the map's
other parameters. `y[i + k]` over a map on (i, k) passes for `i` (b = k) and for `k` (b = i), so the map
runs `#pragma omp parallel for` over `i` with unprotected adds into elements other values of `i` also add
into: a data race, a wrong sum whenever two threads meet on an element. Reverse mode makes such sums
from every read with a shifted index (the adjoint of `x[i + k]` in a correlation is `gx[i + k] += ...`).

Before a build, every sum DaCe would leave unprotected is checked here with a sound criterion for each
parallel map it leaves: iterations that differ in the map's parallel parameters (the first `collapse`
ones, which OpenMP shares out) write disjoint elements, because some dimensions of the index depend on
those parameters alone, affinely with constant coefficients, and determine them. A map that fails runs
sequentially (the adds are then correct as plain adds; the program's other maps are unchanged). The
build runs it on the SDFG as the code generator will see it: library nodes expanded (their expansions
make maps too), default schedules set.
"""

from __future__ import annotations

from typing import Any

import dace
import sympy
from dace import symbolic
from dace.codegen.targets.cpp import is_write_conflicted
from dace.sdfg import nodes as nd

from gradflow.analysis import indices
from gradflow.core.errors import CompilationError

_SEQUENTIAL = (dace.ScheduleType.Sequential, dace.ScheduleType.Snitch)


def _span(expr, entry: nd.MapEntry, shared: list[sympy.Symbol]):
    """max - min of `expr` (affine with constant coefficients in the map's parameters other than `shared`,
    which it must not use) over the map's ranges, or None."""
    expr = sympy.expand(sympy.sympify(expr))
    if expr.free_symbols & set(shared):
        return None
    span = sympy.Integer(0)
    for p, (begin, end, _) in zip(entry.map.params, entry.map.range.ranges):
        sym = symbolic.pystr_to_symbolic(p)
        c = sympy.diff(expr, sym)
        if c == 0:
            continue
        if c.free_symbols or not c.is_number:
            return None
        span += abs(c) * (sympy.sympify(end) - sympy.sympify(begin))
    rest = expr.free_symbols & {symbolic.pystr_to_symbolic(p) for p in entry.map.params}
    if any(sympy.diff(expr, r).free_symbols for r in rest):
        return None
    return symbolic.simplify(span)


def disjoint_across_threads(entry: nd.MapEntry, subset) -> bool:
    """Whether iterations of the map `entry` that differ in its parallel parameters write disjoint parts
    of `subset` (the part one iteration writes, in terms of the map's parameters). Every parameter of a CUDA
    kernel's map is parallel; OpenMP shares out the first `collapse`."""
    m = entry.map
    count = len(m.params) if m.schedule in dace.dtypes.GPU_SCHEDULES else max(1, int(m.collapse))
    shared = [symbolic.pystr_to_symbolic(p) for p in m.params[:count]]
    others = {symbolic.pystr_to_symbolic(p) for p in m.params[count:]}
    steps = [step for (_, _, step) in m.range.ranges[:count]]
    rows = []
    for begin, end, _ in subset.ndrange():
        row = indices.affine_row(begin, shared, others)
        if row is not None and symbolic.simplify(end - begin) == 0:
            rows.append(row)
            continue
        if count != 1:
            continue
        # a block per value of the one parallel parameter p: a p + (the other parameters' part) ... up to the
        # block's end; blocks do not meet when each spans less than the distance between two consecutive
        # values of p (`y[32 p + k]` with k < 32; `gb[t : t + 63]` for tiles t 64 apart)
        p = shared[0]
        a = sympy.diff(sympy.expand(sympy.sympify(begin)), p)
        if a == 0 or a.free_symbols or not a.is_number or sympy.diff(sympy.expand(sympy.sympify(end)), p) != a:
            continue
        spread = _span(sympy.expand(sympy.sympify(begin)) - a * p, entry, shared)
        width = sympy.sympify(symbolic.simplify(end - begin))
        if spread is None or width.free_symbols & {symbolic.pystr_to_symbolic(q) for q in entry.map.params}:
            continue
        reach = sympy.sympify(spread) + width  # from the first element any iteration with this p writes to the last
        if (reach < abs(a * steps[0])) == sympy.true and (width >= 0) == sympy.true:
            return True
    return indices.injective(rows, count)


def _unprotected(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, Any]]:
    """Write-conflict edges leaving a computation (not a scope exit) that DaCe would emit without atomics."""
    found = []
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, nd.ExitNode) or not isinstance(state, dace.SDFGState):
            continue
        for edge in state.out_edges(node):
            if edge.data.wcr is not None and not edge.data.is_empty() and \
                    not is_write_conflicted(state, edge, sdfg_schedule=None):
                found.append((state, edge))
    return found


def _racing_maps(state: dace.SDFGState, edge) -> list[nd.MapEntry]:
    """The parallel maps on the sum's way out (through enclosing nested SDFGs, as DaCe follows it) that
    do not keep their threads' additions apart."""
    racing = []
    while edge is not None:
        path = state.memlet_path(edge)
        for e in path:
            if isinstance(e.dst, nd.MapExit) and e.dst.map.schedule not in _SEQUENTIAL:
                entry = state.entry_node(e.dst)
                if e.data.subset is None or not disjoint_across_threads(entry, e.data.subset):
                    racing.append(entry)
        last = path[-1].dst
        sdfg = state.sdfg
        if not isinstance(last, nd.AccessNode) or sdfg.arrays[last.data].transient or sdfg.parent_nsdfg_node is None:
            break
        outer = sdfg.parent
        out = list(outer.out_edges_by_connector(sdfg.parent_nsdfg_node, last.data))
        state, edge = (outer, out[0]) if out else (outer, None)
    return racing


def _user_name(sdfg: dace.SDFG, name: str) -> str:
    """An argument's name for its device copy (`gpu_x`, DaCe's GPU transformation's name for x)."""
    plain = name[len("gpu_"):] if name.startswith("gpu_") else name
    return plain if plain in sdfg.arrays and not sdfg.arrays[plain].transient else name


def serialize_racing_sums(sdfg: dace.SDFG) -> list[str]:
    """Give every parallel map that would race on an unprotected sum the sequential schedule (in place: the
    caller's private copy). Returns the labels of the maps changed. A CUDA kernel cannot be made sequential
    that way (it would run on the host, on device memory): one that would race is a `CompilationError`."""
    changed = []
    for state, edge in _unprotected(sdfg):
        for entry in _racing_maps(state, edge):
            if entry.map.schedule in dace.dtypes.GPU_SCHEDULES:
                name = _user_name(state.sdfg, edge.data.data)
                raise CompilationError(
                    f"the sum into '{name}' in GPU kernel '{entry.map.label}' (state '{state.label}') would race: "
                    "DaCe emits it without atomics, but the kernel's threads can add into one element",
                    "build without `to_gpu` (the CPU build runs that map sequentially), or report the program")
            if entry.map.schedule not in _SEQUENTIAL:
                entry.map.schedule = dace.ScheduleType.Sequential
                changed.append(entry.map.label)
    return changed
