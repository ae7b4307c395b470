"""`persistent_transients` (opt-in, not in `OPTIMIZE`; `Runner` applies it): the top-level temporaries a
call never reads before writing live in the program's state, allocated once per handle instead of once per
call.

A temporary above glibc's mmap threshold (32 MiB at most, `runtime.heap`) is mapped afresh on every call
and each page it writes is faulted in and zeroed by the kernel: GradBench's k-means cost at k = 1000,
n = 10000 builds the 80 MB product of points and centroids; with the pass a call went from 82.6 to 18.9 ms
(one thread, the machine shared with a fuzzer), through GradBench's relay 45.7 to 8.9 ms
(`benchmarks/results/gradbench.md`). A smaller one still costs a `malloc` and a `free` per call.

Chosen: the top-level SDFG's transient arrays (not views, not in nested SDFGs), on the heap and not local
to a map, whose sizes depend only on the program's arguments (DaCe sizes persistent data at init), and
- that are tape stacks (`optimize.persistent_tapes`: every pop follows its push in the same call); or
- whose size is a symbol's (a constant-sized one is cheap to allocate) and whose value on entry no run
  reads (`analysis.writes.exposed_read` proves every element read is written earlier in the same run), so
  what an earlier call left there is never seen.
A temporary the analysis cannot clear keeps its lifetime. Why not the constant-sized ones: DaCe's code
reaches a persistent array through the state struct, where the C++ compiler no longer sees fresh memory
that nothing else points to. With them persistent, lp_go_fast's f+b was 1.10x in a paired A/B (twice):
its one-element gradient of S is read in the loop that accumulates into the gradient of B, likely read
again after every store there.

The price: the chosen temporaries stay allocated between calls, all at once (a call may have held only
some of them at a time), one set per set of sizes the program is called at; `Runner` keeps the handles of
the last `MAX_HANDLES` sets of sizes and finalizes older ones. Why it is not in `OPTIMIZE`: DaCe's own
`CompiledSDFG` initialises a program once, with the sizes of its first call, and a call at larger sizes
would overrun the arrays (`optimize.persistent_tapes` says more).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace

from gradflow.analysis.writes import exposed_read
from gradflow.core.passes import register_pass
from gradflow.optimize.persistent_tapes import PREFIX as TAPE_PREFIX
from gradflow.optimize.persistent_tapes import MakePersistent, per_call_arrays


def _outside_maps(sdfg: dace.SDFG) -> set[str]:
    """Arrays with an access node outside every map. One accessed only inside a map is local to it: DaCe
    keeps it in registers (storage `Register`, which cannot be persistent) or allocates it per iteration."""
    outside = set()
    for state in sdfg.states():
        scopes = state.scope_dict()
        outside.update(n.data for n in state.data_nodes() if scopes[n] is None)
    return outside


def candidates(sdfg: dace.SDFG) -> list[str]:
    """The transients the pass makes persistent (read only)."""
    outside = _outside_maps(sdfg)
    return [name for name, desc in per_call_arrays(sdfg) if name in outside and (
        name.startswith(TAPE_PREFIX) or (desc.free_symbols and not exposed_read(sdfg, name)))]


@register_pass
@attrs.frozen
class PersistentTransients(MakePersistent):
    """Top-level temporaries whose value on entry no run reads get `Persistent` lifetime (module doc)."""

    name: ClassVar[str] = "persistent_transients"

    def matches(self, sdfg: dace.SDFG) -> list[str]:
        return candidates(sdfg)
