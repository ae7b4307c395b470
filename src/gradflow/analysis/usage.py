"""Which arrays a part of a program touches: what a backward sweep or a forward sweep must be given."""

from __future__ import annotations

import dace
from dace.sdfg.state import ConditionalBlock, LoopRegion


def arrays_used(blocks) -> set[str]:
    """Arrays read or written by the states of `blocks`, or read by their interstate edges, by the
    conditions of their loops and branches (a reversed `for i in range(T)` reads the scalar argument T), and
    by the symbolic expressions of their states (the map a reversed `for i in range(T)` can become has the
    range `1:T`, which reads T without an access node)."""
    used = set()
    for block in blocks:
        regions = [block] if isinstance(block, dace.SDFGState) else list(block.all_control_flow_blocks())
        for b in regions:
            if isinstance(b, dace.SDFGState):
                used |= {n.data for n in b.data_nodes()}
                used |= {str(s) for s in b.free_symbols} & set(b.sdfg.arrays)
        if not isinstance(block, dace.SDFGState):
            for edge in block.all_interstate_edges():
                used |= set(edge.data.read_symbols())
            for region in [block, *block.all_control_flow_regions()]:
                codes = []
                if isinstance(region, LoopRegion):
                    codes = [region.init_statement, region.loop_condition, region.update_statement]
                elif isinstance(region, ConditionalBlock):
                    codes = [condition for condition, _ in region.branches]
                used |= {str(symbol) for code in codes if code is not None for symbol in code.get_free_symbols()}
    return used
