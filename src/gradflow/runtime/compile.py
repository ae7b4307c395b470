"""Content-addressed compilation of SDFGs.

A build lives in `<cache root>/<fingerprint prefix>/`, keyed by the SDFG's canonical fingerprint and the
DaCe version and the BLAS in use (`runtime.blas`: BLAS library nodes become OpenBLAS calls while a build
runs), so a second build of an identical graph is a cache hit in this process (a dict) or in any
other (a folder with a `BUILT` marker). Parallel processes serialise on a per-key file lock; a build is
marked complete only after the library exists, so a crash never leaves a half-written cache entry behind.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import os
import threading
from pathlib import Path

import dace
from dace.codegen import compiler as dace_compiler
from dace.codegen.compiled_sdfg import CompiledSDFG

from gradflow.core import progress
from gradflow.core.errors import CompilationError
from gradflow.core.graph import Graph, fingerprint
from gradflow.runtime import blas

_LOADED: dict[str, CompiledSDFG] = {}
_LOCK = threading.Lock()


def cache_root() -> Path:
    """`GRADFLOW_CACHE`, else `$XDG_CACHE_HOME/gradflow`, else `~/.cache/gradflow`."""
    env = os.environ.get("GRADFLOW_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradflow"


def build_key(sdfg: dace.SDFG, fp: str | None = None) -> str:
    text = f"{fp or fingerprint(sdfg)}|dace={dace.__version__}|blas={blas.tag()}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def compile_sdfg(program: dace.SDFG | Graph) -> CompiledSDFG:
    """Compile (or fetch from the cache) the SDFG. The argument is never modified."""
    graph = program if isinstance(program, Graph) else None
    sdfg = graph.sdfg if graph is not None else program
    key = build_key(sdfg, graph.fingerprint if graph is not None else None)
    with _LOCK:
        hit = _LOADED.get(key)
        if hit is not None:
            return hit
        folder = cache_root() / key
        folder.mkdir(parents=True, exist_ok=True)
        private = copy.deepcopy(sdfg)
        private.build_folder = str(folder)
        with open(folder.parent / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                marker = folder / "BUILT"
                if marker.is_file():
                    compiled = dace_compiler.load_precompiled_sdfg(folder, sdfg=private)
                else:
                    compiled = _build(private, folder)
                    marker.write_text(key)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        _LOADED[key] = compiled
        return compiled


def _build(sdfg: dace.SDFG, folder: Path) -> CompiledSDFG:
    try:
        with dace.config.set_temporary("compiler", "use_cache", value=False), blas.compile_context(), \
                progress.step(f"compiling SDFG '{sdfg.name}'"):
            return sdfg.compile()
    except Exception as exc:  # DaCe raises several unrelated types for a failed build
        text = str(exc)
        tail = text[-2000:] if len(text) > 2000 else text
        raise CompilationError(f"building SDFG '{sdfg.name}' in {folder} failed: {type(exc).__name__}: {tail}") from exc
