"""`simd_register_sums`: a sequential loop that sums into local accumulators is marked `omp simd`.

A local `Register` accumulator (`register_scalar_sums`, `nest_reductions` over a loop of unknown extent)
takes every iteration's value in order: without `-ffast-math` the C++ compiler vectorizes the rest of the
loop but adds the lanes one after the other, a chain of dependent adds (4 cycles each: the per-row sums
of softmax's backward, over 128 elements, spent a third of its time there). OpenMP's `#pragma omp simd
reduction(+: acc)` licenses that one sum to be kept in several partial sums, as `gradflow-vector`'s
`Reduce` does and numpy's pairwise sums, torch and XLA do; nothing else in the program is reassociated.
The accumulator must be a scalar: over a one-element array (`reduction(+: acc[0:1])`, still accepted
here) GCC 12 keeps the in-order chain (a 256x512 sum: 111 us as a scalar chain, 24 us as a scalar
reduction, measured in a C++ microbenchmark).

A map is marked (its `instrument` set to `SIMD_SUMS`, which `SimdSumsProvider` turns into the pragma on
the loop, with `collapse(k)` for a k-dimensional map: DaCe nests its loops with nothing between them)
when it is sequential with unit steps, holds tasklets and access nodes only, every write-conflict it
makes goes either into such an accumulator (read and assigned nowhere in the loop) or into one element
per iteration (an index affine in the loop variables, injective in them), and at least one goes into an
accumulator. Iterations of a map are independent, so the `simd` promise holds for the rest of the body.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace import dtypes, registry, symbolic
from dace.codegen.instrumentation.provider import InstrumentationProvider
from dace.frontend.operations import detect_reduction_type
from dace.sdfg import nodes as nd

from gradflow.analysis import indices
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass

#: the instrumentation type that stands for "emit the `omp simd` pragma of this loop"
SIMD_SUMS = (dtypes.InstrumentationType.SIMD_SUMS if "SIMD_SUMS" in dtypes.InstrumentationType.__members__
             else dtypes.InstrumentationType.register("SIMD_SUMS"))

#: reductions OpenMP names, by DaCe's reduction type
_OMP = {dtypes.ReductionType.Sum: "+", dtypes.ReductionType.Product: "*", dtypes.ReductionType.Max: "max",
        dtypes.ReductionType.Min: "min"}
_TYPES = (dace.float32, dace.float64, dace.int32, dace.int64)


def _accumulator(sdfg: dace.SDFG, memlet) -> str | None:
    """The OpenMP reduction of a write into a one-element local accumulator, else None."""
    desc = sdfg.arrays[memlet.data]
    if desc.storage != dace.StorageType.Register or desc.total_size != 1 or desc.dtype not in _TYPES:
        return None
    return _OMP.get(detect_reduction_type(memlet.wcr))


def _item(sdfg: dace.SDFG, name: str) -> str:
    """The accumulator as an OpenMP reduction list item: a scalar by name, a one-element array as a section."""
    return name if isinstance(sdfg.arrays[name], dace.data.Scalar) else f"{name}[0:1]"


def _one_per_iteration(memlet, params: list[str]) -> bool:
    """The write touches one element, and the dimensions of its index that are affine in the loop variables
    with constant coefficients are injective in them (full column rank): no two iterations, of any of the
    collapsed loops, write the same element (other dimensions can only tell more iterations apart)."""
    if memlet.subset.num_elements() != 1:
        return False
    ps = [symbolic.symbol(p) for p in params]
    rows = [indices.affine_row(symbolic.pystr_to_symbolic(str(begin)), ps)
            for begin in indices.point_indices(memlet.subset)]
    return indices.injective([row for row in rows if row is not None], len(ps))


def reductions(sdfg: dace.SDFG, state: dace.SDFGState, entry: nd.MapEntry) -> dict[str, str] | None:
    """The accumulators of `entry`'s loop with their OpenMP reductions, or None when the loop may not be
    marked (module doc)."""
    m = entry.map
    if m.schedule != dace.ScheduleType.Sequential or any(step != 1 for _, _, step in m.range.ranges):
        return None
    inside = state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    # tasklets and access nodes only: no inner loop, and no OpenMP construct of a nested SDFG or a library
    # node's expansion inside the simd region (a compile error)
    if not all(isinstance(n, (nd.Tasklet, nd.AccessNode)) for n in inside):
        return None
    exit_ = state.exit_node(entry)
    read = {e.data.data for e in state.in_edges(entry) if not e.data.is_empty()}
    read |= {n.data for n in inside if isinstance(n, nd.AccessNode)}
    found: dict[str, str] = {}
    assigned = set()
    for e in state.in_edges(exit_):
        if e.data.is_empty():
            continue
        if e.data.wcr is None:
            assigned.add(e.data.data)
            continue
        op = _accumulator(sdfg, e.data)
        if op is not None and e.data.data not in read and found.get(e.data.data, op) == op:
            found[e.data.data] = op
        elif not _one_per_iteration(e.data, list(m.params)):
            return None
    if assigned & set(found):  # a plain write into an accumulator is not a reduction
        return None
    return found or None


def _candidates(sdfg: dace.SDFG) -> list[tuple[dace.SDFGState, nd.MapEntry]]:
    return [(state, n) for state in sdfg.states() for n in state.nodes()
            if isinstance(n, nd.MapEntry) and n.map.instrument != SIMD_SUMS and reductions(sdfg, state, n)]


@registry.autoregister_params(type=SIMD_SUMS)
class SimdSumsProvider(InstrumentationProvider):
    """Writes `#pragma omp simd reduction(...)` right before the loop of a map marked `SIMD_SUMS`."""

    def writes_to_report(self) -> bool:
        return False

    def on_scope_entry(self, sdfg, cfg, state, node, outer_stream, inner_stream, global_stream) -> None:
        found = reductions(sdfg, state, node) if isinstance(node, nd.MapEntry) else None
        if found:  # re-checked: a marked map edited after the pass gets no promise it may not keep
            clauses = " ".join(f"reduction({op}: {_item(sdfg, name)})" for name, op in sorted(found.items()))
            # DaCe writes a map's loops one inside the other with nothing between them: they collapse
            nest = f"collapse({len(node.map.params)}) " if len(node.map.params) > 1 else ""
            outer_stream.write(f"#pragma omp simd {nest}{clauses}", cfg, state.block_id, node)


@register_pass
@attrs.frozen
class SimdRegisterSums(RewritePass):
    """Mark sequential loops that sum into local accumulators for `omp simd` (module doc)."""

    name: ClassVar[str] = "simd_register_sums"

    def matches(self, sdfg: dace.SDFG) -> list:
        return _candidates(sdfg)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        _, entry = match
        entry.map.instrument = SIMD_SUMS
