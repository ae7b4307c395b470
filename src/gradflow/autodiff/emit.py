"""Small builders for the dataflow that reverse rules and the engine emit (fills, copies, mapped tasklets)."""

from __future__ import annotations

import copy
import functools
import re

import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg.propagation import propagate_subset
from dace.sdfg.state import SDFGState


def safe_label(text: str) -> str:
    """A node label usable as a C identifier (forward labels may hold brackets, '=' and ':')."""
    label = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return label if label[:1].isalpha() or label[:1] == "_" else f"_{label}"


def full_index(sdfg: dace.SDFG, array: str, prefix: str = "__z") -> tuple[dict[str, str], str]:
    """Map ranges covering all of `array` and the matching element subset."""
    shape = sdfg.arrays[array].shape
    ranges = {f"{prefix}{d}": f"0:{s}" for d, s in enumerate(shape)}
    return ranges, ", ".join(ranges)


def subset_elements(subset: subsets.Range, prefix: str) -> tuple[dict[str, str], list[str], str]:
    """Map ranges `prefix<d> in 0:size_d`, their parameters, and the element `begin_d + step_d * prefix<d>`
    of `subset` they address (strided subsets included)."""
    params = [f"{prefix}{d}" for d in range(subset.dims())]
    ranges = {p: f"0:{n}" for p, n in zip(params, subset.size(for_codegen=True))}  # integer ceilings
    element = ", ".join(f"({b}) + ({s}) * {p}" for p, (b, _, s) in zip(params, subset.ndrange()))
    return ranges, params, element


def mapped_tasklet(state: SDFGState, label: str, ranges: dict[str, str], inputs: dict[str, dace.Memlet], code: str,
                   outputs: dict[str, dace.Memlet], schedule: dace.ScheduleType = dace.ScheduleType.Default):
    """A tasklet in a new map with external edges (`SDFGState.add_mapped_tasklet`), whose outer memlets
    are propagated here through that one map: everything but the map's parameters is defined outside it.
    (DaCe's own propagation first scans the whole graph for the symbols defined at the map, which made
    building the backward sweep quadratic in its size.)"""
    tasklet, entry, exit_ = state.add_mapped_tasklet(label, ranges, inputs, code, outputs, schedule=schedule,
                                                     external_edges=True, propagate=False)
    params, rng = entry.map.params, entry.map.range
    for outer, inner, use_dst in ((state.in_edges(entry), state.out_edges(entry), False),
                                  (state.out_edges(exit_), state.in_edges(exit_), True)):
        for e in outer:
            found = [i.data for i in inner if not i.data.is_empty() and i.data.data == e.data.data]
            if found:
                e.data = (_shifted_image(found, params, rng, use_dst)
                          or propagate_subset(found, state.sdfg.arrays[e.data.data], params, rng, use_dst=use_dst))
                e.data.try_initialize(state.sdfg, state, e)
    return tasklet, entry, exit_


def _shifted_image(memlets: list[dace.Memlet], params: list[str], rng: subsets.Range,
                   use_dst: bool) -> dace.Memlet | None:
    """The outer memlet of `memlets` through one map when every index is a map parameter plus an offset or
    free of the parameters (what element-wise rules emit), or None to leave the case to DaCe's propagation.

    The image of `p + c` over `p in b:e` is `b+c:e+c`; several memlets take their bounding box. This is the
    common case of the backward sweep, and DaCe's pattern matching costs milliseconds per memlet."""
    by_name = {p: (symbolic.pystr_to_symbolic(p), r) for p, r in zip(params, rng)}
    images = []
    for memlet in memlets:
        subset = (memlet.dst_subset if use_dst else memlet.src_subset) or memlet.subset
        if not isinstance(subset, subsets.Range):
            return None
        dims = []
        for begin, end, step in subset.ndrange():
            names = {str(s) for x in (begin, end, step) for s in getattr(x, "free_symbols", ())}
            used = names & by_name.keys()
            if not used:
                dims.append((begin, end, step))
                continue
            if len(used) != 1 or begin != end:
                return None
            symbol, (low, high, stride) = by_name[used.pop()]
            offset = sympy.expand(begin - symbol)
            if stride != 1 or {str(s) for s in offset.free_symbols} & by_name.keys():
                return None
            dims.append((low + offset, high + offset, 1))
        images.append(dims)
    if not images:
        return None
    box = []
    for dim in zip(*images):
        if len(set(dim)) == 1:
            box.append(dim[0])
            continue
        if any(step != 1 for _, _, step in dim):
            return None
        lows, highs = [d[0] for d in dim], [d[1] for d in dim]
        low, high = _extreme(lows, min), _extreme(highs, max)
        if low is None or high is None:
            return None
        box.append((low, high, 1))
    out = copy.copy(memlets[0])  # keeps the write-conflict resolution, as DaCe's propagation does
    out.subset, out.other_subset = subsets.Range(box), None
    out.volume = sum(m.volume for m in memlets) * functools.reduce(lambda a, b: a * b, rng.size(), 1)
    out.dynamic = any(m.dynamic for m in memlets)
    return out


def _extreme(values, pick):
    """The least (`pick=min`) or greatest of expressions that differ by integer constants, else None."""
    first = values[0]
    offsets = [sympy.expand(v - first) for v in values]
    if not all(o.is_Integer for o in offsets):
        return None
    return first + pick(offsets)


def fill(state: SDFGState, array: str, value: str) -> None:
    """array[...] = value, as a map."""
    ranges, index = full_index(state.sdfg, array)
    mapped_tasklet(state, f"fill_{array}", ranges, {}, f"__o = {value}", {"__o": dace.Memlet(f"{array}[{index}]")})


def copy_array(state: SDFGState, src: str, dst: str) -> None:
    """dst[...] = src[...] (same shapes), as a direct copy edge."""
    desc = state.sdfg.arrays[src]
    state.add_nedge(state.add_read(src), state.add_write(dst), dace.Memlet.from_array(src, desc))


def copy_region(state: SDFGState, src: str, dst: str, region: str) -> None:
    """dst[region] = src[region] (same shapes), as a direct copy edge."""
    state.add_nedge(state.add_read(src), state.add_write(dst),
                    dace.Memlet(data=src, subset=region, other_subset=region))


def map_ranges(entry: dace.nodes.MapEntry) -> dict[str, str]:
    """The ranges of a map as strings that `add_map` parses back to the same iteration space."""
    out = {}
    for param, (begin, end, step) in zip(entry.map.params, entry.map.range):
        out[param] = str(subsets.Range([(begin, end, step)]))
    return out


def add_element_tasklet(
    state: SDFGState,
    label: str,
    ranges: dict[str, str] | None,
    inputs: dict[str, dace.Memlet],
    code: str,
    outputs: dict[str, dace.Memlet],
    schedule: dace.ScheduleType = dace.ScheduleType.Default,
) -> None:
    """A tasklet, inside a map when `ranges` is given, with one access node per array on each side."""
    label = safe_label(label)
    if ranges:
        mapped_tasklet(state, label, ranges, inputs, code, outputs, schedule)
        return
    tasklet = state.add_tasklet(label, {c: None for c in inputs}, {c: None for c in outputs}, code)
    reads: dict[str, dace.nodes.AccessNode] = {}
    writes: dict[str, dace.nodes.AccessNode] = {}
    for conn, memlet in inputs.items():
        if memlet.data not in reads:
            reads[memlet.data] = state.add_read(memlet.data)
        state.add_edge(reads[memlet.data], None, tasklet, conn, memlet)
    for conn, memlet in outputs.items():
        if memlet.data not in writes:
            writes[memlet.data] = state.add_write(memlet.data)
        state.add_edge(tasklet, conn, writes[memlet.data], None, memlet)
