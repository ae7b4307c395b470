"""Running SDFGs: content-addressed compilation, fast calls, argument validation, DLPack."""

from gradflow.runtime.compile import cache_root, compile_sdfg

__all__ = ["cache_root", "compile_sdfg"]
