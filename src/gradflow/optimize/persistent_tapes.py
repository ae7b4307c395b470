"""`persistent_tapes` (opt-in, not in `OPTIMIZE`): the tape's stacks live in the program's state, allocated
once per handle instead of once per call.

A stack of fixed capacity (`autodiff.tape`) is sized for the worst case of its loops: nb_gramschmidt's
column stack holds N (N - 1) columns of M elements, 76 MB at the benchmark size, half of it written per
call. Allocated per call, such a block is above glibc's mmap threshold (32 MiB at most, `runtime.heap`):
every call maps it afresh and page-faults in each page it writes, zeroed by the kernel -- 1.75 million
page faults in 4 s of nb_gramschmidt's forward+backward calls, 80 thousand with the stacks persistent,
and f+b about 20% faster (measured while another job loaded the machine).

This pass gives the top-level SDFG's fixed-capacity stacks (transient arrays named `gradflow_tape_*`
whose sizes depend only on the program's arguments) `Persistent` lifetime: DaCe allocates them in the
program's init function, for the sizes it is initialised with, and frees them at exit. Every stack is
written before it is read in a call (a push precedes its pop), so what a previous call left there is
never read.

Why it is not in the default pipeline: DaCe's own `CompiledSDFG` (what `sdfg.compile()`, calling an SDFG
and `runtime.compile.compile_sdfg` give) initialises a program once, with the sizes of its first call,
and keeps that state for every later call: a call at a larger size would then overrun the stacks (found
by the library-rule tests, which call one build at several sizes: heap corruption). gradflow's own
calling path (`runtime.calling.Kernel`, used by `Runner`, the benchmarks and the torch dispatchers)
keeps one state per set of sizes and serialises calls on a stateful one, so the pass is safe there:
`Runner` applies it to every program it compiles (what `value_and_grad` and the benchmarks call through;
the torch dispatchers split forward and backward, whose stacks cross as arguments), and a user may add
it for a program called at one set of sizes: `gradflow.grad(..., optimize=OPTIMIZE + PersistentTapes())`.
The stacks then stay allocated while the program is loaded, one set per set of sizes called. The heap
buffers of growable stacks, which the program manages itself, and the stacks of nested SDFGs are left
alone (a growable stack's one-item staging array is made persistent like the others).
"""

from __future__ import annotations

from typing import ClassVar, Iterator

import attrs
import dace

from gradflow.core.passes import register_pass
from gradflow.core.rewrite import RewritePass

PREFIX = "gradflow_tape_"


def per_call_arrays(sdfg: dace.SDFG) -> Iterator[tuple[str, dace.data.Array]]:
    """The top-level SDFG's transient arrays on the heap, allocated per call, whose sizes depend only on the
    program's arguments: those DaCe could allocate once, at init, for the sizes it is initialised with."""
    given = set(map(str, sdfg.free_symbols))
    for name, desc in sdfg.arrays.items():
        if (type(desc) is dace.data.Array and desc.transient
                and desc.lifetime == dace.AllocationLifetime.Scope
                and desc.storage in (dace.StorageType.Default, dace.StorageType.CPU_Heap)
                and {str(s) for s in desc.free_symbols} <= given):
            yield name, desc


def _candidates(sdfg: dace.SDFG) -> list[str]:
    return [name for name, _ in per_call_arrays(sdfg) if name.startswith(PREFIX)]


def has_stacks(sdfg: dace.SDFG) -> bool:
    """Whether the pass would change `sdfg` (read only)."""
    return bool(_candidates(sdfg))


class MakePersistent(RewritePass):
    """Base of the passes that give top-level arrays `Persistent` lifetime: each match is an array's name."""

    nested: ClassVar[bool] = False  # the top-level SDFG's arrays
    matches_are_names: ClassVar[bool] = True
    #: a lifetime is all it changes: no state's dataflow and no control flow, which `check_graph` examines
    #: (on a large gradient that check cost more than the rest of loading it)
    checks_output: ClassVar[bool] = False

    def rewrite(self, sdfg: dace.SDFG, match: str) -> None:
        sdfg.arrays[match].lifetime = dace.AllocationLifetime.Persistent


@register_pass
@attrs.frozen
class PersistentTapes(MakePersistent):
    """Fixed-capacity tape stacks of the top-level SDFG get `Persistent` lifetime (module doc)."""

    name: ClassVar[str] = "persistent_tapes"

    def matches(self, sdfg: dace.SDFG) -> list[str]:
        return _candidates(sdfg)
