"""`transient_layouts`: a transient array is laid out so that the program's hot loops walk it contiguously.

A transient's layout is the compiler's choice: nothing outside the program sees it. The frontend makes
every array row-major, but loops often walk another dimension: Gram-Schmidt walks the columns `A[:, j]`,
vadv's sweep works on planes `c[:, :, k]` of arrays whose last dimension is k. Reverse mode copies those
access patterns into backward-local buffers (working copies restored from the tape, gradients), so one
cache line per element is touched on both sweeps. Laid out along the walks, those accesses read and
write consecutive memory; the few whole-array passes (the initial copy, zeroing) become transposing but
run once.

A transient `Array` of the top-level SDFG with two or more dimensions is a candidate when only maps and
tasklets touch it (no library node or nested SDFG, which might assume a layout; no view; no interstate
edge or loop condition naming it), and it is row-major now. Each memlet inside a map scope scores the
dimensions its map parameters move along by how fast they change (the last parameter of the innermost
map whose range is not a single value fastest); a copy between access nodes scores the current order.
The accesses inside the most loops decide the order, fastest-walked dimension last (those run most
often: a loop of unknown trip count runs "many" times); accesses in fewer loops only break ties, and the
current order breaks the rest.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace import symbolic
from dace.sdfg import nodes as nd

from gradflow.analysis.access import named_by_control
from gradflow.analysis.loops import loop_depth
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass


def _row_major(desc: dace.data.Array) -> bool:
    expected = 1
    for extent, stride in reversed(list(zip(desc.shape, desc.strides))):
        if symbolic.pystr_to_symbolic(str(stride - expected)) != 0:
            return False
        expected = expected * extent
    return True


def _trivial(rng) -> bool:
    b, e, s = rng
    return symbolic.pystr_to_symbolic(str(e - b)) == 0


def _parameters(node: nd.Node, scopes: dict) -> list[str]:
    """The map parameters around `node` whose ranges are not a single value, fastest-changing first."""
    params, entry = [], scopes[node]
    while entry is not None:
        params += [p for p, rng in reversed(list(zip(entry.map.params, entry.map.range))) if not _trivial(rng)]
        entry = scopes[entry]
    return params


def _dimension_along(subset, param: str) -> int | None:
    """The one dimension of `subset` whose index involves `param`, else None."""
    dims = [d for d, (b, e, _) in enumerate(subset)
            if param in {str(s) for s in symbolic.pystr_to_symbolic(str(b)).free_symbols}
            | {str(s) for s in symbolic.pystr_to_symbolic(str(e)).free_symbols}]
    return dims[0] if len(dims) == 1 else None


def _votes(sdfg: dace.SDFG, name: str) -> list[dict[int, float]] | None:
    """Per dimension, per loop depth: how fast the accesses at that depth walk along it (rank 0, the
    fastest map parameter, scores the number of dimensions; a dimension no parameter moves along, 0).
    None when the array must keep its layout."""
    rank = len(sdfg.arrays[name].shape)
    scores: list[dict[int, float]] = [{} for _ in range(rank)]

    def vote(dim: int, depth: int, value: float) -> None:
        scores[dim][depth] = scores[dim].get(depth, 0.0) + value

    for state in sdfg.states():
        nodes = [n for n in state.data_nodes() if n.data == name]
        if not nodes:
            continue
        depth = loop_depth(state)
        scopes = state.scope_dict()
        for node in nodes:
            for e in state.all_edges(node):
                other = e.dst if e.src is node else e.src
                if isinstance(other, nd.AccessNode):
                    if isinstance(other.desc(sdfg), dace.data.View):
                        return None
                    for dim in range(rank):  # a copy between arrays: walks them as they are laid out
                        vote(dim, depth, dim + 1)
        for e in state.edges():
            if e.data.data != name or e.data.subset is None:
                continue
            if isinstance(e.src, (nd.LibraryNode, nd.NestedSDFG)) or isinstance(e.dst, (nd.LibraryNode, nd.NestedSDFG)):
                return None  # (inside a map scope too) it might assume a layout
            tasklet = e.dst if isinstance(e.dst, nd.Tasklet) else e.src if isinstance(e.src, nd.Tasklet) else None
            if tasklet is None:
                continue
            for k, param in enumerate(_parameters(tasklet, scopes)[:rank]):
                dim = _dimension_along(e.data.subset, param)
                if dim is not None:
                    vote(dim, depth, rank - k)
    return scores


def _order(sdfg: dace.SDFG, name: str) -> tuple[int, ...] | None:
    """The dimensions from slowest to fastest in the chosen layout, or None to keep the array as it is."""
    desc = sdfg.arrays[name]
    if not (type(desc) is dace.data.Array and desc.transient and len(desc.shape) >= 2
            and desc.storage in (dace.StorageType.Default, dace.StorageType.CPU_Heap)
            and desc.lifetime != dace.AllocationLifetime.External  # memory someone else lays out
            and not any(_trivial((0, s - 1, 1)) for s in desc.shape) and _row_major(desc)):
        return None
    if named_by_control(sdfg, name):
        return None
    scores = _votes(sdfg, name)
    if scores is None:
        return None
    depths = sorted({d for per_dim in scores for d in per_dim}, reverse=True)
    # the deepest accesses decide; shallower ones (run less often) only break ties; then the current order
    order = tuple(sorted(range(len(scores)), key=lambda dim: (tuple(scores[dim].get(d, 0.0) for d in depths), dim)))
    return None if order == tuple(range(len(scores))) else order


def _candidates(sdfg: dace.SDFG) -> dict[str, tuple[int, ...]]:
    found = {}
    for name in sdfg.arrays:
        order = _order(sdfg, name)
        if order is not None:
            found[name] = order
    return found


@register_pass
@attrs.frozen
class TransientLayouts(RewritePass):
    """Transient arrays are laid out along the walks of the hot loops (module doc)."""

    name: ClassVar[str] = "transient_layouts"

    nested: ClassVar[bool] = False  # the top-level SDFG's transients

    def matches(self, sdfg: dace.SDFG) -> list[tuple[str, tuple[int, ...]]]:
        return list(_candidates(sdfg).items())

    def rewrite(self, sdfg: dace.SDFG, match: tuple[str, tuple[int, ...]]) -> None:
        name, order = match
        desc = sdfg.arrays[name]
        strides, step = [None] * len(order), 1
        for d in reversed(order):
            strides[d], step = step, step * desc.shape[d]
        desc.strides = tuple(strides)
