"""Running SDFGs: content-addressed compilation, fast calls, argument validation, DLPack."""

from gradflow.runtime.cache import cache_root
from gradflow.runtime.calling import Kernel, Runner
from gradflow.runtime.compile import compile_sdfg
from gradflow.runtime.plan import ArgSpec, CallPlan, plan_for

__all__ = ["ArgSpec", "CallPlan", "Kernel", "Runner", "cache_root", "compile_sdfg", "plan_for"]
