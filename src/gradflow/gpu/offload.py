"""`to_gpu`: a program's dataflow onto an NVIDIA GPU, and `OPTIMIZE_GPU`, the pipeline that ends with it.

DaCe's GPU transformation does the rewrite, on the pass's private copy: every top-level map becomes a CUDA
kernel (maps inside it run sequentially in each thread), transients move to device memory (a tape too: its
pushes and pops are kernels, no host round trip), a tasklet outside maps that writes device memory becomes
a one-thread kernel, and the program's arguments stay host arrays copied in before the first kernel and
out after the last. The transformation changes where code runs, not what it computes, so it needs no
proof of gradflow's: the order of states, the memlets and the tasklets are kept. DaCe's simplification,
which its GPU transformation runs by default, is not run: it would restructure the program after
gradflow's analysis (loops, copies) without gradflow's proofs.

Refused (`NotDifferentiableError`, so a caller sees it before any build): a growable tape (a while loop
without a trip-count bound, or a for loop whose bound is read from data). Its buffer grows with `realloc`
in C++ on the host, which a kernel cannot call. Bounding a while loop (`STORE_ALL.with_loop_bounds(...)`)
gives a fixed tape, which lives in device memory; a trip count passed as a scalar argument is a size.

`OPTIMIZE_GPU` holds `to_gpu` alone for now. `OPTIMIZE`'s CPU passes were chosen by CPU measurements;
several make structure a GPU handles badly (a sequential inner loop per element from `nest_reductions`, a
small/large version of each map from `version_by_size`, C++ tasklets calling CPU BLAS or SIMD code) and
some DaCe's GPU code generator rejects. A pass joins `OPTIMIZE_GPU` once it is measured on a GPU.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import LoopRegion
from returns.result import Success

from gradflow.analysis.loops import describe_loop
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, Pipeline, register_pass

#: `Graph.meta` key: the target a program was built for ("cuda" after `to_gpu`)
TARGET = "target"

_HEAP = "gradflow_heap_"  # the heap record of a growable tape (`autodiff.tape`)


def _loops_with_growable_tapes(sdfg: dace.SDFG) -> dict[str, LoopRegion | None]:
    """The user's loops whose executions push onto a growable tape, by label (None: a loop not found)."""
    found: dict[str, LoopRegion | None] = {}
    heap = False
    for node, state in sdfg.all_nodes_recursive():
        if not (isinstance(node, nd.AccessNode) and node.data.startswith(_HEAP)):
            continue
        heap = True
        region = state.parent_graph
        while region is not None and not isinstance(region, dace.SDFG):
            if isinstance(region, LoopRegion) and not region.label.startswith("reverse"):  # not its reversal
                found.setdefault(region.label, region)
                break
            region = region.parent_graph
    if heap and not found:
        found["*"] = None
    return found


def _refusal(loops: dict[str, LoopRegion | None]) -> NotDifferentiableError:
    named = " and ".join(describe_loop(loop) if loop is not None else "a loop of the program"
                         for loop in loops.values())
    whiles = [label for label, loop in loops.items() if loop is None or not loop.loop_variable]
    hints = []
    if whiles:
        hints.append("bound the while loop: forwarding=gradflow.STORE_ALL.with_loop_bounds(**{"
                     + ", ".join(f"{label!r}: <n>" for label in whiles) + "}) (a fixed tape, kept in device memory)")
    if len(whiles) < len(loops):
        hints.append("a for loop's bound read from data cannot size a fixed tape: pass the trip count as a "
                     "scalar argument, which makes it a size")
    return NotDifferentiableError(
        f"{named}: gradflow cannot bound its trip count before the program runs (a while loop, or a bound read "
        "from data), so its gradient keeps a growable tape, which grows with realloc on the host; GPU code "
        "cannot", "; ".join(hints))


def gpu_maps(sdfg: dace.SDFG) -> int:
    """The number of maps scheduled as CUDA kernels."""
    return sum(1 for n, _ in sdfg.all_nodes_recursive()
               if isinstance(n, nd.MapEntry) and n.map.schedule == dace.ScheduleType.GPU_Device)


@register_pass
@attrs.frozen
class ToGpu(Pass):
    """The program's maps as CUDA kernels, its transients in device memory (module doc)."""

    name: ClassVar[str] = "to_gpu"

    def run(self, graph: Graph) -> PassResult:
        if graph.meta.get(TARGET) == "cuda":
            return Success(graph)
        loops = _loops_with_growable_tapes(graph.sdfg)
        if loops:
            raise _refusal(loops)
        sdfg = graph.editable()
        sdfg.apply_gpu_transformations(validate=True, simplify=False)
        sdfg.reset_cfg_list()
        return Success(Graph.adopt(sdfg, {**graph.meta, TARGET: "cuda"}))


#: The GPU pipeline (module doc: which CPU passes it leaves out, and why).
OPTIMIZE_GPU = Pipeline((ToGpu(),))
