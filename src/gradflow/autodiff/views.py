"""Normalization pass `remove_views`: View access nodes are replaced by the array they view.

Strided slices (`X[1::2]`), `keepdims` results and some reshapes reach the SDFG as `View` access nodes: a
node of a `View` descriptor joined to the viewed array by one edge whose subset says which part of the
array the view is (e.g. `X[1:2*H:2]`). Reverse mode has no notion of aliasing, so this pass composes
every memlet that addresses the view onto the viewed array (view index j -> begin + step * j in the viewed
dimension) and connects the view's other edges to the viewed array's access node. The result computes the
same thing with no views left. One-element ranges with a stride (`Y[3*i:3*i:3]`, which strided slices leave
behind) are given step 1, so that they read as the single element they are.

Only views whose non-unit dimensions correspond one-to-one, in order, to the non-unit dimensions of the
viewed subset are removed (slices, strides, added or dropped unit dimensions). Real reshapes (a 2-D view of
a 1-D array) are left in place, and reverse mode then reports them.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
import dace
import sympy
from dace import subsets
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass


def _unit(size) -> bool:
    return sympy.sympify(size) == 1


def _view_edge(state: SDFGState, view: nd.AccessNode):
    """The edge joining the view to the array it views, and that array's access node."""
    sdfg = state.sdfg
    for e in state.in_edges(view):
        if isinstance(e.src, nd.AccessNode) and e.data.data == e.src.data and not isinstance(sdfg.arrays[e.src.data], dace.data.View):
            return e, e.src
    for e in state.out_edges(view):
        if isinstance(e.dst, nd.AccessNode) and e.data.data == e.dst.data and not isinstance(sdfg.arrays[e.dst.data], dace.data.View):
            return e, e.dst
    return None, None


def _composer(viewed: subsets.Range, view_shape):
    """A function taking a subset of the view to the same elements as a subset of the viewed array."""
    vdims = [j for j, s in enumerate(view_shape) if not _unit(s)]
    adims = [d for d, s in enumerate(viewed.size()) if not _unit(s)]
    if len(vdims) != len(adims):
        return None
    pairing = dict(zip(adims, vdims))

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


def _remove(state: SDFGState, view: nd.AccessNode) -> bool:
    sdfg = state.sdfg
    vedge, target = _view_edge(state, view)
    if vedge is None:
        return False
    viewed = vedge.data.subset
    compose = _composer(viewed, sdfg.arrays[view.data].shape)
    if compose is None or not isinstance(viewed, subsets.Range):
        return False
    others = [e for e in state.all_edges(view) if e is not vedge]
    # Rewrite every memlet that addresses the view, inside scopes too.
    for e in others:
        for tree_edge in state.memlet_tree(e):
            m = tree_edge.data
            if m.data == view.data:
                m.data = target.data
                m.subset = compose(m.subset)
            elif m.other_subset is not None and tree_edge in (e,):
                m.other_subset = compose(m.other_subset)
        if e.src is view:
            state.add_edge(target, None, e.dst, e.dst_conn, copy.deepcopy(e.data))
        else:
            state.add_edge(e.src, e.src_conn, target, None, copy.deepcopy(e.data))
        state.remove_edge(e)
    state.remove_edge(vedge)
    state.remove_node(view)
    return True


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
        if not any(_views(s) or _has_unit_steps(s) for s in graph.sdfg.states()):
            return Success(graph)
        sdfg = graph.editable()
        for state in sdfg.states():
            for view in _views(state):
                _remove(state, view)
            _unit_steps(state)
        used = {n.data for s in sdfg.states() for n in s.data_nodes()}
        for name, desc in list(sdfg.arrays.items()):
            if isinstance(desc, dace.data.View) and name not in used:
                sdfg.remove_data(name, validate=False)
        return Success(Graph.adopt(sdfg, graph.meta))
