"""Nested SDFGs as sub-programs of reverse mode, shared by the nested rule (`rules/nested.py`) and
checkpointed loops (`checkpoint.py`, whose steps are nested SDFGs): the names of a vjp's gradient and
split connectors, and the plumbing that gives an in/out connector a private copy."""

from __future__ import annotations

import copy

import dace
import sympy
from dace import subsets
from dace.sdfg import nodes as nd

from gradflow.autodiff.forwarding import Forwarding
from gradflow.autodiff.spec import ADInterface, ADSpec, Differentiate
from gradflow.core.errors import NotDifferentiableError

PREFIX = "gradflow_d_"
IN = "gradflow_in_"  # the input side of a split in/out connector


def split_inout(sdfg: dace.SDFG, regions: dict[str, subsets.Range]) -> None:
    """Connector `c` of both directions becomes input `gradflow_in_<c>`, whose region `regions[c]` (what the
    node reads, in the nested SDFG's coordinates) is copied into a private `c` first. Only that region: a
    map runs one call per iteration over the same full-shaped arrays, and each owns its region only."""
    if not regions:
        return
    first = sdfg.add_state_before(sdfg.start_block, "gradflow_split_inout", is_start_block=True)
    for c, region in regions.items():
        desc = copy.deepcopy(sdfg.arrays[c])
        sdfg.add_datadesc(IN + c, desc)
        sdfg.arrays[c].transient = True
        first.add_nedge(first.add_read(IN + c), first.add_write(c), dace.Memlet(data=IN + c, subset=region,
                                                                              other_subset=copy.deepcopy(region)))


def inner_region(node: nd.NestedSDFG, memlet: dace.Memlet, where: str) -> subsets.Range:
    """`memlet`'s subset in the nested SDFG's coordinates. DaCe passes nested arguments as base pointers,
    so coordinates agree and only symbols need renaming (outer symbol -> the inner one mapped to it)."""
    inverse = {}
    for inner, outer in node.symbol_mapping.items():
        expr = dace.symbolic.pystr_to_symbolic(str(outer))
        if isinstance(expr, sympy.Symbol):
            inverse[expr] = dace.symbolic.symbol(inner)
    region = copy.deepcopy(memlet.subset)
    region.replace(inverse)
    free = {str(s) for s in region.free_symbols} - set(node.symbol_mapping) - set(node.sdfg.symbols)
    if free:
        raise NotDifferentiableError(f"{where}: cannot express {memlet.subset} inside the nested SDFG "
                                     f"(symbols {', '.join(sorted(free))})")
    return region


def nested_vjp(node: nd.NestedSDFG, regions: dict[str, subsets.Range], wrt: tuple[str, ...], of: tuple[str, ...],
               policy: Forwarding, differentiate: Differentiate, **spec) -> tuple[dace.SDFG, ADInterface]:
    """The vjp of `node`'s SDFG, as the nested rule and checkpointed steps build it: a private copy with the
    in/out connectors of `regions` split, differentiated in vjp mode with accumulating gradients named
    `PREFIX + ...`, not as the outermost program (`spec`: further `ADSpec` fields)."""
    source = copy.deepcopy(node.sdfg)
    split_inout(source, regions)
    return differentiate(source, ADSpec(wrt, of, "vjp", PREFIX, policy, accumulate=True, outermost=False, **spec))
