"""`reduce_in_maps`: an element-wise map whose result only a reduction reads reduces into the reduction's
output itself.

numpy code reduces what it has just computed: `np.min(d, axis=1)` of the distance matrix
`d = |p|^2 + |c|^2 - 2 p.c` (GradBench's kmeans cost), `np.sum(w * f(x))`, `np.max(np.abs(x - y))`. The
frontend writes the element-wise part as a map into a temporary and a `Reduce` node reading all of it:
the temporary is one full write and one full read of memory (at kmeans' n = 10000, k = 1000: 80 MB, a
fresh allocation each call, which the kernel page-faults in). XLA fuses such a producer into its
reduction; here the map's tasklet combines its value into the reduction's output element with the
reduction's own operator (a write-conflict resolution), the output set to the reduction's identity just
before the map's state. `nest_reductions` then runs those sums without atomics (the kept dimensions own
the outputs), as it does for every write-conflict map.

The proof, on gradflow's own reading of the memlets:
- the temporary T is transient, not a view, has one access node in the whole SDFG (no interstate edge or
  condition reads it), written by one edge from a top-level map's exit, read by one edge into a `Reduce`;
- the map's body is tasklets (Python), its one write of T comes straight from a tasklet output that
  nothing else reads, is plain, and writes element `T[p_0, ..., p_k]`: each dimension one map parameter
  plus a constant, every parameter in one dimension, unit steps, the map's range exactly T's shape: every
  element of T is written once, by one iteration;
- the `Reduce` reads all of T, has an identity and a `+`, `*`, `max` or `min` operator (`core.wcr`), the
  same element type in and out, and writes its output O plainly, with as many dimensions of more than one
  element as T keeps, in order and of the same extents (a full reduction: one element);
- O's node written by the `Reduce` is O's only access node in the state and has no other writer; the
  map reads neither O nor T.
Then each output element is the identity combined with exactly the values the `Reduce` combined (in
another order: a sum rounds as any reordered sum does, which the reductions' own expansions already do;
`max` and `min` are exact). T and the `Reduce` go.
"""

from __future__ import annotations

import math
from typing import ClassVar, Iterator

import attrs
import dace
import sympy
from dace import subsets, symbolic
from dace.libraries.standard.nodes.reduce import Reduce
from dace.sdfg import nodes as nd

from gradflow.analysis.dependence import accessed_at_one_node
from gradflow.analysis.indices import affine_row, same_value
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass, at_data_nodes
from gradflow.core.wcr import MAX, MIN, PRODUCT, SUM, reduction_type
from gradflow.transforms.fusion import elementwise_scope

#: the write-conflict lambda of each reduction the rewrite takes
_OPERATORS = {dace.dtypes.ReductionType.Sum: SUM, dace.dtypes.ReductionType.Product: PRODUCT,
              dace.dtypes.ReductionType.Max: MAX, dace.dtypes.ReductionType.Min: MIN}


def _element_params(subset, entry: nd.MapEntry, shape) -> list[str] | None:
    """Per dimension of T, the map parameter that indexes it, when the write `subset` is one element whose
    index in each dimension is a parameter (unit step, its range T's whole extent there), every parameter
    in exactly one dimension; else None."""
    params = list(entry.map.params)
    symbols = [symbolic.pystr_to_symbolic(p) for p in params]
    ranges = entry.map.range.ndrange()
    if subset.dims() != len(shape) or len(params) != len(shape):
        return None
    found: list[str] = []
    for (begin, end, _), extent in zip(subset.ndrange(), shape):
        if not same_value(begin, end):
            return None
        row = affine_row(begin, symbols)
        if row is None or sorted(row) != [0] * (len(row) - 1) + [1]:
            return None
        k = row.index(1)
        first, last, step = ranges[k]
        if not (same_value(sympy.sympify(begin), symbols[k]) and same_value(first, 0) and same_value(step, 1)
                and same_value(last + 1, extent)):
            return None
        found.append(params[k])
    return found if len(set(found)) == len(found) else None


def _output_index(out_subset, kept: list[str], kept_extents: list) -> list | None:
    """O's index for each point of the reduction: the output subset's dimensions of more than one element
    take the kept parameters in order (their extents equal), the others keep their single index."""
    index, wide = [], iter(zip(kept, kept_extents))
    for begin, end, step in out_subset.ndrange():
        if same_value(begin, end):
            index.append(begin)
            continue
        pair = next(wide, None)
        if pair is None or not same_value(step, 1) or not same_value(end - begin + 1, pair[1]):
            return None
        index.append(begin + symbolic.pystr_to_symbolic(pair[0]))
    return index if next(wide, None) is None else None


def match_at(sdfg: dace.SDFG, state: dace.SDFGState, temp: nd.AccessNode):
    """The rewrite's match at the temporary `temp` (module doc), or None."""
    desc = sdfg.arrays[temp.data]
    if (not desc.transient or type(desc) is not dace.data.Array or state.in_degree(temp) != 1
            or state.out_degree(temp) != 1 or not accessed_at_one_node(sdfg, temp.data)):
        return None
    write, read = state.in_edges(temp)[0], state.out_edges(temp)[0]
    reduce_node, exit_ = read.dst, write.src
    if not isinstance(reduce_node, Reduce) or not isinstance(exit_, nd.MapExit) or write.data.wcr is not None:
        return None
    entry = state.entry_node(exit_)
    if state.entry_node(entry) is not None or not elementwise_scope(state, entry, python_only=True):
        return None
    operator = _OPERATORS.get(reduction_type(reduce_node.wcr))
    if (operator is None or reduce_node.identity is None or not math.isfinite(float(reduce_node.identity))
            or len(state.out_edges(reduce_node)) != 1):
        return None
    out_edge = state.out_edges(reduce_node)[0]
    out = out_edge.dst
    if (not isinstance(out, nd.AccessNode) or out_edge.data.wcr is not None or state.in_degree(out) != 1
            or type(sdfg.arrays[out.data]) not in (dace.data.Array, dace.data.Scalar)
            or sdfg.arrays[out.data].dtype != desc.dtype):
        return None
    if sum(1 for n in state.data_nodes() if n.data == out.data) != 1:
        return None  # O is read or written elsewhere in the state: its order against the init would change
    if not same_value(read.data.subset.num_elements(), desc.total_size) or read.data.subset.dims() != len(desc.shape):
        return None  # the Reduce reads part of T
    if not (write.src_conn or "").startswith("OUT_"):
        return None
    inner = [e for e in state.in_edges(exit_) if e.dst_conn == "IN_" + write.src_conn[4:]]
    if len(inner) != 1 or not isinstance(inner[0].src, nd.Tasklet) or inner[0].data.wcr is not None:
        return None
    tasklet = inner[0].src
    if inner[0].data.data != temp.data or inner[0].data.dynamic or len(list(state.out_edges_by_connector(
            tasklet, inner[0].src_conn))) != 1:
        return None
    params = _element_params(inner[0].data.subset, entry, desc.shape)
    if params is None:
        return None
    axes = range(len(desc.shape)) if reduce_node.axes is None else reduce_node.axes
    kept = [k for k in range(len(desc.shape)) if k not in axes]
    index = _output_index(out_edge.data.get_dst_subset(out_edge, state) or out_edge.data.subset,
                          [params[k] for k in kept], [desc.shape[k] for k in kept])
    if index is None:
        return None
    if any(e.data.data in (out.data, temp.data) for e in state.in_edges(entry)):
        return None  # the map reads O (or T)
    return state, temp, write, inner[0], reduce_node, out_edge, index, operator


def _initialise(sdfg: dace.SDFG, state: dace.SDFGState, out_edge, identity) -> None:
    """A state before `state` setting the reduction's output subset to `identity`."""
    region = state.parent_graph
    init = region.add_state_before(state, f"init_{out_edge.dst.data}", is_start_block=region.start_block is state)
    subset = out_edge.data.get_dst_subset(out_edge, state) or out_edge.data.subset
    desc = sdfg.arrays[out_edge.dst.data]
    value = repr(desc.dtype.type(identity).item())
    ranges = {f"__r{d}": f"{b}:{e + 1}:{s}" for d, (b, e, s) in enumerate(subset.ndrange())}
    index = ", ".join(ranges) if isinstance(desc, dace.data.Array) else "0"
    init.add_mapped_tasklet(f"init_{out_edge.dst.data}", ranges, {}, f"__out = {value}",
                            {"__out": dace.Memlet(f"{out_edge.dst.data}[{index}]")}, external_edges=True)


@register_pass
@attrs.frozen
class ReduceInMaps(RewritePass):
    """An element-wise map whose result only a `Reduce` reads reduces into its output (module doc)."""

    name: ClassVar[str] = "reduce_in_maps"
    strategy: ClassVar[str] = ONE_AT_A_TIME  # each rewrite changes the graph the next proof reads

    def matches(self, sdfg: dace.SDFG) -> Iterator:
        return at_data_nodes(sdfg, match_at)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        state, temp, write, inner, reduce_node, out_edge, index, operator = match
        out = out_edge.dst
        target = out.data
        whole = out_edge.data.get_dst_subset(out_edge, state) or out_edge.data.subset
        _initialise(sdfg, state, out_edge, reduce_node.identity)
        inner.data = dace.Memlet(data=target, subset=subsets.Range([(i, i, 1) for i in index]), wcr=operator)
        state.add_edge(write.src, write.src_conn, out, out_edge.dst_conn,
                       dace.Memlet(data=target, subset=subsets.Range(whole.ndrange()), wcr=operator))
        state.remove_node(reduce_node)
        state.remove_node(temp)
        sdfg.remove_data(temp.data, validate=False)  # its one access node (the match's precondition) is gone
