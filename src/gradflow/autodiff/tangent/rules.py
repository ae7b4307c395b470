"""The built-in rules of the `tangent` table: element-wise operations (dual tasklets), copies, nested SDFGs,
and library nodes (delegated to the `tangent_library` table, `library.py`)."""

from __future__ import annotations

from dace.sdfg import nodes as nd

from gradflow.autodiff.context import OpSite
from gradflow.autodiff.tangent.context import TangentContext, TangentSpec, tangent_rule
from gradflow.autodiff.tangent.dual import dual_tasklet
from gradflow.autodiff.tangent.heap import dual_heap_call
from gradflow.autodiff.tangent.products import product_edges, product_tangents
from gradflow.autodiff.tangent.zeros import zero_path, zero_subset
from gradflow.autodiff.tape import heap_call
from gradflow.core.errors import NotDifferentiableError


@tangent_rule("map", "tasklet")
class DualTasklets:
    """Every tasklet of the operation computes the tangents of what it writes (`dual.py`)."""

    def tangent(self, site: OpSite, ctx: TangentContext) -> None:
        state = site.state
        mirror = ctx.mirror(state)
        members = site.members()
        inside = set(members)
        # (read before any tangent node is added: a tangent scalar is unconnected until its writer is dual)
        constants = {n: ctx.constants(state, n) for n in members if isinstance(n, nd.Tasklet)}
        for e in state.edges():  # values copied into (or out of) the scalars of a map body
            if e.data.is_empty() or isinstance(e.src, nd.Tasklet) or isinstance(e.dst, nd.Tasklet):
                continue
            local = next((n for n in (e.dst, e.src) if isinstance(n, nd.AccessNode) and n in inside), None)
            if local is None:
                continue
            ends = [h for hop in state.memlet_path(e) for h in (hop.src, hop.dst) if isinstance(h, nd.AccessNode)]
            if not mirror.has_tangent(local.data):
                if local is e.src and mirror.has_tangent(ends[-1].data):  # a value without tangent stored
                    zero_path(state, mirror, e)                          # into a varied array: tangent 0
                continue
            if all(mirror.has_tangent(n.data) for n in ends):
                mirror.path(e)
            elif local is e.dst:
                raise NotDifferentiableError(
                    f"state '{state.label}': a map body copies a value without tangent into '{local.data}', whose "
                    "tangent other writes give")
        products = frozenset(product_edges(site, ctx))
        if products:
            product_tangents(site, ctx)
        for node in members:
            if heap_call(node):  # a growable stack's heap push or pop of a varied staging array
                dual_heap_call(state, node, mirror)
            elif isinstance(node, nd.Tasklet):
                dual_tasklet(state, node, mirror, constants[node], products)
            elif isinstance(node, nd.NestedSDFG):
                nested_tangent(state, node, ctx)
            elif isinstance(node, nd.LibraryNode) and any(
                    mirror.has_tangent(e.data.data) for e in state.out_edges(node)):
                raise NotDifferentiableError(
                    f"state '{state.label}': library node '{node}' inside a map scope writes a varied array",
                    "forward mode differentiates tasklets and nested SDFGs inside maps")


@tangent_rule("copy")
class Copies:
    """A copy copies the tangent; a copy of a value without tangent into an array with one writes zeros."""

    def tangent(self, site: OpSite, ctx: TangentContext) -> None:
        state = site.state
        mirror = ctx.mirror(state)
        reads = {state.node(i) for i in site.op.reads}
        writes = {state.node(i) for i in site.op.writes}
        for e in state.edges():
            if e.src not in reads or e.dst not in writes or not mirror.has_tangent(e.dst.data):
                continue
            if mirror.has_tangent(e.src.data):
                mirror.edge(e)
            else:
                zero_subset(state, mirror.node(e.dst), e.data.get_dst_subset(e, state))


@tangent_rule("library")
class LibraryNodes:
    """A library node kept whole: the `tangent_library` rule of its class."""

    def tangent(self, site: OpSite, ctx: TangentContext) -> None:
        node = next(n for n in site.members() if isinstance(n, nd.LibraryNode))
        rule = ctx.tables.library.lookup(type(node).__name__, node)
        if rule is None:
            raise NotDifferentiableError(
                f"library node '{node}' ({type(node).__name__}) has no tangent rule and was not expanded")
        ctx.note_rule(rule.name)
        rule.fn.tangent(site, node, ctx)


@tangent_rule("nested")
class NestedPrograms:
    """A nested SDFG becomes its own tangent program: seeded by the tangents of its varied inputs, returning
    those of its varied outputs, passed as connectors named after its inner tangent arrays."""

    def tangent(self, site: OpSite, ctx: TangentContext) -> None:
        node = next(n for n in site.members() if isinstance(n, nd.NestedSDFG))
        nested_tangent(site.state, node, ctx)


def nested_tangent(state, node: nd.NestedSDFG, ctx: TangentContext) -> None:
    """`node`'s SDFG replaced by its tangent program, and the tangent connectors' paths laid (through the
    maps around it, when it is a map's body)."""
    outer = ctx.mirror(state)
    ins = [e for e in state.in_edges(node) if not e.data.is_empty() and outer.has_tangent(e.data.data)]
    outs = [e for e in state.out_edges(node) if not e.data.is_empty() and outer.has_tangent(e.data.data)]
    if not outs:
        return
    seeds = tuple(sorted({e.dst_conn for e in ins}))
    results = tuple(sorted({e.src_conn for e in outs}))
    spec = TangentSpec(seeds, results, prefix="gradflow_t_", outermost=False)
    inner, interface = ctx.differentiate(node.sdfg, spec)
    node.sdfg = inner
    inner.parent = state
    inner.parent_sdfg = state.sdfg
    inner.parent_nsdfg_node = node
    names = interface.arguments()
    mirror = ctx.mirror(state, {(id(node), c): names[c] for c in (*seeds, *results)})
    for e in ins + outs:
        mirror.path(e)
