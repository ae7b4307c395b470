"""Content-addressed compilation of SDFGs.

A build lives in `<cache root>/<key>/`, keyed by the SDFG's canonical fingerprint, the DaCe version, the
BLAS in use (`runtime.blas`: BLAS library nodes become OpenBLAS calls while a build runs) and the vector
math declarations (`runtime.vector_math`: SIMD transcendentals from glibc) and the source of gradflow's own
library nodes' expansions (`gradflow.library.tag()`), so a second
build of an identical graph is a cache hit in this process (a dict) or in any other (a folder).

How an entry stays trustworthy:
- Parallel processes serialise on a per-key file lock (`<key>.lock`, released by the kernel if the holder
  dies). A build runs in a private folder `.build-<key>-*` and is published by renaming it to `<key>` only
  once it is complete, so a build killed half-way never leaves anything at `<key>` (its folder is removed
  by the next build of that key).
- The `BUILT` marker of an entry records the SHA-256 of the compiled library and of DaCe's stub library
  and the C signature of the program. An entry is loaded only when all of them match; a truncated,
  overwritten, emptied or deleted library (or a marker that does not parse) is rebuilt, with a
  `CacheWarning`, and replaced atomically: a process that has the old library loaded keeps its mapping.
- A cache root that cannot be used (not a folder, not writable) is replaced, for this process, by a
  private temporary cache, with one `CacheWarning`.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import dace
import sympy
from dace.codegen import compiler as dace_compiler
from dace.codegen.compiled_sdfg import CompiledSDFG
from dace.sdfg import infer_types
from dace.sdfg import nodes as nd
from dace.transformation.passes.insert_explicit_copies import InsertExplicitCopies

from gradflow.core import progress, stop_gradient
from gradflow.core.dace_warnings import ignore_tape_pushes
from gradflow.core.errors import CacheWarning, CompilationError, InvalidArgumentError, describe
from gradflow.core.graph import Graph, fingerprint
from gradflow.core.names import check_identifiers
from gradflow.runtime import blas, heap, races, vector_math
from gradflow.runtime.cache import cache_root

log = logging.getLogger(__name__)

MARKER = "BUILT"
#: version of the marker's record; a marker of another version is treated as a mismatch
MARKER_FORMAT = 2  # 2: records the entry point's parameter names (`arguments`)

_LOADED: dict[str, CompiledSDFG] = {}  # memo: entry folder -> loaded program
_LOCK = threading.Lock()
_ROOTS: dict[str, Path] = {}  # memo: configured root -> the root this process uses (itself or a fallback)


def _unusable(root: Path) -> str | None:
    """Why this process cannot keep a cache in `root` (None when it can): creates it, then a file in it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def usable_cache_root() -> Path:
    """`cache_root()` when this process can write there; otherwise a private temporary cache (removed at
    exit), announced by one `CacheWarning` per configured root."""
    configured = cache_root()
    with _LOCK:
        chosen = _ROOTS.get(str(configured))
        if chosen is None:
            problem = _unusable(configured)
            chosen = configured
            if problem is not None:
                chosen = Path(tempfile.mkdtemp(prefix="gradflow-cache-"))
                atexit.register(shutil.rmtree, chosen, True)
                warnings.warn(CacheWarning(
                    f"the gradflow cache root {configured} cannot be used ({problem}); this process compiles "
                    f"into a private temporary cache, {chosen}, which nothing else shares; point GRADFLOW_CACHE "
                    "at a writable folder to share builds"), stacklevel=3)
            _ROOTS[str(configured)] = chosen
        return chosen


@functools.cache
def _codegen_tag() -> str:
    """Content hash of the modules that change what a build emits for the same SDFG (this one: how sizes
    print; `blas`: which expansion a product gets, and the call a convolution node's kernel gets), so a fixed
    code generator never reuses an old build."""
    digest = hashlib.sha256()
    for module in (__file__, blas.__file__, races.__file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()[:16]


def build_key(sdfg: dace.SDFG, fp: str | None = None) -> str:
    from gradflow import library

    text = (f"{fp or fingerprint(sdfg)}|dace={dace.__version__}|blas={blas.tag()}|math={vector_math.tag()}"
            f"|nodes={library.tag()}|codegen={_codegen_tag()}")
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def compile_sdfg(program: dace.SDFG | Graph) -> CompiledSDFG:
    """Compile (or fetch from the cache) the SDFG. The argument is never modified."""
    ignore_tape_pushes()  # (see `gradflow.core.dace_warnings`; set again for test runners' filter resets)
    if not isinstance(program, (Graph, dace.SDFG)):
        raise InvalidArgumentError(f"compile_sdfg takes a dace.SDFG or a gradflow.Graph, got {describe(program)}",
                                   "parse a @dace.program first: gradflow.Graph.of(program)")
    graph = program if isinstance(program, Graph) else None
    sdfg = graph.sdfg if graph is not None else program
    key = build_key(sdfg, graph.fingerprint if graph is not None else None)
    root = usable_cache_root()
    folder = root / key
    blas.one_thread()
    blas.blas_choice()  # a misspelt GRADFLOW_BLAS fails here, not silently in the generated code
    heap.keep_freed_blocks()
    with _LOCK:
        hit = _LOADED.get(str(folder))
        if hit is not None:
            return hit
        check_identifiers(sdfg)  # a name the C++ cannot carry fails here, not in the compiler
        # the loaded program keeps a reference to its SDFG: an immutable Graph's may be shared, a plain
        # SDFG the caller could still edit is copied
        mine = sdfg if graph is not None else copy.deepcopy(sdfg)
        with _key_lock(root, key):
            compiled = _load(folder, key, mine)
            if compiled is None:
                compiled = _build_and_publish(mine, root, key)
        _LOADED[str(folder)] = compiled
        return compiled


@contextmanager
def _key_lock(root: Path, key: str) -> Iterator[None]:
    path = root / f"{key}.lock"
    try:  # read-only suffices for flock, so users sharing a cache can all take a lock another one created
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError as exc:
        raise CompilationError(f"cannot create the lock file {path} of the gradflow cache: {exc}",
                               "point GRADFLOW_CACHE at a writable folder") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _signature(sdfg: dace.SDFG) -> str:
    """The C signature of the program's entry points: a cached library is called with this SDFG's."""
    return f"({', '.join(sdfg.signature_arglist(with_types=True))}) init({sdfg.init_signature()})"


def _libraries(folder: Path) -> tuple[Path, Path]:
    """The compiled library of a finished build and DaCe's stub library beside it."""
    found = [p for p in (folder / "build").glob(f"lib*.{dace.Config.get('compiler', 'library_extension')}")
             if not p.name.startswith("libdacestub_")]
    if len(found) != 1:
        raise CompilationError(f"the build in {folder} produced {len(found)} libraries, expected one")
    return found[0], dace_compiler._get_stub_library_path(found[0])  # noqa: SLF001 - DaCe's naming rule


def _problem(folder: Path, key: str, record: object, sdfg: dace.SDFG) -> str | None:
    """What is wrong with a cache entry (None: it can be loaded)."""
    if not isinstance(record, dict) or record.get("format") != MARKER_FORMAT or record.get("key") != key:
        return f"has a {MARKER} marker of another format or key"
    files = record.get("files")
    if not isinstance(files, dict) or len(files) != 2 or record.get("library") not in files \
            or not isinstance(record.get("name"), str):
        return f"has an incomplete {MARKER} marker"
    for rel, expected in files.items():
        path = folder / rel
        if not path.is_file():
            return f"lacks {rel}"
        if _sha256(path) != expected:
            return f"holds a {rel} that differs from the one built (truncated or overwritten)"
    return None


def _problem_calling(record: dict, private: dace.SDFG | None) -> str | None:
    if private is None or record.get("signature") != _signature(private):
        return "was built for another calling convention"
    return None


def _entry_parameters(folder: Path, sdfg: dace.SDFG) -> list[str]:
    """The parameter names of the built program's entry point, read from its generated C++.

    They can differ from `sdfg.arglist()`: DaCe generates code from the SDFG with its library nodes
    expanded, and a symbol that only a library node's memlets use (`N` of `np.sum(A, axis=1)` for an
    `A[N, M]`) is a parameter there but not an argument of the SDFG as given, which would shift every
    later argument of the call."""
    entry = f"__program_{sdfg.name}("
    for source in sorted((folder / "src" / "cpu").glob("*.cpp")):
        text = source.read_text()
        at = text.find("DACE_EXPORTED void " + entry)
        if at >= 0:
            params = text[at + len("DACE_EXPORTED void " + entry):text.index(")", at)].split(",")
            return [p.strip().split()[-1].lstrip("*&") for p in params[1:]]  # the first is the state
    raise CompilationError(f"the build of SDFG '{sdfg.name}' in {folder} has no entry point {entry}...")


def _calling(sdfg: dace.SDFG, parameters: object) -> dace.SDFG | None:
    """`sdfg` (a private copy) made to pass exactly `parameters`, in that order, where its own argument
    list differs (see `_entry_parameters`); None where a parameter is none of its data or symbols."""
    if not isinstance(parameters, list):
        return None
    own = sdfg.arglist()
    if list(own) == parameters:
        return sdfg
    known = {**{n: d for n, d in sdfg.arrays.items() if not d.transient},
             **{n: dace.data.Scalar(t) for n, t in sdfg.symbols.items()}}
    if not all(isinstance(p, str) and p in known for p in parameters):
        return None
    fixed = {p: known[p] for p in parameters}
    # an instance attribute of this private copy: DaCe's CompiledSDFG and gradflow's call plans read the
    # calling convention from `arglist()`
    sdfg.arglist = lambda scalars_only=False, free_symbols=None: dict(  # type: ignore[method-assign]
        (n, d) for n, d in fixed.items() if not scalars_only or isinstance(d, dace.data.Scalar))
    return sdfg


def _load(folder: Path, key: str, sdfg: dace.SDFG) -> CompiledSDFG | None:
    """The verified entry at `folder`, loaded; None (after a warning when something was there) when it
    must be built."""
    if not folder.exists():
        return None
    try:
        record = json.loads((folder / MARKER).read_text())
    except FileNotFoundError:
        record, problem = None, f"has no {MARKER} marker (an unfinished build)"
    except (OSError, ValueError) as exc:
        record, problem = None, f"has an unreadable {MARKER} marker ({exc})"
    else:
        problem = _problem(folder, key, record, sdfg)
        if problem is None:
            # a shallow copy (the loaded program only reads its SDFG) that says where the build lives,
            # carries the name the library's entry points were built under and passes their parameters
            private = _calling(copy.copy(sdfg), record.get("arguments"))
            problem = _problem_calling(record, private)
    if problem is None:
        private.name = record["name"]
        private.build_folder = str(folder)
        library = folder / record["library"]
        stub = folder / next(rel for rel in record["files"] if rel != record["library"])
        try:
            return dace_compiler.get_program_handle(library, private, stub)
        except (OSError, RuntimeError, KeyError) as exc:  # what DaCe raises for a library it cannot load
            problem = f"cannot be loaded ({type(exc).__name__}: {exc})"
    warnings.warn(CacheWarning(f"the gradflow cache entry {folder} {problem}; rebuilding it"), stacklevel=4)
    return None


def _build_and_publish(sdfg: dace.SDFG, root: Path, key: str) -> CompiledSDFG:
    """Build in a private folder, record checksums, and rename it to `<root>/<key>` (replacing whatever
    was there). Called under the key's lock."""
    for leftover in root.glob(f".build-{key}-*"):  # builds killed half-way; nobody else holds the lock
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the entry from other users of a shared cache
    private = copy.deepcopy(sdfg)
    private.build_folder = str(staging)
    start = time.perf_counter()
    _build(private, staging, key)
    library, stub = _libraries(staging)
    arguments = _entry_parameters(staging, private)
    calling = _calling(copy.copy(sdfg), arguments)  # as `_load` will see it: `private` is expanded now
    if calling is None:
        raise CompilationError(f"the build of SDFG '{sdfg.name}' takes parameters {arguments}, which are not "
                               "all its data and symbols")
    record = {
        "format": MARKER_FORMAT, "key": key, "name": library.name[3:].rsplit(".", 1)[0],
        "library": str(library.relative_to(staging)), "signature": _signature(calling), "arguments": arguments,
        "files": {str(p.relative_to(staging)): _sha256(p) for p in (library, stub)},
    }
    (staging / f"{MARKER}.tmp").write_text(json.dumps(record, indent=1))
    os.replace(staging / f"{MARKER}.tmp", staging / MARKER)
    folder = root / key
    stale = None
    try:
        if folder.exists():  # a damaged entry: moved aside whole, so no reader ever sees a mixture
            stale = Path(tempfile.mkdtemp(prefix=f".stale-{key}-", dir=root))
            os.replace(folder, stale / key)
        os.replace(staging, folder)
    except OSError as exc:
        raise CompilationError(f"cannot publish the build of SDFG '{sdfg.name}' as {folder}: {exc}",
                               "point GRADFLOW_CACHE at a folder this user owns") from exc
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)
    log.info("built %s (%s) in %.2f s", folder, sdfg.name, time.perf_counter() - start)
    compiled = _load(folder, key, sdfg)
    if compiled is None:
        raise CompilationError(f"the library built in {folder} for SDFG '{sdfg.name}' cannot be loaded")
    return compiled


@contextmanager
def _integer_divisions() -> Iterator[None]:
    """While a program builds, DaCe prints `ceiling(a/b + c/b)` (SymPy's form of a strided slice's extent,
    `ceiling(N/3 - 1/3)`) as the integer division `int_ceil(a + c, b)`: its own rewrite matches only a
    single fraction and printed `ceil(N / 3 - 1 / 3)`, integer divisions whose double result OpenMP rejects
    as a loop bound and which undercounts an allocation (N = 8: 2 elements where 3 are written)."""
    original = dace.symbolic.sympy_intdiv_fix

    def together(expr):
        if isinstance(expr, sympy.Basic) and expr.has(sympy.ceiling, sympy.floor):
            expr = expr.replace(lambda e: isinstance(e, (sympy.ceiling, sympy.floor)),
                                lambda e: type(e)(sympy.together(e.args[0])))
        return original(expr)

    dace.symbolic.sympy_intdiv_fix = together
    try:
        yield
    finally:
        dace.symbolic.sympy_intdiv_fix = original


def _as_code_generation_sees_it(sdfg: dace.SDFG) -> None:
    """In place, the steps DaCe's `generate_code` takes before it emits code that add maps or set their
    schedules (connector types, default schedules, explicit copies, library expansions), so that the race
    check sees every map that will be compiled; `generate_code` repeats them and finds nothing left to do."""
    explicit = dace.config.Config.get_bool("compiler", "cpu", "explicit_copy")
    while True:  # until an expansion adds no implicit copy (`generate_code` would make it a node and expand it)
        infer_types.infer_connector_types(sdfg)
        infer_types.set_default_schedule_and_storage_types(sdfg, None)
        if explicit and InsertExplicitCopies().apply_pass(sdfg, {}) is not None:
            infer_types.infer_connector_types(sdfg)
        elif not any(isinstance(n, nd.LibraryNode) for n, _ in sdfg.all_nodes_recursive()):
            return
        sdfg.expand_library_nodes()


#: a header forced into every CUDA file of a GPU program: the 64-bit integer atomics CUDA lacks
CUDA_PRELUDE = Path(__file__).with_name("cuda_atomics.h")


def cuda_flags() -> tuple[str, ...]:
    """nvcc's flags for a GPU program's CUDA files beyond DaCe's (also those of `gpu.check_cuda_builds`)."""
    return ("-include", str(CUDA_PRELUDE))


def _for_gpu(sdfg: dace.SDFG) -> bool:
    """Whether `sdfg` was built for a GPU (`gradflow.gpu.to_gpu`): a map scheduled on one, or data on one."""
    on_gpu = (dace.StorageType.GPU_Global, dace.StorageType.GPU_Shared)
    return any(isinstance(n, nd.MapEntry) and n.map.schedule in dace.dtypes.GPU_SCHEDULES
               for n, _ in sdfg.all_nodes_recursive()) or any(d.storage in on_gpu for _, _, d in sdfg.arrays_recursive())


@contextmanager
def prepared_for_code_generation(sdfg: dace.SDFG) -> Iterator[None]:
    """`sdfg` (the caller's private copy, changed in place) as `compile_sdfg` hands it to DaCe's code
    generator, inside the contexts its code is generated in (BLAS and math declarations, expansions, the
    race check): `sdfg.compile()` or `sdfg.generate_code()` runs inside."""
    with contextlib.ExitStack() as contexts:
        # no source-line info: DaCe would inspect the stack at every node its expansions add
        contexts.enter_context(dace.config.set_temporary("compiler", "use_cache", value=False))
        contexts.enter_context(dace.config.set_temporary("compiler", "lineinfo", value="none"))
        contexts.enter_context(_integer_divisions())
        if not _for_gpu(sdfg):  # a GPU program keeps DaCe's expansions (cuBLAS, kernels), not OpenBLAS calls
            contexts.enter_context(blas.compile_context())
            contexts.enter_context(vector_math.declared(sdfg))
        else:
            args = " ".join((dace.Config.get("compiler", "cuda", "args"), *cuda_flags()))
            contexts.enter_context(dace.config.set_temporary("compiler", "cuda", "args", value=args))
        contexts.enter_context(stop_gradient.defined(sdfg))
        _as_code_generation_sees_it(sdfg)  # inside the contexts: they choose the expansions
        serialized = races.serialize_racing_sums(sdfg)  # DaCe's own check lets some parallel sums race
        if serialized:
            log.info("sequential in %s (their parallel sums could race): %s", sdfg.name, ", ".join(serialized))
        yield


def _generate_and_compile(sdfg: dace.SDFG, key: str) -> None:
    """What `SDFG.compile` does for a new build folder (`sdfg.build_folder`), done on `sdfg` itself, the
    caller's private copy, and without what gradflow never reads: DaCe's own deep copy of the SDFG, and its
    `program.sdfgz` (the SDFG serialized to JSON, hashed and gzipped: up to a second for a large gradient,
    a fifth of a small program's build). The hash that file's writing defines for the generated code
    (`include/hash.h`, which names instrumentation reports) is the build key instead."""
    from dace.codegen import codegen

    mode = dace.Config.get("compiler", "build_folder_mode")
    for _ in sdfg.all_sdfgs_recursive(load_ext=True):  # external nested SDFGs loaded, as `compile` does
        pass
    sdfg.fill_scope_connectors()
    objects = codegen.generate_code(sdfg, validate=True)
    folder = dace_compiler.generate_program_folder(None, objects, sdfg.build_folder, folder_mode=mode)
    (Path(folder) / "include").mkdir(exist_ok=True)
    (Path(folder) / "include" / "hash.h").write_text(f'#define __HASH_{sdfg.name} "{key}"\n')
    dace_compiler.configure_and_compile(folder, sdfg.name, folder_mode=mode)


def _build(sdfg: dace.SDFG, folder: Path, key: str) -> None:
    """Build `sdfg` (the caller's private copy, changed in place) in `folder`."""
    try:
        with prepared_for_code_generation(sdfg), progress.step(f"compiling SDFG '{sdfg.name}'"):
            _generate_and_compile(sdfg, key)
    except Exception as exc:  # DaCe raises several unrelated types for a failed build
        text = str(exc)
        tail = text[-2000:] if len(text) > 2000 else text
        raise CompilationError(f"building SDFG '{sdfg.name}' in {folder} failed: {type(exc).__name__}: {tail}") from exc
