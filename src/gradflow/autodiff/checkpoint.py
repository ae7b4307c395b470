"""Checkpointed loops: a loop's forward keeps a few snapshots, its backward re-advances (Revolve).

Under `Forwarding.checkpoint(snapshots=s, ...)` a chosen loop is reversed without a per-iteration tape:

1. `outline` (run by the engine before it builds the control-flow tree) nests the loop body into one
   nested SDFG, the *step*: a function of the arrays the body reads and writes, the loop variable and the
   other symbols. The loop's body is then one operation, which records nothing on the tape (the engine
   skips sites of loops whose rule says `tape_free`).
2. `CheckpointedLoop` (a `loop` control rule, chosen for outlined loops) computes the Revolve schedule
   (`revolve.py`) for the trip count at the sizes given to the policy (the forward checks it before the
   loop and reports another count through `gradflow_overflow`: `_check_trips`). The forward sweep stores
   the loop-carried state at the positions where the schedule's forward phase takes snapshots (at most `s`)
   and the state the last step starts from (what Revolve holds in memory at its first turn).
3. The backward sweep interprets the rest of the schedule, emitted as constant int tables: a loop over
   actions with one branch per kind: *advance* n steps (the step, rerun on working copies), *takeshot*
   and *restore* (copies between the working copies and snapshot slots), *reverse* one step (the nested
   rule's vjp of the step: its forward with a one-iteration tape, then its backward; gradients of arrays
   the step only reads accumulate across steps).

Loop-carried state: the arrays the step writes that it may read before writing them in an iteration
(`analysis.writes.exposed_read`: a temporary written before every read, if only under a branch, is not),
and the arrays an operation before the loop reads (their working copies must hold the loop's initial
values once it is reversed). An array the step overwrites before reading (jacobi's `B`) is not stored:
its unwritten elements keep their initial values, and its written ones are recomputed.

The backward sweep writes its own snapshots into the slots the forward filled (the snapshot array is
consumed, like Revolve's checkpoints): a split backward runs once per forward run.

A while loop is checkpointed online (`CheckpointedLoop._record_online`): its forward counts the trips and
thins its snapshots as they come (`revolve.thinned`), and the backward asks a C++ generator for one action
at a time (`revolve.online_schedule`, computed at run time from the trip count the forward recorded).
"""

from __future__ import annotations

import attrs
import dace
import networkx as nx
import numpy as np
import sympy
from dace import symbolic
from dace.sdfg import nodes as nd
from dace.sdfg.graph import SubgraphView
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.analysis.access import covers_array
from gradflow.analysis.activity import is_float
from gradflow.analysis.loops import assigned_symbols, counted_loop
from gradflow.analysis.usage import arrays_used
from gradflow.analysis.writes import exposed_read, overwritten_before_read, overwritten_before_read_in
from gradflow.autodiff import revolve
from gradflow.autodiff.context import ReverseContext
from gradflow.autodiff.emit import copy_array
from gradflow.autodiff.forwarding import STORE_ALL
from gradflow.autodiff.nesting import IN, inner_region, nested_vjp
from gradflow.autodiff.protocols import ControlContext, control_rule
from gradflow.autodiff.spec import flag_branch
from gradflow.autodiff.structure import symbols_read
from gradflow.core.dace_warnings import dace_set_connectors
from gradflow.core.errors import InvalidArgumentError, NotDifferentiableError
from gradflow.core.exact_subsets import union

STEP = "gradflow_step_"


def _loops_around(block) -> list[LoopRegion]:
    found, graph = [], block.parent_graph
    while graph is not None and not isinstance(graph, dace.SDFG):
        if isinstance(graph, LoopRegion):
            found.append(graph)
        graph = graph.parent_graph
    return found


def _symbols_read(block) -> set[str]:
    return {str(x) for x in block.free_symbols}


def _body_reads(loop: LoopRegion, name: str) -> bool:
    """Whether a block of `loop`'s body or an interstate edge between them reads the symbol `name`."""
    return (any(name in _symbols_read(block) for block in loop.nodes())
            or any(name in map(str, e.data.read_symbols()) for e in loop.edges()))


def carried_symbols(loop: LoopRegion) -> list[str]:
    """Symbols the body of `loop` assigns on interstate edges and may read before assigning them in an
    iteration (their value comes from the previous one), or assigns inside a nested region. A step
    recomputes the others itself (a while loop's condition, `x = A[0]`); these would need snapshots."""
    nested = {k for b in loop.nodes() if not isinstance(b, dace.SDFGState)
              for e in b.all_interstate_edges(recursive=True) for k in e.data.assignments}
    assigned = {k for e in loop.edges() for k in e.data.assignments} | nested
    if not assigned:
        return []
    carried = set(nested)
    known: dict = {}
    for block in nx.topological_sort(loop.nx):
        ins = loop.in_edges(block)
        have = set.intersection(*[known[e.src] | set(e.data.assignments) for e in ins]) if ins else set()
        known[block] = have
        carried |= (_symbols_read(block) & assigned) - have
        for e in loop.out_edges(block):
            carried |= (set(map(str, e.data.read_symbols())) & assigned) - have
    return sorted(carried)


def unsupported(sdfg: dace.SDFG, loop: LoopRegion) -> str | None:
    """Why the body of `loop` cannot become a checkpointed step (None: it can)."""
    var = loop.loop_variable
    if var and counted_loop(loop, assigned_symbols(loop)) is None and _body_reads(loop, var):
        # an online step restores no loop variable (only a counted loop's is recomputed from its trip): a
        # body that reads it would read a stale value when a step is rerun
        update = loop.update_statement.as_string.strip() if loop.update_statement is not None else "?"
        return f"its body reads its variable '{var}', which does not advance by a counted step ({update})"
    carried = carried_symbols(loop)
    if carried:
        return f"its body carries symbols from one iteration to the next ({', '.join(carried)})"
    states = [b for b in loop.all_control_flow_blocks(recursive=True) if isinstance(b, dace.SDFGState)]
    indices = sorted({n.data for st in states for n in st.data_nodes()
                      if st.out_degree(n) and sdfg.arrays[n.data].dtype in (dace.int32, dace.int64)})
    if indices:  # a gather through an index array inside the step gave wrong gradients (not yet diagnosed)
        return f"its body reads the integer array(s) {', '.join(indices)} (indices are not supported in a step yet)"
    return None


def chosen_loops(sdfg: dace.SDFG, labels: tuple[str, ...] | None) -> list[LoopRegion]:
    """The loops a checkpoint policy names (`labels`; while loops included), or all outermost counted `for`
    loops (None)."""
    loops = [b for b in sdfg.all_control_flow_regions() if isinstance(b, LoopRegion)]
    if labels is None:
        return [loop for loop in loops if not _loops_around(loop)
                and counted_loop(loop, assigned_symbols(loop)) is not None and unsupported(sdfg, loop) is None]
    by_label = {loop.label: loop for loop in loops}
    missing = sorted(set(labels) - set(by_label))
    if missing:
        raise InvalidArgumentError(
            f"Forwarding.checkpoint(loops=...) names {', '.join(map(repr, missing))}, which is not a loop of the "
            f"program; its loops: {', '.join(sorted(by_label)) or '(none)'}",
            "name loops by their label (gradflow show prints them), or leave loops out for all outermost loops")
    chosen = [by_label[label] for label in labels]
    for loop in chosen:  # a while loop is checkpointed online (its trip count is known once it has run)
        outer = _loops_around(loop)
        if outer:
            raise NotDifferentiableError(
                f"loop '{loop.label}' is inside loop '{outer[0].label}': only loops outside every other loop "
                "can be checkpointed", f"checkpoint '{outer[-1].label}' instead")
        reason = unsupported(sdfg, loop)
        if reason is not None:
            raise NotDifferentiableError(f"loop '{loop.label}' cannot be checkpointed: {reason}",
                                         "checkpoint another loop, or store this one (leave it out of loops=)")
    return chosen


def budget_candidates(sdfg: dace.SDFG, bound_of) -> list[LoopRegion]:
    """The loops a byte budget may checkpoint: every outermost counted loop (`chosen_loops`), and every
    outermost while loop without a user bound (`bound_of(label)` is None), whose stacks no byte count
    covers: checkpointed online, it keeps its snapshots and trip record whatever its trip count."""
    unbounded = [b for b in sdfg.all_control_flow_regions() if isinstance(b, LoopRegion) and not _loops_around(b)
                 and counted_loop(b, assigned_symbols(b)) is None and bound_of(b.label) is None
                 and unsupported(sdfg, b) is None]
    return chosen_loops(sdfg, None) + unbounded


def outline(sdfg: dace.SDFG, labels: tuple[str, ...] | None) -> tuple[str, ...]:
    """Nest the body of each chosen loop into one nested SDFG labelled `gradflow_step_<loop>` (in place,
    on the engine's private copy). Returns the labels of the outlined loops."""
    from dace.sdfg.utils import set_nested_sdfg_parent_references
    from dace.transformation.helpers import nest_sdfg_subgraph

    done = []
    for loop in chosen_loops(sdfg, labels):
        blocks = list(loop.nodes())
        if not blocks:
            continue
        if len(blocks) == 1 and isinstance(blocks[0], dace.SDFGState):  # DaCe nests two blocks or more
            blocks.append(loop.add_state_after(blocks[0], f"{loop.label}_end"))
        for inner in loop.all_control_flow_regions():  # DaCe's nesting looks up every symbol's type
            if isinstance(inner, LoopRegion) and inner.loop_variable and inner.loop_variable not in sdfg.symbols:
                sdfg.add_symbol(inner.loop_variable, dace.int64)
        for edge in loop.all_interstate_edges():  # ... and of every symbol assigned inside
            for sym, dtype in edge.data.new_symbols(sdfg, sdfg.symbols).items():
                if sym not in sdfg.symbols:
                    sdfg.add_symbol(sym, dtype)
        with dace_set_connectors():
            state = nest_sdfg_subgraph(sdfg, SubgraphView(loop, blocks), start=loop.start_block)
        node = next(n for n in state.nodes() if isinstance(n, nd.NestedSDFG))
        set_nested_sdfg_parent_references(node.sdfg)  # DaCe leaves deeper nested SDFGs pointing outside
        node.label = f"{STEP}{loop.label}"
        node.sdfg.name = f"{STEP}{loop.label}"
        _drop_unread_exports(sdfg, state, node)
        inside = {k for e in node.sdfg.all_interstate_edges() for k in e.data.assignments}
        used = (set(map(str, node.sdfg.used_symbols(all_symbols=False))) | {
            str(sym) for desc in node.sdfg.arrays.values() for sym in desc.free_symbols}) - inside
        for sym in sorted(set(node.symbol_mapping) - used):  # DaCe maps every outer symbol
            del node.symbol_mapping[sym]
            if sym not in inside:  # (DaCe exports those the step assigns through `symbolic_output`)
                node.sdfg.symbols.pop(sym, None)
        for sym in sorted(used - set(node.symbol_mapping)):  # the loop variable, when the body reads it
            node.symbol_mapping[sym] = sym
            if sym not in node.sdfg.symbols:
                node.sdfg.add_symbol(sym, dace.int64)
        state.label = f"{STEP}{loop.label}"
        done.append(loop.label)
    sdfg.reset_cfg_list()
    return tuple(done)


def _drop_unread_exports(sdfg: dace.SDFG, state: dace.SDFGState, node: nd.NestedSDFG) -> None:
    """Remove the symbols DaCe's nesting exports from a step (`__sym_out_<s>`, set inside, assigned to `s`
    on the edge after the call) that nothing outside the step reads. An inner loop's variable is one: on a
    path that skips the inner loop its export reads the variable unassigned, which left it a free symbol
    of the forward ("cannot infer the value of symbol(s) i2")."""
    graph = state.parent_graph
    for edge in graph.out_edges(state):
        exports = {s: v for s, v in edge.data.assignments.items() if v in node.out_connectors}
        mapped = {}
        for sym in exports:  # taken out, so that the reads found are those of the rest of the program
            del edge.data.assignments[sym]
            mapped[sym] = node.symbol_mapping.pop(sym, None)
        read = symbols_read(sdfg)
        for sym, name in exports.items():
            if sym in read:
                edge.data.assignments[sym] = name
                if mapped[sym] is not None:
                    node.symbol_mapping[sym] = mapped[sym]
                continue
            for out in list(state.out_edges_by_connector(node, name)):
                state.remove_edge(out)
                if state.degree(out.dst) == 0:
                    state.remove_node(out.dst)
            node.remove_out_connector(name)
            sdfg.remove_data(name, validate=False)
            for inner in node.sdfg.states():
                for acc in [n for n in inner.data_nodes() if n.data == name]:
                    for setter in [e.src for e in inner.in_edges(acc)]:
                        inner.remove_node(setter)
                    inner.remove_node(acc)
            node.sdfg.remove_data(name, validate=False)
            if sym in sdfg.symbols and sym not in assigned_symbols(sdfg):  # declared for the nesting only
                sdfg.remove_symbol(sym)


def _step_node(item) -> nd.NestedSDFG | None:
    """The outlined step of a loop item: its body is the step's operation, then at most the assignments
    of the symbols the step exports (DaCe's nesting sets them after the call)."""
    items = item.body.items
    if not items or items[0].kind != "operation" or any(i.kind != "assignment" for i in items[1:]):
        return None
    members = item.body.items[0].site.members()
    steps = [n for n in members if isinstance(n, nd.NestedSDFG) and n.label.startswith(STEP)]
    return steps[0] if len(steps) == 1 else None


def is_outlined(item) -> bool:
    """Whether `item` (a region of the control-flow tree) is a loop `outline` made checkpointable."""
    return getattr(item, "kind", None) == "loop" and _step_node(item) is not None


def _snapshots(rev: ControlContext) -> int:
    """The snapshot count of the build's policy (a loop is checkpointed only under a policy that has one)."""
    count = rev.spec.forwarding.snapshots
    if count is None:
        raise AssertionError("a checkpointed loop under a policy without snapshots")
    return count


def stored_state(item, rev: ControlContext) -> tuple[str, ...]:
    """The arrays each snapshot of the outlined loop `item` holds (none when reversing a step reads no
    forward state besides arrays no step writes: see `backward_reads_state`)."""
    node = _step_node(item)
    state = item.body.items[0].site.state
    read_before = _read_before(item, rev)
    written = {e.data.data for e in state.out_edges(node) if not e.data.is_empty()}
    if read_before & written or backward_reads_state(node, state, rev):
        return _carried(node, state, read_before)
    return ()


def slot_bytes(item, rev: ControlContext, sizes: dict[str, int]) -> int:
    """The bytes of one snapshot slot of the outlined loop `item` (its `stored_state` arrays)."""
    from gradflow.analysis.cost import evaluate

    return sum(evaluate(rev.sdfg.arrays[a].total_size * rev.sdfg.arrays[a].dtype.bytes, sizes, f"the size of '{a}'")
               for a in stored_state(item, rev))


def online(item, rev: ControlContext) -> bool:
    """Whether the outlined loop `item` is checkpointed online: a while loop, or a counted loop whose trip
    count the program computes (a symbol it assigns, such as a count read from an array element), so that
    it is known only once the loop has run."""
    if item.counted is None:
        return True
    numerator, _ = item.counted.trip_count()
    return bool({str(s) for s in sympy.sympify(numerator).free_symbols} & rev.assigned)


def snapshot_bytes(item, rev: ControlContext, sizes: dict[str, int], snapshots: int) -> int:
    """An upper bound of the bytes the outlined loop `item` keeps with `snapshots` snapshots: a counted
    loop's slots and one for the state its last step starts from; a loop checkpointed online, its slots
    and its trip record (`OnlineSnapshots.info`)."""
    one = slot_bytes(item, rev, sizes)
    if online(item, rev):
        return one * snapshots + ONLINE_INFO * 8
    return one * (min(snapshots, max(trip_count(item, sizes), 1)) + 1)


@attrs.frozen
class Snapshots:
    """What the forward recorded for one checkpointed loop, and what its reversal interprets."""

    carried: tuple[str, ...]  # arrays stored per snapshot
    slots: dict  # carried array -> its snapshot array (one row per slot)
    backward: tuple  # the Revolve actions after the forward phase
    trips: int
    var: str
    first: str  # the loop variable's first value
    step: int
    current: int  # the slot holding the state the last step starts from


#: the trip record of a loop checkpointed online: trips, stride, stored slots, the loop variable's first value
ONLINE_INFO = 4


@attrs.frozen
class OnlineSnapshots:
    """What the forward of a loop checkpointed online recorded: its snapshots (at most `snapshots` slots,
    thinned as it ran: `revolve.thinned`) and `info` = (trips, stride, stored slots, first value of the loop
    variable), an int64[ONLINE_INFO] array; `var` and `step`: a counted loop's variable and step (None for a
    while loop)."""

    carried: tuple[str, ...]
    slots: dict
    snapshots: int
    info: str
    var: str | None = None
    step: int = 1


def trip_count(item, sizes: dict[str, int]) -> int:
    numerator, divisor = item.counted.trip_count()
    value = symbolic.pystr_to_symbolic(str(numerator)).subs({symbolic.symbol(k): v for k, v in sizes.items()})
    free = sorted(map(str, getattr(value, "free_symbols", ())))
    if free:
        raise InvalidArgumentError(
            f"checkpointed loop '{item.label}' runs a number of times that depends on {', '.join(free)}; the "
            "Revolve schedule is computed for a concrete trip count",
            "pass the sizes: gradflow.Forwarding.checkpoint(snapshots=..., sizes={"
            + ", ".join(f"{f!r}: ..." for f in free) + "})")
    return max(int(sympy.floor(value / divisor)), 0)


def _check_trips(item, trips: int, rev: ControlContext) -> None:
    """Before the loop, set `gradflow_overflow` when it is about to run other than the `trips` times its
    schedule was computed for (`grad`/`vjp` plan at `sizes=`, and the program may be called at others):
    the caller then refuses the run's gradients (`spec.check_loop_bounds`) instead of returning those of
    the wrong schedule. The count is floor(numerator / divisor) when positive, else 0; compared without a
    division, whose rounding of negatives C and Python do not share."""
    numerator, divisor = item.counted.trip_count()
    if not getattr(symbolic.pystr_to_symbolic(str(numerator)), "free_symbols", None):
        return  # a constant count: no call can run another
    n = symbolic.symstr(numerator)
    low, high = trips * divisor, (trips + 1) * divisor
    other = f"({n}) >= {divisor}" if trips == 0 else f"(({n}) < {low}) or (({n}) >= {high})"
    loop = item.loop
    region = loop.parent_graph
    check = flag_branch(rev.sdfg, f"planned_trips_{item.label}", other, rev.plan_trips(loop, trips))
    region.add_node(check, is_start_block=region.start_block is loop)
    for e in list(region.in_edges(loop)):
        region.remove_edge(e)
        region.add_edge(e.src, check, e.data)
    region.add_edge(check, loop, dace.InterstateEdge())


def _read_before(item, rev: ControlContext) -> frozenset[str]:
    """Arrays an operation before the loop reads (reversed after it: they need the loop's initial values)."""
    first = item.body.items[0].site.index
    return frozenset(a for site in rev.sites if site.index < first for a in site.read_arrays())


def _carried(node: nd.NestedSDFG, state, read_before: frozenset[str]) -> tuple[str, ...]:
    """Arrays the step writes whose value at the start of an iteration matters (module doc)."""
    outs = {e.data.data: e.src_conn for e in state.out_edges(node) if not e.data.is_empty()}
    carried = []
    for array, conn in sorted(outs.items()):
        reads_it = conn in node.in_connectors
        if array in read_before or (reads_it and not overwritten_before_read_in(node.sdfg, conn,
                                                                              _written_box(node.sdfg, conn))
                                    and exposed_read(node.sdfg, conn)):
            carried.append(array)
    return tuple(carried)


def _rewritten_whole(node: nd.NestedSDFG, edge, sdfg: dace.SDFG) -> bool:
    """Every run of the step writes every element of the array `edge` carries out of it before reading any
    (the edge covers the array, and inside the step its connector is overwritten before read): the
    backward's working copy then needs no copy of the forward's (which would make that array a value the
    forward hands the backward, such as `__sym_out_<var>`, a symbol DaCe exports from the step)."""
    return covers_array(sdfg, edge.data) and overwritten_before_read(node.sdfg, edge.src_conn)


def backward_reads_state(node: nd.NestedSDFG, state, rev: ControlContext) -> bool:
    """Whether the step's vjp (built as the nested rule builds it, storing everything) reads any forward
    value other than arrays the step only reads. When it does not (a linear stencil such as jacobi's),
    nothing needs to be stored and every step is reversed without rerunning any."""
    ins = {e.dst_conn: e for e in state.in_edges(node) if e.dst_conn and not e.data.is_empty()}
    outs = {e.src_conn for e in state.out_edges(node) if e.src_conn and not e.data.is_empty()}
    shared = sorted(set(ins) & outs)
    where = f"checkpointed step '{node.label}'"
    wrt = tuple(IN + c if c in shared else c for c in sorted(ins) if is_float(node.sdfg.arrays[c]))
    of = tuple(c for c in sorted(outs) if is_float(node.sdfg.arrays[c]))
    policy = STORE_ALL.with_loop_bounds(**dict(rev.spec.forwarding.loop_bounds))
    inner, interface = nested_vjp(node, {c: inner_region(node, ins[c].data, where) for c in shared}, wrt, of,
                                  policy, rev.differentiate)
    region = interface.backward_region(inner)
    forward = [b for b in inner.nodes() if b is not region]
    grads = set(interface.buffers.values()) | set(interface.cotangents.values())
    read = (arrays_used([region]) & arrays_used(forward)) - grads
    return bool(read - {c for c in ins if c not in outs})


def _written_box(sdfg: dace.SDFG, name: str):
    """The bounding box of what `sdfg` writes to `name` (the whole array when it cannot tell)."""
    from dace import subsets

    box = None
    for state in sdfg.states():
        for n in state.data_nodes():
            if n.data != name:
                continue
            for e in state.in_edges(n):
                sub = e.data.get_dst_subset(e, state) if not e.data.is_empty() else None
                if sub is None:
                    return subsets.Range.from_array(sdfg.arrays[name])
                box = sub if box is None else union(box, sub)
    return box if isinstance(box, subsets.Range) else subsets.Range.from_array(sdfg.arrays[name])


def _copy_slot(state, array: str, snap: str, slot: str, to_snapshot: bool) -> None:
    """snap[slot, ...] <-> array[...] as one copy edge."""
    desc = state.sdfg.arrays[array]
    whole = ", ".join(f"0:{symbolic.symstr(s)}" for s in desc.shape)
    slot_memlet = dace.Memlet(f"{snap}[{slot}, {whole}]")
    if to_snapshot:
        state.add_nedge(state.add_read(array), state.add_write(snap),
                        dace.Memlet(data=array, subset=whole, other_subset=slot_memlet.subset))
    else:
        state.add_nedge(state.add_read(snap), state.add_write(array),
                        dace.Memlet(data=snap, subset=slot_memlet.subset, other_subset=whole))


def _constant_table(sdfg: dace.SDFG, stem: str, values: list[int]) -> str:
    name, desc = sdfg.add_array(stem, (max(len(values), 1),), dace.int64, transient=True, find_new_name=True)
    sdfg.add_constant(name, np.array(values or [0], dtype=np.int64), desc)
    return name


@control_rule("loop", priority=20, applies=is_outlined)
class CheckpointedLoop:
    """A counted loop whose body was outlined into a step (`outline`): Revolve checkpointing."""

    tape_free = True  # the engine records nothing for the operations inside

    def restores(self, item) -> frozenset[str]:
        return frozenset({item.counted.var}) if item.counted is not None else frozenset()

    def tape_bytes(self, item, rev: ControlContext, loops: tuple):
        return 0  # the snapshots are priced by the checkpoint policy itself, not by the budget planner

    def record(self, item, rev: ControlContext, loops: tuple) -> Snapshots | OnlineSnapshots:
        if loops:  # `chosen_loops` outlines only outermost loops
            raise NotDifferentiableError(f"loop '{item.label}' is inside another loop: it cannot be checkpointed",
                                         "leave it out of Forwarding.checkpoint(loops=...)")
        if online(item, rev):
            return self._record_online(item, rev)
        policy = rev.spec.forwarding
        c = item.counted
        trips = trip_count(item, dict(policy.sizes))
        if not policy.planned_at_call:
            _check_trips(item, trips, rev)
        if trips == 0:  # the loop does not run: nothing to record or reverse
            return Snapshots((), {}, (), 0, c.var, symbolic.symstr(c.start), c.step, 0)
        carried = stored_state(item, rev)
        if carried:
            ahead, backward = revolve.forward_phase(revolve.schedule(trips, _snapshots(rev)))
        else:  # nothing to store: reverse the steps last to first, rerunning none
            ahead = ()
            backward = tuple(revolve.Action(revolve.REVERSE, 0, p) for p in reversed(range(trips)))
        first = symbolic.symstr(c.start)
        shots = [(a.position, a.arg) for a in ahead if a.kind == revolve.TAKESHOT]
        # The state the last step starts from: the schedule's own snapshot there when it takes one (then
        # never restored), else one more slot.
        current = next((slot for position, slot in shots if position == trips - 1), None)
        if current is None:
            current = 1 + max([a.arg for a in backward if a.kind == revolve.TAKESHOT]
                              + [slot for _, slot in shots], default=-1)
            shots.append((trips - 1, current))
        count = 1 + max([slot for _, slot in shots] + [a.arg for a in backward if a.kind == revolve.TAKESHOT])
        slots = {}
        for array in carried:
            desc = rev.sdfg.arrays[array]
            slots[array], _ = rev.sdfg.add_array(f"gradflow_snap_{array}", (count,) + tuple(desc.shape),
                                                 desc.dtype, transient=True, find_new_name=True)
            rev.note_store(slots[array], f"<snapshots of {array}>")
        if carried:
            loop = item.loop
            block = ConditionalBlock(f"snapshot_{item.label}", sdfg=rev.sdfg)
            old_start = loop.start_block
            loop.add_node(block, is_start_block=True)
            loop.add_edge(block, old_start, dace.InterstateEdge())
            for position, slot in shots:
                branch = ControlFlowRegion(f"snapshot_{item.label}_{slot}", sdfg=rev.sdfg)
                block.add_branch(f"{c.var} == ({first}) + ({c.step}) * ({position})", branch)
                take = branch.add_state(f"take_{item.label}_{slot}", is_start_block=True)
                for array in carried:
                    _copy_slot(take, array, slots[array], str(slot), to_snapshot=True)
        return Snapshots(carried, slots, backward, trips, c.var, first, c.step, current)

    def _record_online(self, item, rev: ControlContext) -> OnlineSnapshots:
        """Instrument the forward of a loop whose trip count is known once it has run: a trip counter, and
        snapshots at the multiples of a stride that doubles whenever the slots are full (`revolve.thinned`,
        the same steps in Python). A counted loop also records its variable's first value (its start may be
        a symbol the program assigns again later)."""
        sdfg, loop, label = rev.sdfg, item.loop, item.label
        s = _snapshots(rev)
        carried = stored_state(item, rev)
        info, _ = sdfg.add_array(f"gradflow_online_{label}", (ONLINE_INFO,), dace.int64, transient=True,
                                 find_new_name=True)
        rev.note_store(info, f"<trip count of {label}>")
        slots = {}
        for array in carried:
            desc = sdfg.arrays[array]
            slots[array], _ = sdfg.add_array(f"gradflow_snap_{array}", (s,) + tuple(desc.shape), desc.dtype,
                                             transient=True, find_new_name=True)
            rev.note_store(slots[array], f"<snapshots of {array}>")
        n, stride, k, at = rev.fresh("gf_on"), rev.fresh("gf_od"), rev.fresh("gf_ok"), rev.fresh("gf_om")
        parent = loop.parent_graph
        parent.add_state_before(loop, f"online_init_{label}", is_start_block=parent.start_block is loop,
                                assignments={n: "0", stride: "1", k: "0", at: "0"})
        done = parent.add_state_after(loop, f"online_done_{label}")
        conns = ("__gf_trips", "__gf_stride", "__gf_stored", "__gf_first")
        counted = item.counted
        first = symbolic.symstr(counted.start) if counted is not None else "0"
        tasklet = done.add_tasklet(f"online_trips_{label}", {}, dict.fromkeys(conns),
                                   "\n".join(f"{conn} = {v}" for conn, v in zip(conns, (n, stride, k, first))))
        out = done.add_write(info)
        for slot, conn in enumerate(conns):
            done.add_edge(tasklet, conn, out, None, dace.Memlet(f"{info}[{slot}]"))

        last = [b for b in loop.nodes() if loop.out_degree(b) == 0]
        loop.add_state_after(last[0], f"online_count_{label}", assignments={n: f"{n} + 1"})
        var, step = (counted.var, counted.step) if counted is not None else (None, 1)
        if not carried:
            return OnlineSnapshots(carried, slots, s, info, var, step)
        old_start = loop.start_block
        keep = (s + 1) // 2
        thin = ConditionalBlock(f"online_thin_{label}", sdfg=sdfg)
        branch = ControlFlowRegion(f"online_thin_{label}_body", sdfg=sdfg)
        thin.add_branch(f"({n} == {at}) and ({k} == {s})", branch)
        first = branch.add_state(f"online_thin_{label}_start", is_start_block=True)
        if keep > 1:  # slot j <- slot 2j
            j = rev.fresh("gf_oj")
            moves = LoopRegion(f"online_keep_{label}", f"{j} < {keep}", j, f"{j} = 1", f"{j} = {j} + 1", sdfg=sdfg)
            branch.add_node(moves)
            branch.add_edge(first, moves, dace.InterstateEdge())
            move = moves.add_state(f"online_move_{label}", is_start_block=True)
            for array in carried:
                desc = sdfg.arrays[array]
                whole = ", ".join(f"0:{symbolic.symstr(x)}" for x in desc.shape)
                move.add_nedge(move.add_read(slots[array]), move.add_write(slots[array]),
                               dace.Memlet(data=slots[array], subset=f"2 * {j}, {whole}", other_subset=f"{j}, {whole}"))
            first = moves
        doubled = branch.add_state_after(first, f"online_double_{label}", assignments={stride: f"2 * {stride}"})
        branch.add_state_after(doubled, f"online_rebased_{label}", assignments={k: str(keep), at: f"{keep} * {stride}"})

        store = ConditionalBlock(f"online_store_{label}", sdfg=sdfg)
        take = ControlFlowRegion(f"online_store_{label}_body", sdfg=sdfg)
        store.add_branch(f"{n} == {at}", take)
        copies = take.add_state(f"online_take_{label}", is_start_block=True)
        for array in carried:
            _copy_slot(copies, array, slots[array], k, to_snapshot=True)
        take.add_state_after(copies, f"online_taken_{label}", assignments={k: f"{k} + 1", at: f"{at} + {stride}"})

        loop.add_node(thin, is_start_block=True)
        loop.add_node(store)
        loop.add_edge(thin, store, dace.InterstateEdge())
        loop.add_edge(store, old_start, dace.InterstateEdge())
        return OnlineSnapshots(carried, slots, s, info, var, step)

    def reverse(self, item, recorded, rev: ControlContext, ctx: ReverseContext, body) -> None:
        is_online = isinstance(recorded, OnlineSnapshots)
        if not is_online and not recorded.trips:
            return
        sdfg = ctx.sdfg
        node = _step_node(item)
        fwd_state = item.body.items[0].site.state
        outs = {e.data.data: e for e in fwd_state.out_edges(node) if not e.data.is_empty()}
        written = sorted(outs)
        present = ({revolve.ADVANCE, revolve.TAKESHOT, revolve.RESTORE, revolve.REVERSE} if recorded.carried
                   else {revolve.REVERSE}) if is_online else {a.kind for a in recorded.backward}
        # Working copies the reruns may write: never the forward's own arrays. (Without reruns or snapshots
        # the steps' vjps only read arrays no step writes: nothing to set up.)
        setup = ctx.new_state(f"checkpoint_setup_{item.label}")
        for array in written if recorded.carried or revolve.ADVANCE in present else ():
            if ctx.values.get(array, array) == array:
                desc = sdfg.arrays[array]
                work, _ = sdfg.add_array(f"gradflow_work_{array}", desc.shape, desc.dtype, transient=True,
                                         find_new_name=True)
                if array not in recorded.carried and not _rewritten_whole(node, outs[array], sdfg):
                    copy_array(setup, array, work)  # not stored: its unwritten elements are the loop's input
                ctx.values[array] = work
        kind, arg, at = rev.fresh("gf_ck"), rev.fresh("gf_cg"), rev.fresh("gf_cp")
        if is_online:
            first = rev.fresh("gf_cf")
            interpreter = self._online_interpreter(item, recorded, rev, ctx, setup, kind, arg, at, first)
            var, step = recorded.var, recorded.step
            here = f"{first} + ({step}) * {at}" if var is not None else None
        else:
            for array in recorded.carried:  # the state the last step starts from
                _copy_slot(setup, ctx.values[array], recorded.slots[array], str(recorded.current), to_snapshot=False)
            actions = recorded.backward
            kinds = _constant_table(sdfg, f"gradflow_actions_{item.label}", [a.kind for a in actions])
            args = _constant_table(sdfg, f"gradflow_args_{item.label}", [a.arg for a in actions])
            positions = _constant_table(sdfg, f"gradflow_positions_{item.label}", [a.position for a in actions])
            k = rev.fresh("gf_ca")
            var, first, step = recorded.var, f"({recorded.first})", recorded.step
            here = f"{first} + ({step}) * {at}"
            interpreter = LoopRegion(f"checkpoint_{item.label}", f"{k} < {len(actions)}", k, f"{k} = 0",
                                     f"{k} = {k} + 1", sdfg=sdfg)
            ctx.add_block(interpreter)
            with ctx.inside(interpreter):
                ctx.new_state(f"action_{item.label}", {kind: f"{kinds}[{k}]", arg: f"{args}[{k}]",
                                                        at: f"{positions}[{k}]"})
        with ctx.inside(interpreter):
            branches = ConditionalBlock(f"dispatch_{item.label}", sdfg=sdfg)
            ctx.add_block(branches)

            if revolve.ADVANCE in present:
                advance = ControlFlowRegion(f"advance_{item.label}", sdfg=sdfg)
                branches.add_branch(f"{kind} == {revolve.ADVANCE}", advance)
                j = rev.fresh("gf_cj")
                steps = LoopRegion(f"advance_steps_{item.label}", f"{j} < {arg}", j, f"{j} = 0", f"{j} = {j} + 1",
                                   sdfg=sdfg)
                advance.add_node(steps, is_start_block=True)
                run = steps.add_state(f"step_{item.label}", is_start_block=True)
                if var is not None:
                    steps.add_state_before(run, f"step_at_{item.label}", is_start_block=True,
                                           assignments={var: f"{first} + ({step}) * ({at} + {j})"})
                self._emit_step(run, node, fwd_state, ctx)
            for which, to_snapshot in ((revolve.TAKESHOT, True), (revolve.RESTORE, False)):
                if which not in present:
                    continue
                region = ControlFlowRegion(f"{revolve.KIND_NAMES[which]}_{item.label}", sdfg=sdfg)
                branches.add_branch(f"{kind} == {which}", region)
                copies = region.add_state(f"{revolve.KIND_NAMES[which]}_{item.label}", is_start_block=True)
                for array in recorded.carried:
                    _copy_slot(copies, ctx.values[array], recorded.slots[array], arg, to_snapshot)

            back = ControlFlowRegion(f"reverse_step_{item.label}", sdfg=sdfg)
            branches.add_branch(f"{kind} == {revolve.REVERSE}", back)
            with ctx.inside(back):
                ctx.new_state(f"reverse_at_{item.label}", {var: here} if var is not None and here is not None else None)
                body(item.body)

    @staticmethod
    def _online_interpreter(item, recorded: OnlineSnapshots, rev: ControlContext, ctx: ReverseContext, setup,
                            kind: str, arg: str, at: str, first: str) -> LoopRegion:
        """The loop that asks the run-time schedule generator (`revolve.NEXT_ACTION_CPP`) for one action per
        iteration, from what the forward recorded, until it says DONE; the caller fills in the dispatch.
        `first` is set to the loop variable's first value the forward recorded."""
        sdfg = ctx.sdfg
        words = revolve.generator_words(recorded.snapshots)
        gen, _ = sdfg.add_array(f"gradflow_revolve_{item.label}", (words,), dace.int64, transient=True,
                                find_new_name=True)
        act, _ = sdfg.add_array(f"gradflow_action_{item.label}", (3,), dace.int64, transient=True,
                                find_new_name=True)
        start = setup.add_tasklet(f"revolve_init_{item.label}", {revolve.INFO: None}, {revolve.STATE: None},
                                  revolve.init_code(recorded.snapshots, linear=not recorded.carried),
                                  language=dace.Language.CPP)
        setup.add_edge(setup.add_read(recorded.info), None, start, revolve.INFO, dace.Memlet(f"{recorded.info}[0:3]"))
        setup.add_edge(start, revolve.STATE, setup.add_write(gen), None, dace.Memlet(f"{gen}[0:{words}]"))
        interpreter = LoopRegion(f"checkpoint_{item.label}", f"{kind} != {revolve.DONE}", sdfg=sdfg)
        ctx.add_block(interpreter, {kind: "0", first: f"{recorded.info}[3]"})
        with ctx.inside(interpreter):
            ask = ctx.new_state(f"next_action_{item.label}")
            next_ = ask.add_tasklet(f"revolve_next_{item.label}", {revolve.STATE_IN: None},
                                    dict.fromkeys((revolve.STATE, revolve.ACTION)),
                                    revolve.next_action_code(), language=dace.Language.CPP)
            ask.add_edge(ask.add_read(gen), None, next_, revolve.STATE_IN, dace.Memlet(f"{gen}[0:{words}]"))
            ask.add_edge(next_, revolve.STATE, ask.add_write(gen), None, dace.Memlet(f"{gen}[0:{words}]"))
            ask.add_edge(next_, revolve.ACTION, ask.add_write(act), None, dace.Memlet(f"{act}[0:3]"))
            ctx.new_state(f"action_{item.label}", {kind: f"{act}[0]", arg: f"{act}[1]", at: f"{act}[2]"})
        return interpreter

    @staticmethod
    def _emit_step(state, node: nd.NestedSDFG, fwd_state, ctx: ReverseContext) -> None:
        """One forward step on the working copies (a copy of the outlined body)."""
        import copy

        ins = {e.dst_conn: e for e in fwd_state.in_edges(node) if e.dst_conn and not e.data.is_empty()}
        outs = {e.src_conn: e for e in fwd_state.out_edges(node) if e.src_conn and not e.data.is_empty()}
        call = state.add_nested_sdfg(copy.deepcopy(node.sdfg), dict.fromkeys(sorted(ins)),
                                     dict.fromkeys(sorted(outs)), dict(node.symbol_mapping),
                                     name=f"rerun_{node.label}")
        reads, writes = {}, {}
        for conn, e in sorted(ins.items()):
            array = ctx.values.get(e.data.data, e.data.data)
            if array not in reads:
                reads[array] = state.add_read(array)
            state.add_edge(reads[array], None, call, conn, dace.Memlet(data=array, subset=copy.deepcopy(e.data.subset)))
        for conn, e in sorted(outs.items()):
            array = ctx.values.get(e.data.data, e.data.data)
            if array not in writes:
                writes[array] = state.add_write(array)
            state.add_edge(call, conn, writes[array], None,
                           dace.Memlet(data=array, subset=copy.deepcopy(e.data.subset)))
