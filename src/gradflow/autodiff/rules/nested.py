"""Reverse rule for nested SDFGs, alone or as the body of a map.

A nested SDFG is differentiated recursively: its own SDFG goes through the same normalization and
engine, in vjp mode, giving an SDFG that reruns the nested forward (on the values the outer backward
sweep holds for its inputs) and then its backward sweep. In the outer backward sweep that SDFG takes
the place of the nested node, under a map over the same range when the forward one was a map body:

    inputs:  the forward inputs (connector names unchanged), the cotangent `gradflow_d_<out>` of each
             active output (the outer gradient of what it wrote);
    in/out:  the gradient `gradflow_d_<in>` of each active input, accumulated into the outer gradient
             (the nested backward adds to it rather than overwriting it).

The nested outputs become scratch transients of the recomputation. Afterwards the outer gradients of the
overwritten outputs are cleared. Each map iteration accumulates into its own part of an input gradient
(checked: every map parameter indexes a dimension on its own), so iterations do not race.
"""

from __future__ import annotations

import copy

import dace
from dace.sdfg import nodes as nd

from gradflow.analysis.activity import is_float
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import map_ranges, safe_label, subset_elements
from gradflow.autodiff.rules import reverse_rule
from gradflow.core.errors import NotDifferentiableError

PREFIX = "gradflow_d_"


def _parts(site: OpSite) -> tuple[nd.NestedSDFG, nd.MapEntry | None]:
    members = site.members()
    nested = [n for n in members if isinstance(n, nd.NestedSDFG)]
    entry = next((n for n in members if isinstance(n, nd.MapEntry)), None)
    return nested[0], entry


def _is_map_of_nested(site: OpSite) -> bool:
    members = site.members()
    nested = [n for n in members if isinstance(n, nd.NestedSDFG)]
    others = [n for n in members if not isinstance(n, (nd.NestedSDFG, nd.MapEntry, nd.MapExit, nd.AccessNode))]
    entries = [n for n in members if isinstance(n, nd.MapEntry)]
    return len(nested) == 1 and not others and len(entries) == 1


def _edges(site: OpSite, node: nd.NestedSDFG):
    state = site.state
    ins = {e.dst_conn: e for e in state.in_edges(node) if e.dst_conn and not e.data.is_empty()}
    outs = {e.src_conn: e for e in state.out_edges(node) if e.src_conn and not e.data.is_empty()}
    shared = sorted(set(ins) & set(outs))
    if shared:
        raise NotDifferentiableError(
            f"nested SDFG '{node.label}' in state '{state.label}' reads and writes {', '.join(shared)}; "
            "in/out connectors of nested SDFGs are not differentiated yet",
            "write the result to a new array",
        )
    return ins, outs


def _check_disjoint(entry: nd.MapEntry, memlet: dace.Memlet, where: str) -> None:
    params = set(entry.map.params)
    owned = set()
    for begin, end, _ in memlet.subset:
        free = {str(s) for s in dace.symbolic.pystr_to_symbolic(str(begin)).free_symbols} & params
        if begin == end and len(free) == 1:
            owned |= free
    if owned != params:
        raise NotDifferentiableError(
            f"{where}: map iterations read overlapping parts of '{memlet.data}' ({memlet.subset}); their "
            "gradients would be accumulated concurrently",
        )


def _inner_vjp(node: nd.NestedSDFG, wrt: list[str], of: list[str], ctx: ReverseContext) -> dace.SDFG:
    """The nested SDFG through the same normalization pipeline and engine (same tables, same forwarding
    policy), in vjp mode with accumulating gradients."""
    from gradflow.autodiff.engine import ADSpec, build_reverse
    from gradflow.autodiff.normalize import normalize_pipeline
    from gradflow.core.graph import Graph
    from gradflow.core.passes import unwrap_or_raise

    graph = unwrap_or_raise(normalize_pipeline(ctx.tables.library)(Graph.of(copy.deepcopy(node.sdfg))))
    inner = graph.editable()
    spec = ADSpec(tuple(wrt), tuple(of), "vjp", PREFIX, ctx.spec.forwarding, accumulate=True)
    interface = build_reverse(inner, spec, ctx.tables)
    for name in interface.rules_used:
        ctx.note_rule(name)
    if interface.bounded_loops:
        raise NotDifferentiableError(
            f"nested SDFG '{node.label}' holds while loops with a user bound; not supported inside a nested SDFG"
        )
    for name, desc in inner.arrays.items():
        if not desc.transient and name in node.out_connectors and name not in wrt:
            desc.transient = True  # the recomputed forward outputs are scratch
    inner.name = f"{node.sdfg.name}_vjp"
    return inner


@reverse_rule("map", priority=5, applies=_is_map_of_nested, name="NestedReverse[map]")
@reverse_rule("nested")
class NestedReverse:
    """A nested SDFG, alone or as a map body: its own vjp, run in the backward sweep (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        node, _ = _parts(site)
        ins, outs = _edges(site, node)
        if not any(ctx.grad_of(e.data.data) for e in outs.values()):
            return frozenset()
        return frozenset(e.data.data for e in ins.values())

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node, entry = _parts(site)
        where = f"nested SDFG '{node.label}' in state '{site.state.label}'"
        ins, outs = _edges(site, node)
        active_out = sorted(c for c, e in outs.items() if ctx.grad_of(e.data.data))
        if not active_out:
            return
        active_in = sorted(c for c, e in ins.items()
                           if ctx.grad_of(e.data.data) and is_float(node.sdfg.arrays[c]))
        if entry is not None:
            for c in active_in:
                _check_disjoint(entry, ins[c].data, where)
        inner = _inner_vjp(node, active_in, active_out, ctx)

        state = ctx.new_state(f"reverse_{site.state.label}")
        grads_in = {PREFIX + c for c in active_in}
        inputs = set(ins) | {PREFIX + c for c in active_out} | grads_in
        call = state.add_nested_sdfg(inner, inputs, grads_in, dict(node.symbol_mapping),
                                     name=safe_label(f"vjp_{node.label}"))
        if entry is not None:
            me, mx = state.add_map(safe_label(f"rev_{node.label}"), map_ranges(entry))
        reads: dict[str, nd.AccessNode] = {}
        writes: dict[str, nd.AccessNode] = {}

        def read(array: str, conn: str, memlet: dace.Memlet) -> None:
            if array not in reads:
                reads[array] = state.add_read(array)
            m = dace.Memlet(data=array, subset=copy.deepcopy(memlet.subset))
            if entry is None:
                state.add_edge(reads[array], None, call, conn, m)
            else:
                state.add_memlet_path(reads[array], me, call, dst_conn=conn, memlet=m)

        def write(array: str, conn: str, memlet: dace.Memlet) -> None:
            if array not in writes:
                writes[array] = state.add_write(array)
            m = dace.Memlet(data=array, subset=copy.deepcopy(memlet.subset))
            if entry is None:
                state.add_edge(call, conn, writes[array], None, m)
            else:
                state.add_memlet_path(call, mx, writes[array], src_conn=conn, memlet=m)

        for c, e in ins.items():
            read(ctx.value_of(site.index, e.data.data), c, e.data)
        for c in active_out:
            read(ctx.grad_of(outs[c].data.data), PREFIX + c, outs[c].data)
        for c in active_in:
            read(ctx.grad_of(ins[c].data.data), PREFIX + c, ins[c].data)
            write(ctx.grad_of(ins[c].data.data), PREFIX + c, ins[c].data)

        # The forward overwrote its outputs: their old values had no influence.
        clear = ctx.new_state(f"clear_{site.state.label}")
        for c in active_out:
            memlet = outs[c].data
            ranges, _, index = subset_elements(memlet.subset, "__c")
            outer = dict(map_ranges(entry)) if entry is not None else {}
            clear.add_mapped_tasklet(
                safe_label(f"clear_{c}"), {**outer, **ranges}, {}, "__o = 0",
                {"__o": dace.Memlet(f"{ctx.grad_of(memlet.data)}[{index}]")}, external_edges=True,
            )

