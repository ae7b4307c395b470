"""Optimization of forward and backward SDFGs: pure passes, composed into `OPTIMIZE`.

`gradflow.grad`, `vjp`, `value_and_grad` and the torch dispatchers apply `OPTIMIZE` to what they compile
unless called with `optimize=False` (or another pipeline); `optimized(program)` applies it to a program
that is not differentiated (its forward alone, e.g. to compare with). Every pass keeps the program's
results: the test suite compares optimized and unoptimized gradients on every corpus program.
"""

from __future__ import annotations

import os
from typing import Any

from gradflow.core.graph import Graph
from gradflow.core.passes import Pipeline, unwrap_or_raise
from gradflow.optimize.broadcasts import ForwardBroadcasts
from gradflow.optimize.copy_states import JoinCopyStates
from gradflow.optimize.dead_stores import DropDeadStores
from gradflow.optimize.element_states import JoinElementwiseStates
from gradflow.optimize.gathered_maps import GatherElementMaps
from gradflow.optimize.in_place import WriteInPlace
from gradflow.optimize.index_arithmetic import SimplifyIndexArithmetic
from gradflow.optimize.layouts import TransientLayouts
from gradflow.optimize.loop_interchange import MoveLoopsIntoMaps
from gradflow.optimize.loop_sums import OverwriteLoopSums
from gradflow.optimize.nest_reductions import NestReductions
from gradflow.optimize.overwrite_zeroed_products import OverwriteZeroedProducts
from gradflow.optimize.persistent_tapes import PersistentTapes
from gradflow.optimize.persistent_transients import PersistentTransients
from gradflow.optimize.reduce_fusion import ReduceInMaps
from gradflow.optimize.reductions import LocalReductions
from gradflow.optimize.scalar_sums import RegisterScalarSums
from gradflow.optimize.scatter import OwnScatterWrites
from gradflow.optimize.schedules import ChooseSchedules
from gradflow.optimize.shared_buffers import ShareDeadBuffers
from gradflow.optimize.sibling_sums import MergeElementSums
from gradflow.optimize.simd_sums import SimdRegisterSums
from gradflow.optimize.split_sums import SplitSumMaps
from gradflow.optimize.sunk_fills import SinkFills
from gradflow.optimize.tiled_chains import TileElementChains
from gradflow.optimize.versioning import VersionBySize
from gradflow.transforms.fusion import FuseMaps
from gradflow.transforms.idioms import RaiseConvolutions
from gradflow.transforms.loop_reductions import RaiseLoopReductions
from gradflow.transforms.parallel_loops import LoopsToMaps
from gradflow.transforms.product_scales import FoldProductScales
from gradflow.transforms.row_products import HoistRowProducts
from gradflow.transforms.views import RemoveViews

def _tiling() -> TileElementChains:
    """`tile_element_chains` as configured: `GRADFLOW_TILE_BLOCK=k` (for tests and the fuzzer) takes blocks
    of k elements and tiles chains of any length (one block or more), so that programs of a few elements
    run tiled and cross block edges (with the default four blocks, the fuzzer's vectors of 4-8 elements
    minus a slice's cut of 1-2 stayed below 4 * 2 and ran as they were)."""
    block = os.environ.get("GRADFLOW_TILE_BLOCK")
    return TileElementChains(block=int(block), min_blocks=1) if block else TileElementChains()


#: The default optimization pipeline. Its first six passes are AD normalization passes too (a no-op on
#: a differentiated program, which went through them): a program compiled forward only gets the same
#: convolution nodes, products and maps as its gradient.
OPTIMIZE = Pipeline((RaiseConvolutions(), RemoveViews(), FoldProductScales(), HoistRowProducts(),
                     RaiseLoopReductions(), LoopsToMaps(), OverwriteZeroedProducts(), OverwriteLoopSums(),
                     DropDeadStores(),
                     ForwardBroadcasts(), MergeElementSums(), JoinElementwiseStates(), FuseMaps(),
                     SimplifyIndexArithmetic(), JoinCopyStates(), WriteInPlace(), MoveLoopsIntoMaps(), ReduceInMaps(), OwnScatterWrites(),
                     SplitSumMaps(), NestReductions(), LocalReductions(), GatherElementMaps(), _tiling(), ChooseSchedules(), VersionBySize(),
                     RegisterScalarSums(), SimdRegisterSums(), TransientLayouts(), SinkFills(), ShareDeadBuffers()))


def optimized(program: Any, pipeline: Pipeline = OPTIMIZE) -> Graph:
    """`program` (a `dace.SDFG`, `@dace.program` or `Graph`) through `pipeline`, as a new graph."""
    return unwrap_or_raise(pipeline(Graph.of(program)))


__all__ = ["OPTIMIZE", "ChooseSchedules", "DropDeadStores", "FoldProductScales", "ForwardBroadcasts", "FuseMaps", "GatherElementMaps",
           "HoistRowProducts", "JoinCopyStates", "JoinElementwiseStates", "LocalReductions", "MergeElementSums",
           "MoveLoopsIntoMaps", "NestReductions", "OverwriteLoopSums", "OverwriteZeroedProducts", "OwnScatterWrites", "PersistentTapes",
           "PersistentTransients", "RaiseLoopReductions", "ReduceInMaps", "RegisterScalarSums", "ShareDeadBuffers",
           "SimdRegisterSums", "SimplifyIndexArithmetic", "SinkFills", "TileElementChains", "TransientLayouts", "VersionBySize", "WriteInPlace", "optimized"]
