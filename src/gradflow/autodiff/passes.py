"""The reverse-mode passes and the default AD pipeline.

`Reverse` turns a normalized forward graph into forward + backward in one SDFG and attaches the
`ADInterface` as `meta["ad"]`. `SplitVJP` cuts such a graph into the forward and backward SDFGs of a
`VJPResult` (attached as `meta["vjp"]`). Both are pure: they edit private copies.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from returns.result import Failure, Success

from gradflow.analysis.activity import is_float
from gradflow.analysis.usage import arrays_used
from gradflow.analysis.writes import written
from gradflow.autodiff import budget
from gradflow.autodiff.forwarding import STORE_ALL, Forwarding
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.normalize import NORMALIZE, normalize_pipeline  # noqa: F401 - NORMALIZE re-exported
from gradflow.autodiff.protocols import CONTROL, LIBRARY, REVERSE
from gradflow.autodiff.rules import (
    default_control_rules,
    default_library_rules,
    default_reverse_rules,
)
from gradflow.autodiff.spec import END_LABEL, OVERFLOW, ADInterface, ADSpec, ADTables, inherited_limits
from gradflow.autodiff.subprograms import reverse_program
from gradflow.core.errors import InvalidArgumentError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, Pipeline, register_pass, table_field
from gradflow.core.rule_table import RuleTable
from gradflow.core.validation import check_graph


def infer_of(sdfg: dace.SDFG) -> str:
    """The unique non-transient one-element array the program writes."""
    candidates = sorted(
        name
        for name in written(sdfg)
        if not sdfg.arrays[name].transient and is_float(sdfg.arrays[name]) and sdfg.arrays[name].total_size == 1
    )
    if len(candidates) != 1:
        raise InvalidArgumentError(
            f"cannot infer `of`: the program writes {len(candidates)} one-element float arrays "
            f"({', '.join(candidates) or 'none'})",
            "pass of='<name>' explicitly",
        )
    return candidates[0]


def default_wrt(sdfg: dace.SDFG, of: tuple[str, ...]) -> tuple[str, ...]:
    """All non-transient float arrays except `of`."""
    return tuple(
        sorted(n for n, d in sdfg.arrays.items() if not d.transient and is_float(d) and n not in of)
    )


def optional_names(value) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def _mode(value: str) -> str:
    if value not in ("grad", "vjp"):
        raise InvalidArgumentError(f"reverse mode must be 'grad' or 'vjp', got {value!r}")
    return value


@register_pass
@attrs.frozen
class Reverse(Pass):
    """Append the backward pass. `wrt`/`of` default to all float arguments / the single scalar output.

    Its rule tables are fields (`reverse_rules`, `library_rules`, `control_rules`; defaults: the built-in
    tables), so equal passes give equal graphs; `Pipeline.with_rules` swaps them."""

    wrt: tuple[str, ...] | None = attrs.field(default=None, converter=optional_names)
    of: tuple[str, ...] | None = attrs.field(default=None, converter=optional_names)
    mode: str = attrs.field(default="grad", converter=_mode)
    prefix: str = "grad_"
    forwarding: Forwarding = STORE_ALL
    reverse_rules: RuleTable = table_field(REVERSE, default_reverse_rules)
    library_rules: RuleTable = table_field(LIBRARY, default_library_rules)
    control_rules: RuleTable = table_field(CONTROL, default_control_rules)
    name: ClassVar[str] = "reverse"
    requires: ClassVar[tuple[str, ...]] = ("split_operations",)

    @property
    def tables(self) -> ADTables:
        return ADTables(self.reverse_rules, self.library_rules, self.control_rules)

    def run(self, graph: Graph) -> PassResult:
        sdfg = graph.editable()
        of = self.of if self.of is not None else (infer_of(sdfg),)
        wrt = self.wrt if self.wrt is not None else default_wrt(sdfg, of)
        # a gradient program differentiated again keeps its own flag numbers: this build's come after them
        spec = ADSpec(tuple(wrt), tuple(of), self.mode, self.prefix, self.forwarding,
                      overflow_base=inherited_limits(sdfg))
        interface = reverse_program(sdfg, spec, self.tables)  # no source-line info: see `Pass.__call__`
        pushed = tuple(sorted((stack, sdfg.arrays[stack].total_size) for stack, array in interface.stores.items()
                              if not array.startswith("<")))  # "<trip count>" etc.: the control flow's stacks
        assert interface.forwarding_plan is not None  # `build_reverse` always gives the plan it followed
        plan = attrs.evolve(interface.forwarding_plan, kept=tuple(sorted(kept_bytes(sdfg, interface).items())),
                            pushed=pushed)
        interface = attrs.evolve(interface, forwarding_plan=plan)
        if spec.outermost:  # a budget is a promise: a plan over it is never returned
            budget.check_within(plan, spec.forwarding, interface.heaps)
        error = check_graph(sdfg, self.name, thorough=True)
        if error is not None:
            return Failure(error)
        return Success(Graph.adopt(sdfg, {**graph.meta, "ad": interface}))


def _scalar_to_array(sdfg: dace.SDFG, name: str) -> None:
    """A forwarded transient scalar becomes a one-element array: scalars are passed by value, so the
    forward could not hand it out. Control flow that reads it by name (an interstate assignment or
    condition, a loop or branch condition) then reads its element."""
    from dace.sdfg.state import ConditionalBlock, LoopRegion

    desc = sdfg.arrays[name]
    if not isinstance(desc, dace.data.Scalar):
        return
    sdfg.arrays[name] = dace.data.Array(desc.dtype, [1], transient=desc.transient)
    element = {name: f"{name}[0]"}
    for region in sdfg.all_control_flow_regions():
        for edge in region.edges():
            if name in edge.data.free_symbols:
                edge.data.replace_dict(element)
        if isinstance(region, (LoopRegion, ConditionalBlock)):  # their own conditions, not their blocks
            region.replace_dict(element, replace_in_graph=False, replace_keys=False)


def forwarded_arrays(sdfg: dace.SDFG, interface: ADInterface) -> tuple[str, ...]:
    """Arrays the backward sweep reads from the forward sweep: arguments it reads, and the forward's
    transients (temporaries, the tape) it reads; backward-local ones (working copies, recomputed values,
    gradient buffers) are not forwarded."""
    region = interface.backward_region(sdfg)
    gradient_arrays = set(interface.buffers.values()) | set(interface.cotangents.values())
    used_backward = arrays_used([region]) & set(sdfg.arrays)
    used_forward = arrays_used([b for b in sdfg.nodes() if b is not region]) & set(sdfg.arrays)
    arguments = {a for a, d in sdfg.arrays.items() if not d.transient}
    # Constant arrays (`sdfg.add_constant`: ONNX constants, NumPy globals) stay constants of both SDFGs;
    # made arguments, they would lose their values.
    constants = set(sdfg.constants_prop)
    return tuple(sorted(a for a in used_backward - gradient_arrays - constants if a in used_forward or a in arguments))


def kept_bytes(sdfg: dace.SDFG, interface: ADInterface) -> dict[str, object]:
    """What the forward keeps for the backward beyond the program's arguments: transient -> bytes."""
    return {a: sdfg.arrays[a].total_size * sdfg.arrays[a].dtype.bytes for a in forwarded_arrays(sdfg, interface)
            if sdfg.arrays[a].transient}


def split_vjp(sdfg: dace.SDFG, interface: ADInterface) -> VJPResult:
    """Forward and backward SDFGs from a combined one (both built from private copies).

    The tape crosses from the forward to the backward SDFG as arrays. When it has growable stacks, whose
    size only the run tells, it cannot: the backward SDFG then reruns the instrumented forward sweep itself,
    from copies of the initial values of the arrays the forward writes (`_split_rerunning`)."""
    import copy

    if interface.heaps:
        return _split_rerunning(sdfg, interface)
    region = interface.backward_region(sdfg)
    gradient_arrays = set(interface.buffers.values()) | set(interface.cotangents.values())
    used_backward = arrays_used([region]) & set(sdfg.arrays)
    forwarded = forwarded_arrays(sdfg, interface)

    fwd = _forward_sweep(sdfg, interface, gradient_arrays)
    for name in forwarded:
        fwd.arrays[name].transient = False
    saved = tuple(a for a in forwarded if sdfg.arrays[a].transient)
    for a in saved:
        _scalar_to_array(fwd, a)

    bwd = copy.deepcopy(sdfg)
    bregion = interface.backward_region(bwd)
    for block in list(bwd.nodes()):
        if block is not bregion and block.label != END_LABEL:
            bwd.remove_node(block)
    bwd.start_block = bwd.node_id(bregion)
    # DaCe's dominator analysis (allocation placement) mistakes a plain region as an SDFG's start block for
    # its own dominator: the backward SDFG starts with an empty state instead.
    bwd.add_state_before(bregion, "gradflow_begin", is_start_block=True)
    keep_outputs = set(interface.grads.values()) | set(interface.cotangents.values())
    for name in list(bwd.arrays):
        if name not in used_backward and name not in keep_outputs:
            bwd.remove_data(name, validate=False)
        elif name in forwarded or name in keep_outputs:
            bwd.arrays[name].transient = False
    for a in saved:
        _scalar_to_array(bwd, a)
    return _result(sdfg, interface, fwd, bwd, forwarded, {a: a for a in saved})


def _split_rerunning(sdfg: dace.SDFG, interface: ADInterface) -> VJPResult:
    """The split for a tape with growable stacks. The forward SDFG is the instrumented forward sweep (its
    heap buffers freed at its end) that also copies the initial value of every argument it writes into
    `gradflow_init_<name>` (extra outputs, the only values it saves). The backward SDFG is the whole
    combined SDFG started from those copies: it reruns the forward sweep, so the tape lives within its call;
    the arguments it reads unchanged are forwarded as they are. Costs one more forward sweep per backward."""
    import copy

    from gradflow.autodiff.emit import copy_array
    from gradflow.autodiff.tape import release

    region = interface.backward_region(sdfg)
    gradient_arrays = set(interface.buffers.values()) | set(interface.cotangents.values())
    forward_blocks = [b for b in sdfg.nodes() if b is not region and b.label != END_LABEL]
    written = sorted(a for a in _written_in(forward_blocks)
                     if not sdfg.arrays[a].transient and a not in gradient_arrays and a != OVERFLOW
                     and not isinstance(sdfg.arrays[a], dace.data.Scalar))
    initial = {a: _free_name(sdfg, f"gradflow_init_{a}") for a in written}

    fwd = _forward_sweep(sdfg, interface, gradient_arrays)
    last = [b for b in fwd.nodes() if fwd.out_degree(b) == 0][0]
    release(fwd.add_state_after(last, "gradflow_release"), interface.heaps)
    bwd = copy.deepcopy(sdfg)
    for graph in (fwd, bwd):
        start = graph.add_state_before(graph.start_block, "gradflow_initial_values", is_start_block=True)
        for array, copy_name in initial.items():
            desc = copy.deepcopy(sdfg.arrays[array])
            desc.transient = False
            graph.add_datadesc(copy_name, desc)
            if graph is fwd:
                copy_array(start, array, copy_name)
            else:
                copy_array(start, copy_name, array)
                graph.arrays[array].transient = True
    if OVERFLOW in bwd.arrays:  # the forward run reported it already
        bwd.arrays[OVERFLOW].transient = True
    forwarded = tuple(sorted(a for a, d in bwd.arrays.items()
                             if not d.transient and a not in gradient_arrays and a not in interface.grads.values()))
    return _result(sdfg, interface, fwd, bwd, forwarded, {initial[a]: a for a in written})


def _forward_sweep(sdfg: dace.SDFG, interface: ADInterface, gradient_arrays: set[str]) -> dace.SDFG:
    """A copy of the combined SDFG without its backward sweep and the gradient arrays it alone uses."""
    import copy

    fwd = copy.deepcopy(sdfg)
    for block in [b for b in fwd.nodes() if b.label in (interface.backward_label, END_LABEL)]:
        fwd.remove_node(block)
    for name in [n for n in fwd.arrays if n in gradient_arrays]:
        fwd.remove_data(name, validate=False)
    return fwd


def _result(sdfg: dace.SDFG, interface: ADInterface, fwd: dace.SDFG, bwd: dace.SDFG, forwarded: tuple[str, ...],
            saved: dict[str, str]) -> VJPResult:
    """The `VJPResult` of a split: `saved` maps each saved array to the array of `sdfg` whose size it has."""
    fwd.name = f"{sdfg.name}_forward"
    bwd.name = f"{sdfg.name}_backward"
    fwd.reset_cfg_list()
    bwd.reset_cfg_list()
    saved_sizes = {a: sdfg.arrays[b].total_size * sdfg.arrays[b].dtype.bytes for a, b in saved.items()}
    nbytes = sum(int(v) for v in saved_sizes.values() if not getattr(v, "free_symbols", None))
    return VJPResult(forward=fwd, backward=bwd, wrt=interface.spec.wrt, of=interface.spec.of,
                     grads=dict(interface.grads), cotangents=dict(interface.cotangents), forwarded=forwarded,
                     saved=tuple(saved), forwarded_bytes=nbytes, saved_sizes=saved_sizes,
                     forwarding_plan=interface.forwarding_plan, bounded_loops=interface.bounded_loops)


def _written_in(blocks) -> set[str]:
    """Arrays written by the states of `blocks` (and the nested SDFGs in them, through their connectors)."""
    names = set()
    for block in blocks:
        states = [block] if isinstance(block, dace.SDFGState) else [
            b for b in block.all_control_flow_blocks() if isinstance(b, dace.SDFGState)]
        for state in states:
            names |= {n.data for n in state.data_nodes() if state.in_degree(n) > 0}
    return names


def _free_name(sdfg: dace.SDFG, name: str) -> str:
    while name in sdfg.arrays:
        name += "_"
    return name


def forwarded_bytes(graph: Graph, symbols: dict[str, int] | None = None) -> int:
    """Bytes a differentiated graph's forward sweep keeps for its backward sweep beyond the program's own
    arguments (transients it reads and the tape), with symbolic sizes evaluated at `symbols`."""
    interface = graph.meta.get("ad")
    if interface is None:
        raise InvalidArgumentError("the graph is not differentiated (no `reverse` pass ran on it)")
    return split_vjp(graph.sdfg, interface).saved_bytes(symbols)


@register_pass
@attrs.frozen
class SplitVJP(Pass):
    """Attach `meta["vjp"]`: the forward/backward pair of a graph that `Reverse` produced in vjp mode."""

    name: ClassVar[str] = "split_vjp"
    requires: ClassVar[tuple[str, ...]] = ("reverse",)

    def run(self, graph: Graph) -> PassResult:
        interface = graph.meta.get("ad")
        if interface is None:
            return Success(graph)  # nothing to split: not differentiated
        return Success(graph.with_meta(vjp=split_vjp(graph.sdfg, interface)))


def ad_pipeline(reverse: Reverse | None = None) -> Pipeline:
    """The default AD pipeline: `set_aside_internal_names` (a program gradflow made, differentiated again,
    keeps its tape's names apart from the new one's), in grad mode `count_arguments_to_symbols` (trip counts
    given as arguments become symbols: priced by budgets, sizing fixed stacks; for a whole program only, so not in
    `NORMALIZE`, which nested SDFGs share; not in vjp mode, whose forward and backward SDFGs keep the
    program's arguments for the torch dispatchers, which pass symbols only as extents), `NORMALIZE` (with
    `reverse`'s library table), then `reverse`."""
    from gradflow.transforms.count_arguments import CountArgumentsToSymbols
    from gradflow.transforms.internal_names import SetAsideInternalNames

    reverse = reverse if reverse is not None else Reverse()
    normalize = normalize_pipeline(reverse.library_rules, reverse.forwarding.checkpoint_loops or ())
    first = (SetAsideInternalNames(),) + ((CountArgumentsToSymbols(),) if reverse.mode == "grad" else ())
    return Pipeline(first + normalize.steps, normalize.hook, normalize.assumes) + reverse
