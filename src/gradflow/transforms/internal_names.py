"""Normalization pass `set_aside_internal_names`: a program gradflow made (a gradient or tangent program)
gets its gradflow-made names moved out of the way before it is differentiated again.

The reverse and tangent passes name what they add after fixed patterns: arrays `gradflow_*` (the tape's
top `gradflow_tape_top`, nested cotangents `gradflow_d_<x>`), stack-pointer and other symbols `gf_*`, and
blocks `gradflow_end`, `rev_<label>`. Differentiating their output again (grad of grad, forward over
reverse) would make the same names a second time, for other things: the two tapes would share a stack
pointer. DaCe's own unique naming does not help, since the passes find their blocks and arrays by those
names.

The rewrite gives every such name of the program (in every nested SDFG, arrays, symbols, nested
connectors and the symbol mappings that bind them) a level tag instead of its `gradflow_`/`gf_` prefix
(`gradflow_tape_top` -> `gfl1_tape_top`, `gf_sp0` -> `gfl1_sp0`), and every block label the tag as a
prefix. It is a renaming, so the program computes the same; the tag is the first `gfl<k>_` no name of the
program starts with, so a third differentiation tags the second level's names `gfl2_`. Programs without
gradflow-made names (all programs users write) are left as they are: their loop labels, which users name
in `Forwarding(loop_bounds=...)`, keep their names. The program's arguments keep theirs, as they are its
signature: `grad_<x>`, and the flags a gradient program reports through (`gradflow_overflow`,
`gradflow_error`), which the next differentiation shares rather than adds again.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion

from gradflow.core.names import MADE
from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass


def _made(name: str) -> bool:
    return name.startswith(MADE)


def _symbols(sdfg: dace.SDFG) -> set[str]:
    """The symbols `sdfg` declares, assigns on its interstate edges or uses as loop variables."""
    names = set(map(str, sdfg.symbols))
    for edge in sdfg.all_interstate_edges():
        names.update(edge.data.assignments)
    for region in sdfg.all_control_flow_regions():
        if isinstance(region, LoopRegion) and region.loop_variable:
            names.add(region.loop_variable)
    return names


def made_names(sdfg: dace.SDFG) -> bool:
    """Whether `sdfg` (or an SDFG nested in it) has transients or symbols that a gradflow pass made."""
    return any(_made(n) for s in sdfg.all_sdfgs_recursive()
               for n in (*(a for a, d in s.arrays.items() if d.transient or s is not sdfg), *_symbols(s)))


def level_tag(sdfg: dace.SDFG) -> str:
    """The first `gfl<k>_` that no array, symbol or block label of `sdfg` starts with."""
    taken = set()
    for s in sdfg.all_sdfgs_recursive():
        taken.update(s.arrays)
        taken.update(_symbols(s))
        taken.update(b.label for b in s.all_control_flow_blocks())
    k = 1
    while any(n.startswith(f"gfl{k}_") for n in taken):
        k += 1
    return f"gfl{k}_"


def _rename_connectors(node: nd.NestedSDFG, state: dace.SDFGState, renamed: dict[str, str]) -> None:
    """The nested SDFG node's connectors, their edges and its symbol mapping, after its SDFG's renaming."""
    sides = ((node.in_connectors, node.remove_in_connector, node.add_in_connector, state.in_edges, "dst_conn"),
             (node.out_connectors, node.remove_out_connector, node.add_out_connector, state.out_edges, "src_conn"))
    for old, new in renamed.items():
        for connectors, remove, add, edges, end in sides:
            if old in connectors:
                dtype = connectors[old]
                remove(old)
                add(new, dtype, force=True)
                for edge in edges(node):
                    if getattr(edge, end) == old:
                        setattr(edge, end, new)
        if old in node.symbol_mapping:
            node.symbol_mapping[new] = node.symbol_mapping.pop(old)


def set_aside(sdfg: dace.SDFG, tag: str) -> None:
    """Rename, in place, every gradflow-made name of `sdfg` and its nested SDFGs with `tag` (see the
    module doc)."""
    for sub in list(sdfg.all_sdfgs_recursive()):  # parents before the SDFGs nested in them
        arrays = [n for n, d in sub.arrays.items() if d.transient or sub is not sdfg]  # not the arguments
        names = [n for n in (*arrays, *_symbols(sub)) if _made(n)]
        renamed = {n: tag + n.split("_", 1)[1] for n in dict.fromkeys(names)}
        if renamed:
            sub.replace_dict(renamed)
            if sub.parent_nsdfg_node is not None:
                _rename_connectors(sub.parent_nsdfg_node, sub.parent, renamed)
        for region in sub.all_control_flow_regions():
            for block in region.nodes():
                block.label = tag + block.label
            region._labels = {b.label for b in region.nodes()}  # DaCe's ledger of issued labels


@register_pass
@attrs.frozen
class SetAsideInternalNames(RewritePass):
    """Gradflow-made names of a differentiated program get a level tag (see the module docstring)."""

    name: ClassVar[str] = "set_aside_internal_names"
    nested: ClassVar[bool] = False  # `set_aside` walks the nested SDFGs itself, with their connectors
    resets_cfg: ClassVar[bool] = True

    def matches(self, sdfg: dace.SDFG) -> list[str]:
        return [level_tag(sdfg)] if made_names(sdfg) else []

    def rewrite(self, sdfg: dace.SDFG, match: str) -> None:
        set_aside(sdfg, match)
