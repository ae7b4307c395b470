"""`column_layouts`: a transient matrix that the program's hot loops walk down its columns is stored
column by column.

A transient's layout is the compiler's choice: nothing outside the program sees it. Row-major is what
the frontend gives every array, but reverse mode creates matrices whose accesses follow the forward's:
Gram-Schmidt walks the columns `A[:, j]` of its matrix, so the backward's working copy of `A` (restored
one column per inner iteration from the tape) and the gradient of `Q` are walked down columns too, every
element a new cache line (stride N). Stored column-major, those walks read and write consecutive
memory; the few whole-matrix passes (the initial copy, zeroing) become transposing but run once.

A 2-D transient `Array` of the top-level SDFG is a candidate when only maps and tasklets touch it (no
library node or nested SDFG, which might assume a layout; no view; no interstate edge or loop condition
naming it), and it is row-major now. Each memlet inside a map scope votes for the dimension that its
innermost non-trivial map parameter moves along (for a single element, the last one); a whole-array
copy between access nodes votes for rows. A vote weighs `LOOP_WEIGHT` to the power of the number of
loops around its state, a stand-in for how often it runs. The array becomes column-major when the
column votes outweigh the row votes.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace import symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass
from gradflow.optimize.first_writes import named_by_control

#: relative weight of an access one loop deeper (a loop of unknown trip count runs "many" times)
LOOP_WEIGHT = 64


def _loop_depth(state: dace.SDFGState) -> int:
    depth, region = 0, state.parent_graph
    while region is not None and not isinstance(region, dace.SDFG):
        depth += isinstance(region, LoopRegion)
        region = region.parent_graph
    return depth


def _row_major(desc: dace.data.Array) -> bool:
    rows, cols = desc.shape
    return (symbolic.pystr_to_symbolic(str(desc.strides[1])) == 1
            and symbolic.pystr_to_symbolic(str(desc.strides[0] - cols)) == 0)


def _trivial(rng) -> bool:
    b, e, s = rng
    return symbolic.pystr_to_symbolic(str(e - b)) == 0


def _innermost_parameter(state: dace.SDFGState, node: nd.Node, scopes: dict) -> str | None:
    """The map parameter that changes fastest around `node` (the last parameter of the innermost map
    whose range is not a single value), or None outside maps."""
    entry = scopes[node]
    while entry is not None:
        for param, rng in reversed(list(zip(entry.map.params, entry.map.range))):
            if not _trivial(rng):
                return param
        entry = scopes[entry]
    return None


def _dimension_along(subset, param: str) -> int | None:
    """The one dimension of `subset` whose index involves `param`, else None."""
    dims = [d for d, (b, e, _) in enumerate(subset)
            if param in {str(s) for s in symbolic.pystr_to_symbolic(str(b)).free_symbols}
            | {str(s) for s in symbolic.pystr_to_symbolic(str(e)).free_symbols}]
    return dims[0] if len(dims) == 1 else None


def _votes(sdfg: dace.SDFG, name: str) -> tuple[float, float] | None:
    """(row weight, column weight) of the accesses to `name`; None when it must keep its layout."""
    rows = cols = 0.0
    for state in sdfg.states():
        nodes = [n for n in state.data_nodes() if n.data == name]
        if not nodes:
            continue
        weight = float(LOOP_WEIGHT) ** _loop_depth(state)
        scopes = state.scope_dict()
        for node in nodes:
            for e in state.all_edges(node):
                other = e.dst if e.src is node else e.src
                if isinstance(other, (nd.LibraryNode, nd.NestedSDFG)):
                    return None
                if isinstance(other, nd.AccessNode):
                    if isinstance(other.desc(sdfg), dace.data.View):
                        return None
                    rows += weight  # a copy between arrays: contiguous in row-major
        for e in state.edges():
            if e.data.data != name or e.data.subset is None:
                continue
            if isinstance(e.src, (nd.LibraryNode, nd.NestedSDFG)) or isinstance(e.dst, (nd.LibraryNode, nd.NestedSDFG)):
                return None  # also inside a map scope
            inner = e.dst if isinstance(e.dst, nd.Tasklet) else e.src if isinstance(e.src, nd.Tasklet) else None
            if inner is None:
                continue
            param = _innermost_parameter(state, inner, scopes)
            dim = _dimension_along(e.data.subset, param) if param is not None else None
            if dim == 0:
                cols += weight
            elif dim == 1:
                rows += weight
    return rows, cols


def _candidates(sdfg: dace.SDFG) -> list[str]:
    found = []
    for name, desc in sdfg.arrays.items():
        if not (type(desc) is dace.data.Array and desc.transient and len(desc.shape) == 2
                and desc.storage in (dace.StorageType.Default, dace.StorageType.CPU_Heap)
                and not any(_trivial((0, s - 1, 1)) for s in desc.shape) and _row_major(desc)):
            continue
        if named_by_control(sdfg, name):
            continue
        votes = _votes(sdfg, name)
        if votes is not None and votes[1] > votes[0]:
            found.append(name)
    return found


@register_pass
@attrs.frozen
class ColumnLayouts(Pass):
    """Transient matrices walked down their columns in the hot loops are stored column-major (module doc)."""

    name: ClassVar[str] = "column_layouts"

    def run(self, graph: Graph) -> PassResult:
        if not _candidates(graph.sdfg):
            return Success(graph)
        sdfg = graph.editable()
        for name in _candidates(sdfg):
            desc = sdfg.arrays[name]
            desc.strides = (1, desc.shape[0])
            desc.total_size = desc.shape[0] * desc.shape[1]
        return Success(Graph.adopt(sdfg, graph.meta))
