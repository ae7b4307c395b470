"""The reverse-mode engine: from a normalized forward SDFG to forward + backward in one SDFG.

Input: a private SDFG whose top level is a chain of states holding one operation each (see
`normalize.py`). Output (in place on that private copy, which the calling pass then freezes):
1. stores: before operation k, a copy of each array whose value k's reverse reads but that k or a later
   operation overwrites (one copy per array version, shared by all operations that read that version);
2. a `ControlFlowRegion` named `gradflow_backward` after the last forward state that zeroes the gradient
   buffers, seeds the gradient of `of`, and then runs the reverse of every operation, last to first, as
   chosen from the reverse-rule table.
The interface (gradient names, forwarded values) is returned as frozen facts for the pass to attach.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import dace
from dace.sdfg.state import ControlFlowRegion, SDFGState

from gradflow.analysis.activity import OpAccess, activity, is_float
from gradflow.analysis.ops import decompose
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.emit import copy_array, fill
from gradflow.autodiff.rules import REVERSE_RULES, load_builtin_rules
from gradflow.core.errors import NoRuleError, NotDifferentiableError

BACKWARD_LABEL = "gradflow_backward"


@attrs.frozen
class ADSpec:
    wrt: tuple[str, ...]
    of: tuple[str, ...]
    mode: str = "grad"  # "grad": seed 1.0; "vjp": seed from a cotangent argument
    prefix: str = "grad_"


@attrs.frozen
class ADInterface:
    """Frozen facts about a differentiated SDFG, attached to the Graph as `meta["ad"]`."""

    spec: ADSpec
    grads: dict[str, str]  # wrt -> gradient output array
    cotangents: dict[str, str]  # of -> cotangent input array (vjp mode)
    buffers: dict[str, str]  # forward array -> gradient buffer (internal and outputs)
    stores: dict[str, str]  # stored copy -> original array
    backward_label: str = BACKWARD_LABEL


def straight_line_states(sdfg: dace.SDFG) -> list[SDFGState]:
    """The top-level blocks as a chain of states, or a clear error for control flow."""
    blocks = []
    block = sdfg.start_block
    seen = set()
    while block is not None:
        if block in seen:
            raise NotDifferentiableError(f"SDFG '{sdfg.name}' has a cycle of states at '{block.label}'")
        seen.add(block)
        if not isinstance(block, SDFGState):
            raise NotDifferentiableError(
                f"block '{block.label}' ({type(block).__name__}) of SDFG '{sdfg.name}' is control flow, which "
                "this version of gradflow does not differentiate yet",
                "differentiate a dataflow program (no loops or branches at program level), or unroll the loop",
            )
        blocks.append(block)
        out = sdfg.out_edges(block)
        if len(out) > 1 or (out and (not out[0].data.is_unconditional() or out[0].data.assignments)):
            raise NotDifferentiableError(
                f"state '{block.label}' of SDFG '{sdfg.name}' branches or assigns symbols; control flow is not "
                "differentiated yet"
            )
        block = out[0].dst if out else None
    if len(blocks) != len(sdfg.nodes()):
        raise NotDifferentiableError(f"SDFG '{sdfg.name}' has blocks unreachable from its start block")
    return blocks


def _sites(states: Sequence[SDFGState]) -> list[OpSite]:
    sites = []
    for state in states:
        ops = decompose(state)
        if len(ops) > 1:
            raise NotDifferentiableError(f"state '{state.label}' holds {len(ops)} operations; run split_operations first")
        for op in ops:
            sites.append(OpSite(len(sites), state, op))
    return sites


def _rule_for(site: OpSite):
    rule = REVERSE_RULES.table.lookup(site.op.kind, site)
    if rule is None:
        node = site.members()[0] if site.op.nodes else site.op.label
        raise NoRuleError.build(
            "reverse", f"{site.op.kind} '{node}' ({type(node).__name__})", f"state '{site.state.label}'",
            "expand library nodes (expand_library_nodes pass) or register a reverse rule for this node kind",
        )
    return rule.fn


def build_reverse(sdfg: dace.SDFG, spec: ADSpec) -> ADInterface:
    load_builtin_rules()
    states = straight_line_states(sdfg)
    sites = _sites(states)
    rules = [_rule_for(site) for site in sites]
    accesses = [OpAccess(site.read_arrays(), site.written_arrays()) for site in sites]
    act = activity(sdfg.arrays, accesses, spec.wrt, spec.of)

    buffers: dict[str, str] = {}
    grads: dict[str, str] = {}
    for name in sorted(act.carrying):
        desc = sdfg.arrays[name]
        if not is_float(desc):
            continue
        if name in spec.wrt:
            buffers[name] = grads[name] = spec.prefix + name
            sdfg.add_array(buffers[name], desc.shape, desc.dtype, transient=False)
        else:
            buffers[name], _ = sdfg.add_array(f"gradflow_g_{name}", desc.shape, desc.dtype, transient=True,
                                              find_new_name=True)
    cotangents: dict[str, str] = {}
    if spec.mode == "vjp":
        for name in spec.of:
            desc = sdfg.arrays[name]
            cotangents[name] = spec.prefix + name
            sdfg.add_array(cotangents[name], desc.shape, desc.dtype, transient=False)

    region = ControlFlowRegion(BACKWARD_LABEL, sdfg=sdfg)
    ctx = ReverseContext(sdfg, region, act, buffers)

    # Stores: forward values the reverse reads but that are overwritten at or after the reading operation.
    stores: dict[str, str] = {}
    by_version: dict[tuple[str, int], str] = {}
    writes_after = [set() for _ in sites]
    running: set[str] = set()
    for k in reversed(range(len(sites))):
        running |= accesses[k].writes
        writes_after[k] = set(running)
    version: dict[str, int] = {}
    for k, (site, rule) in enumerate(zip(sites, rules)):
        for array in sorted(rule.needs(site, ctx)):
            if array not in writes_after[k]:
                continue
            key = (array, version.get(array, 0))
            if key not in by_version:
                desc = sdfg.arrays[array]
                store, _ = sdfg.add_array(f"gradflow_store_{array}", desc.shape, desc.dtype, transient=True,
                                          find_new_name=True)
                copy_array(site.state.parent_graph.add_state_before(site.state, f"store_{store}"), array, store)
                by_version[key] = store
                stores[store] = array
            ctx.stores[(k, array)] = by_version[key]
        for array in accesses[k].writes:
            version[array] = version.get(array, 0) + 1

    last = states[-1] if states else None
    sdfg.add_node(region)
    if last is not None:
        sdfg.add_edge(last, region, dace.InterstateEdge())
    else:
        sdfg.start_block = sdfg.node_id(region)

    init = ctx.new_state("init_gradients")
    for array, buffer in buffers.items():
        if array in spec.of:
            if spec.mode == "vjp":
                copy_array(init, cotangents[array], buffer)
            else:
                fill(init, buffer, "1")
        else:
            fill(init, buffer, "0")
    for site, rule in zip(reversed(sites), reversed(rules)):
        rule.reverse(site, ctx)
    sdfg.reset_cfg_list()
    return ADInterface(spec, grads, cotangents, buffers, stores)
