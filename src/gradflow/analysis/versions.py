"""Conditional blocks whose branches compute the same: versions of one piece of a program that a pass made
for speed and chooses between at run time (`optimize.tiled_chains`: a chain of maps run block by block on
one thread, or as it was). An analysis that follows what a program writes and reads may read the version
kept as it was for all of them; the pass that made the others proved them equal to it."""

from __future__ import annotations

from dace.sdfg.state import ConditionalBlock, ControlFlowRegion

#: the label prefix of such a conditional block (its last branch, the `else`, is the version kept): one of
#: gradflow's own prefixes, which differentiating a gradflow-made program again sets aside
#: (`transforms.internal_names`), so only blocks this program's passes made carry it
PREFIX = "gradflow_versions_"


def kept_version(block) -> ControlFlowRegion | None:
    """The branch of a versions block kept as the program was, or None for any other block."""
    if (isinstance(block, ConditionalBlock) and block.label.startswith(PREFIX) and len(block.branches) == 2
            and block.branches[-1][0] is None):
        return block.branches[-1][1]
    return None
