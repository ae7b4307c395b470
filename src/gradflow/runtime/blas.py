"""A real BLAS for the matrix products of compiled SDFGs (OpenBLAS from the `scipy-openblas32` wheel).

DaCe expands its BLAS library nodes (`Gemm`, `Gemv`, `Dot`, `BatchedMatMul`, ...) at compile time with
the implementation named by the config key `library.blas.default_implementation` (`"pure"`: a loop nest).
Its own `OpenBLAS` environment finds the library through CMake's FindBLAS, which needs a system OpenBLAS.
gradflow brings its own instead: the `scipy-openblas32` wheel (a pip dependency) ships `libscipy_openblas.so`
and headers whose CBLAS functions carry a `scipy_` prefix (`scipy_cblas_dgemm`).

This module, when that wheel is importable:
- writes a shim header `gradflow_cblas.h` (in the gradflow cache) that includes the wheel's `cblas.h` and
  maps every `cblas_X` DaCe emits onto `scipy_cblas_X`;
- registers the DaCe environment `GradflowOpenBLAS` (include paths, the library, an rpath) and, for every
  node of DaCe's BLAS library, an implementation named `IMPLEMENTATION` that emits the same CBLAS calls as
  DaCe's OpenBLAS expansion but links against that environment (nodes without a BLAS call get their pure
  expansion under that name, so that it can be the library default), and for gradflow's own convolution
  nodes (`gradflow.library.convolution`) one call into `conv_kernels.h` (the library stays below the
  runtime: the expansion that links this environment is defined here);
- `compile_context()` makes that implementation the default only while `runtime.compile` builds an SDFG.
  Reverse mode itself always sees the default (`pure`) expansion, so expanding a node to differentiate its
  maps is unaffected.

Without the wheel, `available()` is False, `compile_context()` changes nothing and DaCe's pure expansion
(a loop nest) runs; `describe()` says so.

Matrix products (`?gemm`, also inside the convolution kernels) run through `team_gemm.h`. Where torch's
library carries MKL (x86 wheels) it times MKL and OpenBLAS at the first product of each shape and keeps
the faster (`GRADFLOW_BLAS=auto`, the default: MKL was about 1.4x OpenBLAS's speed on the products of the
models of `benchmarks/models.py` on one host, OpenBLAS 1.1-1.2x MKL's on an AVX-512 AMD one);
`GRADFLOW_BLAS=mkl` or `openblas` pins one, and without MKL OpenBLAS runs them. `gemm_library()` says which.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import re
from pathlib import Path

import dace
from dace.sdfg import nodes as nd
from dace.transformation.transformation import ExpandTransformation

from gradflow.core.environment import env_choice
from gradflow.library import convolution
from gradflow.runtime.cache import cache_root

IMPLEMENTATION = "gradflow_blas"
SHIM_HEADER = "gradflow_cblas.h"


@functools.cache
def _wheel():
    try:
        import scipy_openblas32  # noqa: F401
    except ImportError:
        return None
    return scipy_openblas32


def library_path() -> str | None:
    """The shared library gradflow links generated code against, or None."""
    wheel = _wheel()
    if wheel is None:
        return None
    path = Path(wheel.get_lib_dir()) / f"lib{wheel.get_library()}.so"
    return str(path) if path.is_file() else None


def available() -> bool:
    return library_path() is not None


def describe() -> str:
    if not available():
        return "no BLAS (scipy-openblas32 not installed): matrix products use DaCe's pure loop-nest expansion"
    text = f"OpenBLAS from scipy-openblas32 ({library_path()})"
    library = gemm_library()
    if library == "auto":
        return text + "; matrix products by torch's MKL or OpenBLAS, whichever measured faster per shape"
    return text + ("; matrix products by torch's MKL" if library == "mkl" else "")


#: the values of GRADFLOW_BLAS (read by `team_gemm.h` at a program's first matrix product)
BLAS_CHOICES = ("auto", "mkl", "openblas")


def blas_choice() -> str:
    """GRADFLOW_BLAS (default "auto"); an unknown value is an `InvalidArgumentError`. Cheap: `compile_sdfg`
    checks it at every call, so a misspelt value fails there, not silently in the generated code."""
    return env_choice("GRADFLOW_BLAS", BLAS_CHOICES, "auto")


def gemm_library() -> str:
    """Which library the matrix products of programs loaded now run on, as `team_gemm.h` decides it:
    "mkl", "openblas", or "auto" (each shape on the one measured faster; products inside a parallel region
    on MKL). An unknown GRADFLOW_BLAS is an `InvalidArgumentError`."""
    choice = blas_choice()
    if choice == "openblas" or not available():
        return "openblas"
    one_thread()  # as compile_sdfg does before any program runs
    if _openblas_threads() != 1 or not _torch_mkl():
        return "openblas"
    return choice


def _openblas_threads() -> int:
    return int(ctypes.CDLL(library_path()).scipy_openblas_get_num_threads())


@functools.cache
def _torch_mkl() -> bool:
    """Whether torch's libtorch_cpu.so exports the MKL entry points `team_gemm.h` looks up."""
    import torch  # gradflow.runtime.calling has imported it already

    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return False
    return all(hasattr(lib, name) for name in ("sgemm_", "dgemm_", "MKL_Set_Num_Threads_Local"))


# products that `team_gemm.h` shares out over the OpenMP team (see there)
_TEAM = {"cblas_sgemm": "gradflow_team_sgemm", "cblas_dgemm": "gradflow_team_dgemm"}


def _shim_text(cblas_header: Path) -> str:
    names = sorted(set(re.findall(r"\bscipy_(cblas_\w+)\s*\(", cblas_header.read_text())))
    lines = [
        "// Generated by gradflow.runtime.blas: DaCe emits cblas_X, the scipy-openblas32 wheel exports scipy_cblas_X.",
        "#pragma once",
        '#include "cblas.h"',
        (Path(__file__).parent / "team_gemm.h").read_text(),
    ]
    lines += [f"#define {n} {_TEAM.get(n, 'scipy_' + n)}" for n in names]
    lines.append((Path(__file__).parent / "conv_kernels.h").read_text())  # calls cblas_?gemm as mapped above
    return "\n".join(lines) + "\n"


@functools.cache
def _shim() -> tuple[str, str]:
    """The shim header's text and its content hash."""
    text = _shim_text(Path(_wheel().get_include_dir()) / "cblas.h")
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def _shim_dir() -> str:
    text, digest = _shim()
    folder = cache_root() / "blas" / digest
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / SHIM_HEADER
    if not target.is_file() or target.read_text() != text:
        tmp = folder / f".{SHIM_HEADER}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, target)  # atomic: parallel processes write identical content
    return str(folder)


def _dace_blas_header() -> str:
    import dace.libraries.blas as blas_lib

    return str(Path(blas_lib.__file__).parent / "include" / "dace_blas.h")


@dace.library.environment
class GradflowOpenBLAS:
    """OpenBLAS from the scipy-openblas32 wheel (see the module docstring)."""

    cmake_minimum_version = None
    cmake_packages = []
    cmake_variables = {}
    cmake_compile_flags = []
    cmake_files = []
    state_fields = []
    init_code = ""
    finalize_code = ""
    dependencies = []

    @staticmethod
    def cmake_includes():
        return [_wheel().get_include_dir(), _shim_dir()]

    @staticmethod
    def cmake_libraries():
        return [library_path()]

    @staticmethod
    def cmake_link_flags():
        return [f"-Wl,-rpath,{_wheel().get_lib_dir()}"]

    headers = [SHIM_HEADER, _dace_blas_header()]  # DaCe's code generator reads this as a plain list

    @staticmethod
    def is_installed():
        return available()


def _cpp_integer(expr) -> bool:
    """Whether `str(expr)`, pasted into C++, computes `expr` on integers: a polynomial in the symbols with
    integer coefficients. DaCe's CBLAS expansions format sizes and strides with `str` (not its C++ printer),
    so `ceiling(M/3)`, the length of `x[::3]`, became `ceiling(M/3)` in C++: M/3 in integer division,
    rounded down, and a product over too few elements (a wrong value, no error)."""
    import sympy

    expr = dace.symbolic.pystr_to_symbolic(str(expr)) if not isinstance(expr, sympy.Basic) else expr
    if expr.is_Integer or expr.is_Symbol:
        return True
    symbols = sorted(expr.free_symbols, key=str)
    if not symbols:
        return bool(expr.is_Integer)
    try:
        return all(c.is_Integer for c in sympy.Poly(expr, *symbols).coeffs())
    except sympy.PolynomialError:
        return False


def _sizes_print_wrong(node, state, sdfg) -> bool:
    """Whether a shape, stride or extent of `node`'s operands is not `_cpp_integer`."""
    for edge in [*state.in_edges(node), *state.out_edges(node)]:
        if edge.data.data is None:
            continue
        desc = sdfg.arrays[edge.data.data]
        exprs = [*desc.shape, *desc.strides, *edge.data.subset.size()]
        if not all(_cpp_integer(e) for e in exprs):
            return True
    return False


def _delegating(base, environments, fallback=None, use_fallback=None):
    """An expansion that emits what `base` emits, with `environments` as its link requirements; nodes
    for which `use_fallback(node, state, sdfg)` holds get `fallback`'s expansion instead."""

    def expansion(node, state, sdfg, *args, **kwargs):
        chosen = fallback if use_fallback is not None and use_fallback(node, state, sdfg) else base
        return chosen.expansion(node, state, sdfg, *args, **kwargs)

    body = {"environments": list(environments), "expansion": staticmethod(expansion)}
    cls = type(f"Gradflow{base.__name__}", (dace.transformation.transformation.ExpandTransformation,), body)
    return dace.library.expansion(cls)


# --- gradflow's convolution nodes: one call into conv_kernels.h ----------------------------------------------

#: the kernel of each node class; its arguments are the node's connectors, inputs then output
_CONV_KERNEL = {"Convolution": "forward", "ConvolutionGradInput": "grad_input",
                "ConvolutionGradWeights": "grad_weights"}


def _conv_call(node, state, sdfg) -> str:
    """The C++ statement calling the node's kernel of `conv_kernels.h` (included by the shim header)."""
    from dace.codegen.common import sym2cpp

    s = convolution.shape_of(node, state)
    sh, sw = node.strides
    dh, dw = node.dilations
    dims = [s[k] for k in ("N", "C", "H", "W", "M", "KH", "KW", "OH", "OW")] + [sh, sw, dh, dw,
                                                                                int(node.layout == "NHWC"),
                                                                                *node.pads]
    shape = ", ".join(f"(long)({sym2cpp(d)})" for d in dims)
    ins, out = convolution.CONNECTORS[type(node).__name__]
    return (f"gradflow_conv::{_CONV_KERNEL[type(node).__name__]}(gradflow_conv::Shape{{{shape}}}, "
            f"{', '.join((*ins, out))});")


@dace.library.expansion
class ExpandConvolutionBLAS(ExpandTransformation):
    """`IMPLEMENTATION` of gradflow's convolution nodes: a C++ tasklet calling `conv_kernels.h` when the
    kernels can take the operands (`convolution.blas_ready`, `convolution.symbols_declared`), else the
    node's pure expansion (map nests)."""

    environments = [GradflowOpenBLAS]

    @staticmethod
    def expansion(node, state, sdfg, **kwargs):
        if not convolution.blas_ready(node, state, sdfg) or not convolution.symbols_declared(node, state):
            return convolution.ExpandPure.expansion(node, state, sdfg)
        ins, out = convolution.CONNECTORS[type(node).__name__]
        return nd.Tasklet(node.label, {c: None for c in ins}, {out: None}, _conv_call(node, state, sdfg),
                          language=dace.dtypes.Language.CPP)


@functools.cache
def _register() -> bool:
    """Register `IMPLEMENTATION` on every node of DaCe's BLAS library (once per process)."""
    if not available():
        return False
    from dace.libraries.blas import nodes as blas_nodes

    with_blas = {
        blas_nodes.Gemm: blas_nodes.gemm.ExpandGemmOpenBLAS,
        blas_nodes.Gemv: blas_nodes.gemv.ExpandGemvOpenBLAS,
        blas_nodes.Dot: blas_nodes.dot.ExpandDotOpenBLAS,
        blas_nodes.BatchedMatMul: blas_nodes.batched_matmul.ExpandBatchedMatMulOpenBLAS,
    }
    import dace.libraries.blas as blas_lib

    # DaCe's CBLAS expansion of a Gemm that reads C through its `_c` input (a Gemv: y through `_y`) declares
    # it twice and does not compile; such nodes (beta * C_in terms) get the pure expansion, as do nodes
    # whose sizes that expansion would print wrongly (`_cpp_integer`).
    reads_output = {blas_nodes.Gemm: "_c", blas_nodes.Gemv: "_y"}

    def pure_for(node_cls):
        def use(node, state, sdfg) -> bool:
            return reads_output.get(node_cls) in node.in_connectors or _sizes_print_wrong(node, state, sdfg)
        return use

    for node_cls in blas_lib._dace_library_nodes:
        if IMPLEMENTATION in node_cls.implementations:
            continue
        if node_cls in with_blas:
            node_cls.register_implementation(IMPLEMENTATION, _delegating(
                with_blas[node_cls], [GradflowOpenBLAS], node_cls.implementations["pure"], pure_for(node_cls)))
        elif "pure" in node_cls.implementations:
            node_cls.register_implementation(IMPLEMENTATION, _delegating(node_cls.implementations["pure"], []))
    for node_cls in convolution.NODES:
        if IMPLEMENTATION not in node_cls.implementations:
            node_cls.register_implementation(IMPLEMENTATION, ExpandConvolutionBLAS)
    return True


@functools.cache
def one_thread() -> bool:
    """Make the wheel's OpenBLAS run its calls on the calling thread (once per process), unless the user
    chose a count with `OPENBLAS_NUM_THREADS`. gradflow parallelizes its maps with OpenMP, and torch has a
    pool of its own; OpenBLAS's worker threads spin-wait between calls on the same cores, which starved
    the others (an MLP's forward+backward at 2 threads: 32 ms with OpenBLAS's pool, 1.1 ms without).
    Returns whether the count was set."""
    path = library_path()
    if path is None or "OPENBLAS_NUM_THREADS" in os.environ:
        return False
    ctypes.CDLL(path).scipy_openblas_set_num_threads(ctypes.c_int(1))
    return True


def tag() -> str:
    """A short text naming the BLAS in use and the shim generated code includes (part of the compile-cache
    key: a build made with another shim is another build)."""
    path = library_path()
    return f"{IMPLEMENTATION}:{path}:{_shim()[1]}" if path else "pure"


@contextlib.contextmanager
def compile_context():
    """While active, DaCe expands BLAS library nodes into calls of the wheel's OpenBLAS (if installed)."""
    if not _register():
        yield False
        return
    nodes = convolution.NODES
    saved = [cls.default_implementation for cls in nodes]
    try:
        for cls in nodes:  # gradflow's own nodes are in no DaCe library: their class default is switched
            cls.default_implementation = IMPLEMENTATION
        with dace.config.set_temporary("library", "blas", "default_implementation", value=IMPLEMENTATION):
            yield True
    finally:
        for cls, implementation in zip(nodes, saved):
            cls.default_implementation = implementation
