"""Reverse rule for nested SDFGs, alone or as the body of a map.

A nested SDFG is differentiated recursively: its own SDFG goes through the same normalization pipeline
and engine (same tables, the user's forwarding policy), in vjp mode, giving an SDFG that reruns the nested
forward (on the values the outer backward sweep holds for its inputs) and then its backward sweep. In the
outer backward sweep that SDFG takes the place of the nested node, under a map over the same range when
the forward one was a map body:

    inputs:  the forward inputs (connector names unchanged), the cotangent `gradflow_d_<out>` of each
             active output (the outer gradient of what it wrote);
    in/out:  the gradient `gradflow_d_<in>` of each active input, accumulated into the outer gradient
             (the nested backward adds to it rather than overwriting it).

The nested outputs become scratch transients of the recomputation. Afterwards the outer gradients of the
overwritten outputs are cleared. Each map iteration accumulates into its part of an input gradient; when
every map parameter indexes a dimension of that part on its own, the parts are disjoint and the reverse
map runs in parallel like the forward one. When iterations read overlapping parts (every point of a map
reads a shared parameter, a whole vector), their accumulations would race: the reverse map is then
sequential (`ScheduleType.Sequential`, which no later pass makes parallel), each iteration adding into the
gradient in turn.

An in/out connector `c` (the node updates part of an array in place) is split inside the nested vjp: its
input becomes `gradflow_in_<c>`, copied into a private `c` the rerun works on, so the rerun never writes
the outer array. Its outer gradient is both the cotangent of the new value and the place the gradient of
the old value goes: it is moved to a temporary (the cotangent) and cleared before the call, which then
accumulates into it. While loops with a user bound inside the nested SDFG stop at the bound in the rerun
and report through the outer `gradflow_overflow` (numbered after the outer program's own loops).
"""

from __future__ import annotations

import copy

import dace
from dace import subsets
from dace.sdfg import nodes as nd

from gradflow.analysis.activity import is_float
from gradflow.analysis.writes import overwritten_before_read_in
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import (
    map_ranges,
    mapped_tasklet,
    safe_label,
    subset_elements,
)
from gradflow.autodiff.nesting import IN, PREFIX, inner_region, nested_vjp
from gradflow.autodiff.protocols import reverse_rule
from gradflow.autodiff.spec import OVERFLOW, flag_array
from gradflow.core.errors import NotDifferentiableError


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
    return ins, outs


def _partial_outputs(node: nd.NestedSDFG, ins: dict, outs: dict, where: str) -> list[str]:
    """Output-only connectors that the nested SDFG may leave partly unwritten (it writes `x1[3]` through a
    memlet over all of `x1`; a checkpointed loop's step writes what its body writes). The elements it leaves
    keep their old value, so the gradient of that value is the cotangent there: such a connector is
    reversed as an in/out one (split, its old value read), never by clearing the whole memlet."""
    return sorted(c for c, e in outs.items() if c not in ins and not overwritten_before_read_in(
        node.sdfg, c, inner_region(node, e.data, where)))


def _disjoint(entry: nd.MapEntry, memlet: dace.Memlet) -> bool:
    """Whether the map's iterations access disjoint parts through `memlet`: every map parameter indexes a
    dimension on its own."""
    params = set(entry.map.params)
    owned = set()
    for begin, end, _ in memlet.subset:
        free = {str(s) for s in dace.symbolic.pystr_to_symbolic(str(begin)).free_symbols} & params
        if begin == end and len(free) == 1:
            owned |= free
    return owned == params


def _overlapping(entry: nd.MapEntry | None, active_in: list[str], read_memlets: dict, shared: list[str],
                 where: str) -> list[str]:
    """The active inputs the map's iterations read in overlapping parts (every point reads one shared
    parameter): their gradients' accumulations would race, so the reverse map runs its iterations one
    after another. An array updated in place in overlapping parts would be a race of the forward map."""
    overlapping = [c for c in active_in if entry is not None and not _disjoint(entry, read_memlets[c])]
    for c in overlapping:
        if c in shared:
            raise NotDifferentiableError(f"{where}: map iterations update overlapping parts of "
                                         f"'{read_memlets[c].data}' ({read_memlets[c].subset}) in place")
    return overlapping


def _inner_vjp(node: nd.NestedSDFG, wrt: list[str], of: list[str], regions: dict[str, subsets.Range],
               seeds: dict[str, subsets.Range], ctx: ReverseContext) -> tuple[dace.SDFG, bool]:
    """The nested SDFG (in/out connectors split) differentiated by the engine's `differentiate` (the same
    normalization and tables; the forwarding policy for a nested inside: a byte budget does not apply), in
    vjp mode with accumulating gradients; and whether it reports bounded while loops through
    `gradflow_overflow`."""
    inner, interface = nested_vjp(node, regions, tuple(wrt), tuple(of), ctx.spec.forwarding.inside_nested(),
                                  ctx.differentiate, overflow_base=ctx.overflow_base + len(ctx.inner_bounded),
                                  seed_regions=tuple((c, str(r)) for c, r in sorted(seeds.items())))
    for name in interface.rules_used:
        ctx.note_rule(name)
    ctx.inner_bounded.extend(interface.bounded_loops)
    for name, desc in inner.arrays.items():
        if not desc.transient and name in node.out_connectors and name not in wrt:
            desc.transient = True  # the recomputed forward outputs are scratch
    inner.name = f"{node.sdfg.name}_vjp"
    return inner, OVERFLOW in inner.arrays


def _grad_buffer(ctx: ReverseContext, array: str) -> str:
    """The gradient buffer of the array of an active connector (`active_out` and `active_in` hold only
    connectors whose array has one)."""
    buffer = ctx.grad_of(array)
    assert buffer is not None
    return buffer


@reverse_rule("map", priority=5, applies=_is_map_of_nested, name="NestedReverse[map]")
@reverse_rule("nested")
class NestedReverse:
    """A nested SDFG, alone or as a map body: its own vjp, run in the backward sweep (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        node, _ = _parts(site)
        ins, outs = _edges(site, node)
        if not any(ctx.grad_of(e.data.data) for e in outs.values()):
            return frozenset()
        partial = _partial_outputs(node, ins, outs, f"nested SDFG '{node.label}'")
        return frozenset(e.data.data for e in ins.values()) | frozenset(outs[c].data.data for c in partial)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        node, entry = _parts(site)
        where = f"nested SDFG '{node.label}' in state '{site.state.label}'"
        ins, outs = _edges(site, node)
        active_out = sorted(c for c, e in outs.items() if ctx.grad_of(e.data.data))
        if not active_out:
            return
        partial = _partial_outputs(node, ins, outs, where)
        read_memlets = {**{c: e.data for c, e in ins.items()}, **{c: outs[c].data for c in partial}}
        active_in = sorted(c for c, m in read_memlets.items()
                           if ctx.grad_of(m.data) and is_float(node.sdfg.arrays[c]))
        shared = sorted((set(ins) & set(outs)) | set(partial))
        overlapping = _overlapping(entry, active_in, read_memlets, shared, where)
        inner_in = {c: IN + c if c in shared else c for c in read_memlets}  # inner names of the forward inputs
        regions = {c: inner_region(node, read_memlets[c], where) for c in shared}
        # the part of each output's cotangent the call can read: what it writes (an in/out connector: what
        # it reads, which covers that, since elements it leaves pass their cotangent through)
        seeds = {c: regions[c] if c in regions else inner_region(node, outs[c].data, where) for c in active_out}
        inner, overflow = _inner_vjp(node, [inner_in[c] for c in active_in], active_out, regions, seeds, ctx)
        outer = dict(map_ranges(entry)) if entry is not None else {}

        def over_subset(label: str, memlet: dace.Memlet, target: str, code: str, inputs: dict) -> None:
            """`target[e] = code(inputs[e])` for each element e of `memlet`'s subset (per iteration of the
            forward map, if any), as one mapped tasklet in a new state."""
            ranges, _, index = subset_elements(memlet.subset, "__c")
            reads_ = {k: dace.Memlet(f"{a}[{index}]") for k, a in inputs.items()}
            where_ = ctx.new_state(f"{label}_{site.state.label}")
            mapped_tasklet(where_, safe_label(f"{label}_{memlet.data}"), {**outer, **ranges}, reads_, code,
                           {"__o": dace.Memlet(f"{target}[{index}]")})

        # An updated-in-place array: its gradient is the cotangent of the new value; move it aside first.
        # The inner code addresses an in/out connector relative to its *read* subset (the pointer DaCe
        # passes), which covers what it writes, so the move, the clear and the call all use that subset.
        cotangent: dict[str, str] = {}
        for c in shared:
            if c not in active_out or c not in active_in:
                continue
            if read_memlets[c].subset.covers(outs[c].data.subset) is not True:
                raise NotDifferentiableError(f"{where}: connector '{c}' writes {outs[c].data.subset}, outside the "
                                             f"part {read_memlets[c].subset} it reads")
            memlet, grad = read_memlets[c], _grad_buffer(ctx, read_memlets[c].data)
            desc = ctx.sdfg.arrays[grad]
            cotangent[c], _ = ctx.sdfg.add_array(f"gradflow_t_cot_{c}", desc.shape, desc.dtype, transient=True,
                                                 find_new_name=True)
            over_subset("save_cotangent", memlet, cotangent[c], "__o = __g", {"__g": grad})
            over_subset("clear", memlet, grad, "__o = 0", {})

        state = ctx.new_state(f"reverse_{site.state.label}")
        grads_in = {PREFIX + inner_in[c] for c in active_in}
        inputs = set(inner_in.values()) | {PREFIX + c for c in active_out} | grads_in
        outputs = grads_in | ({OVERFLOW} if overflow else set())
        call = state.add_nested_sdfg(inner, dict.fromkeys(sorted(inputs)), dict.fromkeys(sorted(outputs)),
                                     dict(node.symbol_mapping),
                                     name=safe_label(f"vjp_{node.label}"))
        if entry is not None:
            me, mx = state.add_map(safe_label(f"rev_{node.label}"), map_ranges(entry),
                                   schedule=dace.ScheduleType.Sequential if overlapping else dace.ScheduleType.Default)
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

        for c, memlet in read_memlets.items():
            read(ctx.value_of(site.index, memlet.data), inner_in[c], memlet)
        for c in active_out:
            if c in cotangent:
                read(cotangent[c], PREFIX + c, read_memlets[c])
            else:
                read(_grad_buffer(ctx, outs[c].data.data), PREFIX + c, outs[c].data)
        for c in active_in:
            read(_grad_buffer(ctx, read_memlets[c].data), PREFIX + inner_in[c], read_memlets[c])
            write(_grad_buffer(ctx, read_memlets[c].data), PREFIX + inner_in[c], read_memlets[c])
        if overflow:
            flag_array(ctx.sdfg)
            write(OVERFLOW, OVERFLOW, dace.Memlet(f"{OVERFLOW}[0]"))

        # The forward overwrote its outputs: their old values had no influence (in/out ones: done above).
        for c in active_out:
            if c in cotangent:
                continue
            memlet = outs[c].data
            over_subset("clear", memlet, _grad_buffer(ctx, memlet.data), "__o = 0", {})
