"""`write_in_place`: an element-wise map whose result is a temporary copied into an array it reads writes
that array directly.

DaCe's frontend lowers an in-place update such as `y[:] = y + h * k` to a map that writes a temporary
(`y_slice`) and a copy of the temporary into `y`. The copy is one more pass over memory per update; in
GradBench's ode (a Runge-Kutta step of six maps) it was one pass in seven.

The rewrite has a proof, checked here on the map's memlets (DaCe's transformations are not asked):
- the temporary T is transient, has one access node in the whole SDFG (no interstate edge or condition
  reads it), written by one edge from the map's exit and read by one edge: a plain copy (no write-conflict
  resolution) of exactly the elements the map's iterations write (computed from the map's range, not
  from DaCe's propagated memlet), element for element and with unit steps, into an access node D of the
  array A (D may have more dimensions, of one element each: a vector copied into a column `P[:, j]`);
- the map is element-wise (Python tasklets and scope-local data in its body), writes nothing else of A,
  and every write of T in it is one element whose index in each dimension is a distinct map parameter
  plus a constant, every parameter used (distinct iterations write distinct elements); every read of A in
  it is one element, the one the same write puts into A, by a node from which every write of T in the map
  is reached. An iteration thus reads, from A, only the element it writes itself, before writing it: no
  other iteration writes what it reads, whatever their order. A read that no write can meet is free too:
  in some dimension read and writes are single indices, free of the map's parameters, a nonzero number
  apart (`P[:, j] = P[:, j - 1] * t` reads column j - 1 and writes column j);
- A's other access nodes in the state are only read (D aside), and each node that reads them outside the
  map is an ancestor of the map's entry in the state: everything that reads A's old value runs before the
  map writes the new one. Readers of D (the new value) stay after the map, now through its exit.
Then the map writes A where T's element lands, T and the copy go. The values are those of the copy.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

import attrs
import dace
import networkx as nx
import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd

from gradflow.analysis.dependence import accessed_at_one_node
from gradflow.analysis.indices import affine_row, injective, point_indices, same_value
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import ONE_AT_A_TIME, RewritePass, at_data_nodes
from gradflow.transforms.fusion import elementwise_scope


def _same(a, b) -> bool:
    """The two subsets name the same elements (symbolically equal bounds and steps)."""
    return a.dims() == b.dims() and all(same_value(x, y) for ra, rb in zip(a.ndrange(), b.ndrange())
                                        for x, y in zip(ra, rb))


def _written_box(subset, entry: nd.MapEntry) -> subsets.Range | None:
    """What the map writes through the one-element `subset` over all its iterations, when each dimension
    is one index `p + c` with p a map parameter of unit step, every parameter in exactly one dimension
    (`indices.injective`: distinct iterations write distinct elements); else None."""
    params = [symbolic.pystr_to_symbolic(p) for p in entry.map.params]
    begins = list(point_indices(subset))
    rows = [affine_row(b, params) for b in begins]
    if len(begins) != subset.dims() or any(r is None for r in rows) or not injective(rows, len(params)):
        return None
    box = []
    for begin, row in zip(begins, rows):
        if sorted(row) != [0] * (len(row) - 1) + [1]:
            return None  # not `p + c`
        k = row.index(1)
        first, last, step = entry.map.range.ndrange()[k]
        if not same_value(step, 1):
            return None
        offset = sympy.sympify(begin) - params[k]
        box.append((first + offset, last + offset, 1))
    return subsets.Range(box) if len(box) == len(params) else None


def _never_written(read, image, entry: nd.MapEntry) -> bool:
    """Does no iteration's write `image` meet any iteration's `read`? True when, in some dimension, both
    are single indices free of the map's parameters and differ by a nonzero number (`P[i, j - 1]` read,
    `P[i, j]` written: column j - 1 is never written, whichever iteration runs first)."""
    params = set(entry.map.params)
    if read.dims() != image.dims():
        return False
    for (a, a_end, _), (b, b_end, _) in zip(read.ndrange(), image.ndrange()):
        a, b = (symbolic.pystr_to_symbolic(str(x)) for x in (a, b))  # one symbol per name (`same_value`)
        if not (same_value(a, a_end) and same_value(b, b_end)) or params & {str(x) for x in
                                                                             (a.free_symbols | b.free_symbols)}:
            continue
        difference = sympy.simplify(a - b)
        if difference.is_number and difference != 0:
            return True
    return False


def _copy(state: dace.SDFGState, temp: nd.AccessNode):
    """(the edge writing `temp`, the copy edge out of it, its destination) or None."""
    if state.in_degree(temp) != 1 or state.out_degree(temp) != 1:
        return None
    write, copy = state.in_edges(temp)[0], state.out_edges(temp)[0]
    dest = copy.dst
    if not isinstance(write.src, nd.MapExit) or not isinstance(dest, nd.AccessNode) or dest.data == temp.data:
        return None
    if copy.data.wcr is not None or write.data.wcr is not None or copy.data.is_empty():
        return None
    return write, copy, dest


def _shift(copy, state) -> list | None:
    """Per dimension of the destination, where its index comes from: `(k, d)` adds d to the temporary's
    index in dimension k, `(None, i)` is the single index i of a dimension the temporary lacks (a slice
    `P[:, j]` copied from a vector). The copy must be element for element with unit steps: the dimensions
    of more than one element pair up in order, with equal extents; else None."""
    src, dst = copy.data.get_src_subset(copy, state), copy.data.get_dst_subset(copy, state)
    if src is None or dst is None:
        return None
    src_dims, dst_dims = list(src.ndrange()), list(dst.ndrange())
    pairs: list[int | None] = []
    if len(src_dims) == len(dst_dims):
        pairs.extend(range(len(src_dims)))
    else:
        wide = iter([k for k, (b, e, _) in enumerate(src_dims) if not same_value(b, e)])
        for b, e, _ in dst_dims:
            k = None if same_value(b, e) else next(wide, -1)
            if k == -1:
                return None  # more wide dimensions in the destination than in the temporary
            pairs.append(k)
        if next(wide, None) is not None:
            return None  # fewer
    shift: list[tuple[int | None, Any]] = []
    for k, (b1, e1, s1) in zip(pairs, dst_dims):
        if k is None:
            shift.append((None, b1))
            continue
        b0, e0, s0 = src_dims[k]
        if not (same_value(s0, 1) and same_value(s1, 1) and same_value(e0 - b0, e1 - b1)):
            return None
        shift.append((k, b1 - b0))
    return shift


def _moved(subset, shift) -> subsets.Range:
    """`subset` of the temporary as the elements of the destination it is copied to (`_shift`)."""
    dims = subset.ndrange()
    return subsets.Range([(dims[k][0] + d, dims[k][1] + d, dims[k][2]) if k is not None else (d, d, 1)
                          for k, d in shift])


def match_at(sdfg: dace.SDFG, state: dace.SDFGState, temp: nd.AccessNode):
    """The rewrite's match at the temporary `temp` (module doc), or None."""
    desc = sdfg.arrays[temp.data]
    if not desc.transient or isinstance(desc, dace.data.View) or not accessed_at_one_node(sdfg, temp.data):
        return None
    found = _copy(state, temp)
    if found is None:
        return None
    write, copy, dest = found
    target = dest.data
    if isinstance(sdfg.arrays[target], dace.data.View) or state.in_degree(dest) != 1:
        return None
    exit_ = write.src
    entry = state.entry_node(exit_)
    if entry is None or state.entry_node(entry) is not None or not elementwise_scope(state, entry, python_only=True):
        return None
    shift = _shift(copy, state)
    if shift is None or not (write.src_conn or "").startswith("OUT_"):
        return None
    src = copy.data.get_src_subset(copy, state)
    inner_writes = [e for e in state.in_edges(exit_) if e.dst_conn == "IN_" + write.src_conn[4:]]
    if not inner_writes or any(e.data.data != temp.data or e.data.wcr is not None or e.data.dynamic
                               for e in inner_writes):
        return None
    boxes = [_written_box(e.data.subset, entry) for e in inner_writes]
    if any(box is None or not _same(box, src) for box in boxes):
        return None  # the map writes other elements than the copy moves (or one element twice)
    if any(e.data.data == target for e in state.in_edges(exit_) if e not in inner_writes):
        return None  # the map writes the array itself elsewhere
    images = [_moved(e.data.subset, shift) for e in inner_writes]
    scope = set(state.scope_subgraph(entry).nodes())
    for e in state.out_edges(entry):
        if e.data.data != target:
            continue
        if all(_never_written(e.data.subset, image, entry) for image in images):
            continue  # an element no iteration writes: it reads the old value whatever the order
        if any(not _same(e.data.subset, image) for image in images):
            return None  # a read of another element of the array
        after = nx.descendants(state.nx, e.dst) | {e.dst}
        if any(w.src not in after for w in inner_writes):
            return None  # the element could be written before this read
    if any(n.data == target and n is not dest and state.in_degree(n) > 0 for n in state.data_nodes()):
        return None  # the array is written elsewhere in the state
    ancestors = nx.ancestors(state.nx, entry)
    for n in state.data_nodes():
        if n.data != target or n is dest:
            continue
        for e in state.out_edges(n):
            if e.dst not in scope and e.dst not in ancestors:
                return None  # read after (or beside) the map: it would see the new value
    return state, temp, write, copy, dest, shift, inner_writes


@register_pass
@attrs.frozen
class WriteInPlace(RewritePass):
    """An element-wise map writing a temporary copied into an array writes the array (module doc)."""

    name: ClassVar[str] = "write_in_place"
    strategy: ClassVar[str] = ONE_AT_A_TIME  # each rewrite changes the graph the next proof reads

    def matches(self, sdfg: dace.SDFG) -> Iterator:
        return at_data_nodes(sdfg, match_at)

    def rewrite(self, sdfg: dace.SDFG, match) -> None:
        state, temp, write, copy, dest, shift, inner_writes = match
        target = dest.data
        for e in inner_writes:
            e.data = dace.Memlet(data=target, subset=_moved(e.data.subset, shift))
        state.add_edge(write.src, write.src_conn, dest, copy.dst_conn,
                       dace.Memlet(data=target, subset=_moved(write.data.subset, shift)))
        state.remove_node(temp)
        sdfg.remove_data(temp.data, validate=False)  # its one access node (the match's precondition) is gone
