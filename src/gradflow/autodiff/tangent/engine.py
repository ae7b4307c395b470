"""The forward-mode engine: the tangent program of a normalized SDFG, built in place.

1. Activity: the arrays whose values depend on a `wrt` array (`analysis.activity`'s varied set), the `of`
   arrays, and the float scalars local to the map bodies that write them, get a tangent array: `wrt` and
   `of` an argument `prefix + name`, the others a transient.
2. Every operation that writes an array with a tangent gets its tangent from the `tangent` table's rule for
   its kind, in its own state (NORMALIZE gave every operation one); a growable stack's heap push of a
   varied value, which writes only an integer record, also pushes its tangent (`heap.py`).
3. At the start of the outermost program, the tangents of arguments that are not `wrt` are zero (their
   initial values do not depend on the inputs): outputs the program writes only in part, in/out arrays.
Control flow is not touched.
"""

from __future__ import annotations

import copy

import dace
from dace.sdfg import nodes as nd
from dace.sdfg.utils import dfs_topological_sort

from gradflow.analysis.activity import OpAccess, activity, is_float
from gradflow.analysis.ops import decompose
from gradflow.autodiff.context import OpSite
from gradflow.autodiff.emit import fill
from gradflow.autodiff.structure import refuse_data_symbol_reads
from gradflow.autodiff.tangent.context import (
    Differentiate,
    TangentContext,
    TangentInterface,
    TangentSpec,
    TangentTables,
)
from gradflow.autodiff.tangent.heap import dual_heap_call, varied_push
from gradflow.core.errors import NotDifferentiableError


def _sites(sdfg: dace.SDFG) -> list[OpSite]:
    sites: list[OpSite] = []
    for state in sdfg.states():
        ops = decompose(state)
        if len(ops) > 1:
            raise NotDifferentiableError(
                f"state '{state.label}' holds {len(ops)} operations; run split_operations first")
        sites.extend(OpSite(len(sites), state, op) for op in ops)
    return sites


def _varied_locals(site: OpSite, varied: set[str]) -> set[str]:
    """The float arrays accessed inside the operation's scopes (a map body's scalars, an array a fused map
    writes and reads again) whose values there depend on a varied array: written by a tasklet that reads
    one (directly or through such an array), or copied from one."""
    state = site.state
    inside = set(site.members())
    found: set[str] = set()

    def carries(edge) -> bool:
        if edge.data.is_empty():
            return False
        source = state.memlet_path(edge)[0].src
        if isinstance(source, nd.AccessNode):
            return source.data in varied or source.data in found
        return isinstance(source, nd.Tasklet) and any(carries(e) for e in state.in_edges(source))

    for node in dfs_topological_sort(state, [n for n in state.source_nodes()]):
        if node in inside and isinstance(node, nd.AccessNode) and is_float(node.desc(state.sdfg)):
            if any(carries(e) for e in state.in_edges(node)):
                found.add(node.data)
    return found


def _written_inside(site: OpSite) -> set[str]:
    return {n.data for n in site.members() if isinstance(n, nd.AccessNode) and site.state.in_degree(n)}


def _add_tangent(sdfg: dace.SDFG, array: str, spec: TangentSpec) -> str:
    desc = copy.deepcopy(sdfg.arrays[array])
    if array in spec.wrt or array in spec.of:
        name = spec.prefix + array
        if name in sdfg.arrays:
            raise NotDifferentiableError(f"the tangent of '{array}' would be named '{name}', which the program uses",
                                         "choose another prefix")
        desc.transient = False
        sdfg.add_datadesc(name, desc)
        return name
    desc.transient = True
    desc.lifetime = dace.dtypes.AllocationLifetime.Scope
    return sdfg.add_datadesc(f"gradflow_t_{array}", desc, find_new_name=True)


def tangent_program(sdfg: dace.SDFG, spec: TangentSpec, tables: TangentTables,
                    differentiate: Differentiate) -> TangentInterface:
    """Make `sdfg` (normalized, owned by the caller) its own tangent program along `spec`."""
    sites = _sites(sdfg)
    accesses = [OpAccess(s.read_arrays(), s.written_arrays()) for s in sites]
    varied = set(spec.wrt)
    while True:  # operations' own dataflow (a map body's scalars, an array written inside a fused map) and
        # the arrays between operations, until neither adds an array
        before = len(varied)
        varied |= activity(sdfg.arrays, accesses, varied, ()).varied
        for site in sites:
            varied |= _varied_locals(site, varied)
        if len(varied) == before:
            break
    varied = {a for a in varied | set(spec.of) if is_float(sdfg.arrays[a])}
    writers = [s for s, acc in zip(sites, accesses) if (acc.writes | _written_inside(s)) & varied]
    refuse_data_symbol_reads(sdfg, sites, frozenset(varied))  # (a symbol hides its value from activity)
    tangents = {a: _add_tangent(sdfg, a, spec) for a in sorted(varied)}
    ctx = TangentContext(sdfg, tangents, tables, differentiate)
    for site in writers:
        rule = tables.tangent.lookup(site.op.kind, site)
        if rule is None:
            raise NotDifferentiableError(f"state '{site.state.label}': no tangent rule for a {site.op.kind} operation "
                                         f"('{site.op.label}')")
        ctx.note_rule(rule.name)
        rule.fn.tangent(site, ctx)
    for site in sites:  # heap pushes write only an integer record: no rule sees the value they carry away
        if site not in writers:
            mirror = ctx.mirror(site.state)
            for node in site.members():
                if varied_push(site.state, node, mirror):
                    dual_heap_call(site.state, node, mirror)
    zeros = sorted(a for a in tangents if not sdfg.arrays[a].transient and a not in spec.wrt)
    if spec.outermost and zeros:
        start = sdfg.add_state_before(sdfg.start_block, "gradflow_tangent_zeros", is_start_block=True)
        for a in zeros:
            fill(start, tangents[a], "0")
    sdfg.reset_cfg_list()
    return TangentInterface(spec, tangents, tuple(ctx.rules_used))
