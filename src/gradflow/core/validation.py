"""Checks of every graph a pass returns, so that a malformed graph is a `PassError` naming the pass rather
than a crash deep inside DaCe's code generator later.

`check_graph` checks what DaCe's code generator relies on and its validation does not: that the dataflow
of every state is acyclic, and that the dominator and post-dominator analysis of the control flow (used
to place allocations) yields a proper tree. These are cheap; `thorough=True` adds DaCe's own validation
(`SDFG.validate`, seconds on large graphs), which the `reverse` pass runs on its result.
"""

from __future__ import annotations

import dace
import networkx as nx
from dace.sdfg import utils as sdutils

from gradflow.core.errors import PassError


def problems(sdfg: dace.SDFG, thorough: bool = False) -> list[str]:
    """What is wrong with `sdfg` (empty when nothing is)."""
    found = []
    for sub in sdfg.all_sdfgs_recursive():
        for state in sub.states():
            if not nx.is_directed_acyclic_graph(state.nx):
                cycle = nx.find_cycle(state.nx)
                found.append(f"state '{state.label}' of SDFG '{sub.name}' has a dataflow cycle through "
                             + " -> ".join(str(e[0]) for e in cycle))
        if not sub.nodes():
            continue
        try:
            sdutils.get_control_flow_block_dominators(sub, {}, {}, {}, {})
        except (nx.NetworkXException, ValueError) as exc:  # a cyclic dominator tree, an ambiguous start block
            found.append(f"the control flow of SDFG '{sub.name}' defeats DaCe's dominator analysis: {exc}")
    if found or not thorough:
        return found
    try:
        sdfg.validate()
    except dace.sdfg.InvalidSDFGError as exc:
        found.append(f"DaCe's validation: {str(exc).splitlines()[0]}")
    return found


def check_graph(sdfg: dace.SDFG, pass_name: str, thorough: bool = False) -> PassError | None:
    """A `PassError` naming `pass_name` when the graph it returned is malformed, else None."""
    found = problems(sdfg, thorough)
    if not found:
        return None
    return PassError(f"pass '{pass_name}' returned an invalid graph: {'; '.join(found)}",
                     "this is a bug in the pass (or in a rule it applied); please report it with the program")
