"""Normalization pass `remove_views`: View access nodes are replaced by the array they view, or by an array
of their own.

Strided slices (`X[1::2]`), `keepdims` results and reshapes (`np.reshape`, `.flatten()`, `x.reshape(...)`)
reach the SDFG as `View` access nodes: a node of a `View` descriptor joined to the viewed array by one edge
whose subset says which part of the array the view is (e.g. `X[1:2*H:2]`). Reverse mode has no notion of
aliasing, so each view goes one of two ways:

- *composed*: when the view's non-unit dimensions correspond one-to-one, in order, to the non-unit
  dimensions of the viewed subset (equal extents, and view strides that are the array's times the step:
  slices, strides, added or dropped unit dimensions), every memlet that addresses the view is rewritten
  onto the viewed array (view index j -> begin + step * j) and the view's other edges are connected to the
  viewed array's access node;
- *materialized*: the view becomes a transient array of its shape. A strided view read or written by a
  library node is filled by a copy from the viewed subset (or copied back to it): DaCe's library
  expansions address an operand by its first element and the array's strides, ignoring a subset's step,
  so composing would change what they compute; so is a view that drops unit dimensions of the subset and
  is an operand of a node whose validation counts dimensions (`TensorTranspose`). A real reshape (the
  view's elements in row-major order are the viewed subset's in row-major order: both packed C layouts,
  the subset one contiguous block) is filled by a map that copies element by element at equal row-major
  positions (`_reshape_map`).

The result computes the same values. Any other view (a reshape of a strided or partial slice, which DaCe
reads as consecutive memory, unlike numpy) is rejected with a `NotDifferentiableError` naming it.
One-element ranges with a stride (`Y[3*i:3*i:3]`, which strided slices leave behind) are given step 1, so
that they read as the single element they are.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState
from returns.result import Success

from gradflow.analysis.indices import same_value as _same
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass


def _unit(size) -> bool:
    return sympy.sympify(size) == 1


def _view_edge(state: SDFGState, view: nd.AccessNode):
    """The edge joining the view to the array it views, and that array's access node."""
    sdfg = state.sdfg
    for e in state.in_edges(view):
        if (isinstance(e.src, nd.AccessNode) and e.data.data == e.src.data
                and not isinstance(sdfg.arrays[e.src.data], dace.data.View)):
            return e, e.src
    for e in state.out_edges(view):
        if (isinstance(e.dst, nd.AccessNode) and e.data.data == e.dst.data
                and not isinstance(sdfg.arrays[e.dst.data], dace.data.View)):
            return e, e.dst
    return None, None


def _nonunit(sizes) -> list[int]:
    return [d for d, s in enumerate(sizes) if not _unit(s)]


def _pairing(viewed: subsets.Range, view: dace.data.Data) -> dict[int, int] | None:
    """Viewed dimension -> view dimension, the non-unit ones in order; None when their counts differ."""
    vdims, adims = _nonunit(view.shape), _nonunit(viewed.size())
    return dict(zip(adims, vdims)) if len(vdims) == len(adims) else None


def _composer(viewed: subsets.Range, view: dace.data.Data, array: dace.data.Data):
    """A function taking a subset of the view to the same elements as a subset of the viewed array, or
    None when the view does not address the viewed subset dimension by dimension."""
    pairing = _pairing(viewed, view)
    if pairing is None:
        return None
    for d, j in pairing.items():
        if not (_same(viewed.size()[d], view.shape[j]) and _same(view.strides[j], array.strides[d] * viewed[d][2])):
            return None

    def compose(sub: subsets.Range) -> subsets.Range:
        out = []
        for d, (begin, _end, step) in enumerate(viewed):
            j = pairing.get(d)
            if j is None:
                out.append((begin, begin, 1))
            else:
                b, e, s = sub[j]
                single = sympy.simplify(sympy.sympify(e) - sympy.sympify(b)) == 0
                out.append((begin + step * b, begin + step * e, 1 if single else step * s))
        return subsets.Range(out)

    return compose


def _other_edges(state: SDFGState, view: nd.AccessNode, vedge) -> list:
    return [e for e in state.all_edges(view) if e is not vedge]


def _library_operand(state: SDFGState, view: nd.AccessNode, vedge) -> bool:
    """Does a library node read or write the view (directly or through scopes)?"""
    return any(isinstance(t.src, nd.LibraryNode) or isinstance(t.dst, nd.LibraryNode)
               for e in _other_edges(state, view, vedge) for t in state.memlet_tree(e))


#: Library nodes whose validation requires each operand's memlet to have the operand's number of dimensions
#: (DaCe's `TensorTranspose` compares modes; its other nodes drop unit dimensions themselves).
_MODES_CHECKED = ("TensorTranspose",)


def _modes_change(state: SDFGState, view: nd.AccessNode, vedge) -> bool:
    """Would composing give a node of `_MODES_CHECKED` a memlet of another dimension count than the view's?"""
    if len(vedge.data.subset) == len(state.sdfg.arrays[view.data].shape):
        return False
    return any(type(node).__name__ in _MODES_CHECKED for e in _other_edges(state, view, vedge)
               for t in state.memlet_tree(e) for node in (t.src, t.dst))


def _strided(viewed: subsets.Range) -> bool:
    return any(not _unit(size) and not _unit(step) for size, (_, _, step) in zip(viewed.size(), viewed))


def _packed_c(desc: dace.data.Data) -> bool:
    """Row-major strides with no padding (compared symbolically: frontends spell strides expanded)."""
    expected = 1
    for size, stride in reversed(list(zip(desc.shape, desc.strides))):
        if not _same(stride, expected):
            return False
        expected = expected * size
    return True


def _contiguous(viewed: subsets.Range, array: dace.data.Data) -> bool:
    """One uninterrupted block of a row-major array: step 1, and every dimension before the last partial
    one has extent 1."""
    if any(not _unit(step) for _, _, step in viewed):
        return False
    partial = [d for d, (size, extent) in enumerate(zip(viewed.size(), array.shape)) if not _same(size, extent)]
    return not partial or all(_unit(viewed.size()[d]) for d in range(partial[-1]))


def _row_major(viewed: subsets.Range, view: dace.data.Data, array: dace.data.Data) -> bool:
    """Are the view's elements in row-major order the viewed subset's in row-major order?"""
    return type(array) is dace.data.Array and _packed_c(view) and _packed_c(array) and _contiguous(viewed, array)


def _compose(state: SDFGState, view: nd.AccessNode, vedge, target: nd.AccessNode, compose) -> None:
    # Rewrite every memlet that addresses the view, inside scopes too.
    whole = subsets.Range.from_array(state.sdfg.arrays[view.data])
    for e in _other_edges(state, view, vedge):
        for tree_edge in state.memlet_tree(e):
            m = tree_edge.data
            if m.data == view.data:
                m.data = target.data
                m.subset = compose(m.subset)
            elif tree_edge is e:  # a copy named by its other end: the view's side is other_subset, or all of it
                # (left None, the copy would now read or write the whole viewed array)
                m.other_subset = compose(m.other_subset if m.other_subset is not None else whole)
        if e.src is view:
            state.add_edge(target, None, e.dst, e.dst_conn, copy.deepcopy(e.data))
        else:
            state.add_edge(e.src, e.src_conn, target, None, copy.deepcopy(e.data))
        state.remove_edge(e)
    state.remove_edge(vedge)
    state.remove_node(view)


def _materialize(state: SDFGState, view: nd.AccessNode, vedge, names: dict[str, str], reshape: bool) -> None:
    """The view becomes a transient array (one per view descriptor, shared by its access nodes), filled
    from (or, for a view that is written, written back to) the viewed subset by a copy, or by a map for a
    reshape (`_reshape_map`)."""
    sdfg = state.sdfg
    desc = sdfg.arrays[view.data]
    if view.data not in names:
        names[view.data], _ = sdfg.add_array(f"{view.data}_copy", desc.shape, desc.dtype, transient=True,
                                             find_new_name=True)
    name = names[view.data]
    for e in _other_edges(state, view, vedge):
        for tree_edge in state.memlet_tree(e):
            if tree_edge.data.data == view.data:
                tree_edge.data.data = name
    view.data = name
    # an access node of a plain array has no `views` connector: rejoin the edge without it
    state.remove_edge(vedge)
    view.remove_in_connector("views")
    view.remove_out_connector("views")
    if vedge.dst is view:
        vedge = state.add_edge(vedge.src, vedge.src_conn, view, None, vedge.data)
    else:
        vedge = state.add_edge(view, None, vedge.dst, vedge.dst_conn, vedge.data)
    if reshape:
        _reshape_map(state, view, vedge)


def _reshape_map(state: SDFGState, view: nd.AccessNode, vedge) -> None:
    """Replace the copy on `vedge` (viewed subset <-> materialized view of another shape) by a map over the
    elements of the side it writes: view element p is the element of the viewed subset at the same
    row-major position (what the view's memory means, see `_row_major`). DaCe's own copy would do the
    same walk, but its expansion of a reshaping copy declares a map over the product of the extents, which
    its type inference fails on for lenet's `int_floor` extents, and it refuses copies between equal ranks.

    Why the written side: its index is then the map's parameters themselves and the other side's is found
    by integer divisions and remainders of their position. The adjoint of the copy sums into the read
    side's gradient at the written side's index: one element per iteration, which DaCe tells apart. Over
    the other side, it would sum at `(x / 32) % 32, x % 32`, and DaCe makes every such add atomic (the
    attention reshapes of a transformer layer: a fifth of its backward)."""
    sdfg = state.sdfg
    shape = sdfg.arrays[view.data].shape
    viewed = vedge.data.subset
    dims = _nonunit(viewed.size())
    sizes = [viewed.size()[d] for d in dims]
    reading = vedge.dst is view
    walked = (sizes or [1]) if reading else list(shape)  # one element viewed: a map of one iteration
    params = [symbolic.symbol(f"__v{j}") for j in range(len(walked))]
    flat, cum = 0, 1
    for p, size in zip(reversed(params), reversed(walked)):
        flat, cum = flat + p * cum, cum * size

    def at(targets):
        position, cum = [], 1
        for size in reversed(targets):
            position.append(symbolic.int_floor(flat, cum) % size)
            cum = cum * size
        return position[::-1]

    if reading:
        position = dict(zip(dims, params))
        on_view = dace.Memlet(data=view.data, subset=subsets.Range([(x, x, 1) for x in at(list(shape))]))
    else:
        position = dict(zip(dims, at(sizes)))
        on_view = dace.Memlet(data=view.data, subset=subsets.Range([(p, p, 1) for p in params]))
    element = subsets.Range([(b + s * position[d], b + s * position[d], 1) if d in position else (b, b, 1)
                             for d, (b, _e, s) in enumerate(viewed)])
    array = vedge.data.data
    on_array = dace.Memlet(data=array, subset=element)
    ranges = {str(p): f"0:{n}" for p, n in zip(params, walked)}
    if reading:  # read: view[...] = array[...]
        state.add_mapped_tasklet(f"reshape_{view.data}", ranges, {"__i": on_array}, "__o = __i", {"__o": on_view},
                                 external_edges=True, input_nodes={array: vedge.src}, output_nodes={view.data: view})
    else:  # written: array[...] = view[p]
        state.add_mapped_tasklet(f"reshape_{view.data}", ranges, {"__i": on_view}, "__o = __i", {"__o": on_array},
                                 external_edges=True, input_nodes={view.data: view}, output_nodes={array: vedge.dst})
    state.remove_edge(vedge)


def _remove(state: SDFGState, view: nd.AccessNode, names: dict[str, str]) -> bool:
    """Compose or materialize `view` (module docstring); False when it cannot (yet: a view of a view)."""
    sdfg = state.sdfg
    vedge, target = _view_edge(state, view)
    if vedge is None or not isinstance(vedge.data.subset, subsets.Range):
        return False
    viewed = vedge.data.subset
    vdesc, adesc = sdfg.arrays[view.data], sdfg.arrays[target.data]
    compose = _composer(viewed, vdesc, adesc)
    if compose is not None and not (_strided(viewed) and _library_operand(state, view, vedge)) \
            and not _modes_change(state, view, vedge):
        _compose(state, view, vedge, target, compose)
        return True
    if compose is not None:
        _materialize(state, view, vedge, names, reshape=False)
        return True
    whole_view = vedge.data.other_subset is None or vedge.data.other_subset == subsets.Range.from_array(vdesc)
    if whole_view and _row_major(viewed, vdesc, adesc):
        _materialize(state, view, vedge, names, reshape=True)
        return True
    return False


def _strided_subset(sub) -> bool:
    return isinstance(sub, subsets.Range) and _strided(sub)


def contiguous_library_operands(sdfg: dace.SDFG) -> bool:
    """Give every library node that reads or writes a strided subset of an array directly (`x[1:M:2]`) a
    contiguous temporary, filled by a copy from that subset (or copied back to it). DaCe's expansions of
    library nodes address an operand by its first element and the array's strides, ignoring a subset's
    step: `np.sum(x[1::2])` summed x[1], x[2], ... . `remove_views` keeps such operands materialized, but
    DaCe's `simplify` (run after later rewrites) removes the copy again as redundant and composes the step
    into the node's memlet; this restores the invariant after it. True if anything changed."""
    changed = False
    for sub in sdfg.all_sdfgs_recursive():
        for state in sub.states():
            for node in [n for n in state.nodes() if isinstance(n, nd.LibraryNode)]:
                for edge in list(state.in_edges(node)) + list(state.out_edges(node)):
                    other = edge.src if edge.dst is node else edge.dst
                    memlet = edge.data
                    if (memlet.data is None or not isinstance(other, nd.AccessNode) or memlet.data != other.data
                            or memlet.wcr is not None or not _strided_subset(memlet.subset)):
                        continue
                    desc = sub.arrays[memlet.data]
                    shape = memlet.subset.size()
                    name, _ = sub.add_array(f"{memlet.data}_contiguous", shape, desc.dtype, transient=True,
                                            find_new_name=True)
                    temp = state.add_access(name)
                    whole = subsets.Range([(0, n - 1, 1) for n in shape])
                    copy_memlet = dace.Memlet(data=memlet.data, subset=copy.deepcopy(memlet.subset),
                                              other_subset=whole)
                    use = dace.Memlet(data=name, subset=copy.deepcopy(whole))
                    state.remove_edge(edge)
                    if edge.dst is node:
                        state.add_edge(other, edge.src_conn, temp, None, copy_memlet)
                        state.add_edge(temp, None, node, edge.dst_conn, use)
                    else:
                        state.add_edge(node, edge.src_conn, temp, None, use)
                        state.add_edge(temp, None, other, edge.dst_conn, copy_memlet)
                    changed = True
    return changed


def simplify(sdfg: dace.SDFG) -> None:
    """DaCe's `simplify`, then the invariants `remove_views` established, which simplify can undo: it removes
    the copy of a strided library operand as redundant (composing its step into the node's memlet, or
    turning the copy back into a View of the strided subset). Passes call this, not simplify."""
    arrays = {(id(sub), name) for sub in sdfg.all_sdfgs_recursive() for name, desc in sub.arrays.items()
              if not isinstance(desc, dace.data.View)}
    sdfg.simplify()
    _stride_made_views(sdfg, arrays)
    if has_views(sdfg):
        remove_views(sdfg)  # ends with contiguous_library_operands
    else:
        contiguous_library_operands(sdfg)


def _stride_made_views(sdfg: dace.SDFG, arrays: set[tuple[int, str]]) -> None:
    """Give the Views that simplify made of arrays (`arrays`: (id of the SDFG, name) before it) the strides
    of what they view. DaCe's `RedundantSecondArray`, turning the copy `B = A[0:N:2, k]` into a View of A,
    gives the View A's strides and drops the step: B[j] would read A[j, k], not A[2 * j, k]."""
    for sub in sdfg.all_sdfgs_recursive():
        for state in sub.states():
            for view in _views(state):
                if (id(sub), view.data) not in arrays:
                    continue
                vedge, target = _view_edge(state, view)
                if vedge is None or not isinstance(vedge.data.subset, subsets.Range):
                    continue
                viewed, desc, array = vedge.data.subset, sub.arrays[view.data], sub.arrays[target.data]
                pairing = _pairing(viewed, desc)
                if pairing is None:
                    continue  # not a one-to-one view: remove_views materializes or rejects it
                strides = list(desc.strides)
                for d, j in pairing.items():
                    if _same(strides[j], array.strides[d]):
                        strides[j] = array.strides[d] * viewed[d][2]
                desc.strides = tuple(strides)


def _reject(state: SDFGState, view: nd.AccessNode) -> None:
    vedge, target = _view_edge(state, view)
    viewed = f"{target.data}[{vedge.data.subset}]" if vedge is not None else "another view"
    shape = tuple(state.sdfg.arrays[view.data].shape)
    raise NotDifferentiableError(
        f"view '{view.data}' in state '{state.label}' gives {viewed} the shape {shape}; it is neither a slice of "
        "it nor a reshape of one contiguous row-major block (DaCe reads such a view as consecutive memory, "
        "which is not what numpy's reshape of that slice holds)",
        "copy the slice into an array of its own (np.copy) and reshape the copy")


def _unit_steps(state: SDFGState) -> None:
    """A one-element range with a stride (`Y[3*i:3*i:3]`, as strided slices produce) gets step 1."""
    for e in state.edges():
        for attr in ("subset", "other_subset"):
            sub = getattr(e.data, attr)
            if isinstance(sub, subsets.Range) and any(
                    s != 1 and sympy.simplify(sympy.sympify(b) - sympy.sympify(x)) == 0 for b, x, s in sub):
                setattr(e.data, attr, subsets.Range(
                    [(b, x, 1 if sympy.simplify(sympy.sympify(b) - sympy.sympify(x)) == 0 else s) for b, x, s in sub]))


def _has_unit_steps(state: SDFGState) -> bool:
    return any(
        isinstance(sub, subsets.Range) and any(s != 1 and sympy.sympify(b) == sympy.sympify(x) for b, x, s in sub)
        for e in state.edges() for sub in (e.data.subset, e.data.other_subset))


def _views(state: SDFGState) -> list[nd.AccessNode]:
    return [n for n in state.data_nodes() if isinstance(state.sdfg.arrays[n.data], dace.data.View)]


@register_pass
@attrs.frozen
class RemoveViews(Pass):
    """Replace View access nodes by the arrays they view (see the module docstring)."""

    name: ClassVar[str] = "remove_views"

    def run(self, graph: Graph) -> PassResult:
        if not has_views(graph.sdfg):
            return Success(graph)
        sdfg = graph.editable()
        remove_views(sdfg)
        return Success(Graph.adopt(sdfg, graph.meta))


def has_views(sdfg: dace.SDFG) -> bool:
    return any(_views(s) or _has_unit_steps(s) for s in sdfg.states())


def remove_views(sdfg: dace.SDFG) -> None:
    """The pass's work, in place on a private SDFG (`expand_library_nodes` also runs it on the views its
    expansions make, e.g. upstream's `ONNXReshape`)."""
    names: dict[str, str] = {}  # view descriptor -> the transient its materialized nodes use
    for state in sdfg.states():
        # a view of a view (`np.reshape(A[1:, 1:], ...)`) is joined to an array once the inner one is gone
        while any(_remove(state, view, names) for view in _views(state)):
            pass
        for view in _views(state):
            _reject(state, view)
        _unit_steps(state)
    used = {n.data for s in sdfg.states() for n in s.data_nodes()}
    for name, desc in list(sdfg.arrays.items()):
        if isinstance(desc, dace.data.View) and name not in used:
            sdfg.remove_data(name, validate=False)
    contiguous_library_operands(sdfg)
