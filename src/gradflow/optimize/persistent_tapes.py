"""`persistent_tapes`: the tape's stacks live in the program's state, allocated once per set of sizes.

A stack of fixed capacity (`autodiff.tape`) is sized for the worst case of its loops: nb_gramschmidt's
column stack holds N (N - 1) columns of M elements, 76 MB at the benchmark size, half of it written per
call. Allocated per call, such a block is above glibc's mmap threshold (32 MiB at most, `runtime.heap`):
every call maps it afresh and page-faults in each page it writes, zeroed by the kernel -- 1.75 million
page faults in 4 s of nb_gramschmidt's forward+backward calls, 80 thousand with the stacks persistent,
and f+b 20% faster (measured while another job loaded the machine).

This pass gives the top-level SDFG's fixed-capacity stacks (transient arrays named `gradflow_tape_*`
whose sizes depend only on the program's arguments) `Persistent` lifetime: DaCe allocates them in the
program's init function, for the sizes of that handle (`runtime.calling.Kernel.handle_for`), and frees
them at exit. Every stack is written before it is read in a call (a push precedes its pop), so what a
previous call left there is never read. The price: the stacks stay allocated while the compiled program
is loaded, and calls on one handle are serialised (`runtime.calling.is_stateful`). The heap buffers of
growable stacks, which the program manages itself, and the stacks of nested SDFGs are left alone (a
growable stack's one-item staging array is made persistent like the others).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass

PREFIX = "gradflow_tape_"


def _candidates(sdfg: dace.SDFG) -> list[str]:
    given = set(map(str, sdfg.free_symbols))
    found = []
    for name, desc in sdfg.arrays.items():
        if (name.startswith(PREFIX) and type(desc) is dace.data.Array and desc.transient
                and desc.lifetime == dace.AllocationLifetime.Scope
                and desc.storage in (dace.StorageType.Default, dace.StorageType.CPU_Heap)
                and {str(s) for s in desc.free_symbols} <= given):
            found.append(name)
    return found


@register_pass
@attrs.frozen
class PersistentTapes(Pass):
    """Fixed-capacity tape stacks of the top-level SDFG get `Persistent` lifetime (module doc)."""

    name: ClassVar[str] = "persistent_tapes"

    def run(self, graph: Graph) -> PassResult:
        if not _candidates(graph.sdfg):
            return Success(graph)
        sdfg = graph.editable()
        for name in _candidates(sdfg):
            sdfg.arrays[name].lifetime = dace.AllocationLifetime.Persistent
        return Success(Graph.adopt(sdfg, graph.meta))
