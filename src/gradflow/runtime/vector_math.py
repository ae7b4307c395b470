"""Vectorized transcendentals in generated code: glibc's libmvec behind `exp`, `tanh`, `log`, ...

The C++ compiler vectorizes a loop that calls `tanhf` only if it knows a SIMD variant of `tanhf` exists.
glibc ships them (libmvec: `_ZGVeN16v_tanhf` and friends, at most 4 ulp off) and declares them in
`<math.h>` only under `-ffast-math`, which DaCe does not use (and gradflow does not want: it would
also license reassociation of every sum). Without them, every sigmoid and tanh of an LSTM step, a GELU or
a softmax is a scalar library call: torch's vectorized kernels were 3-5x faster on them.

While `runtime.compile` builds an SDFG, `declared(sdfg)` adds to its global code the OpenMP `declare
simd` redeclarations of the functions this glibc vectorizes, and `compiler_args()` raises GCC's limit
on the run-time alias checks of one loop: DaCe's parallel loops reach their arrays through OpenMP's
outlined functions, which drop `__restrict__`, and a reverse-mode loop that reads eight arrays and
accumulates into five needs more checks than the default 10 before GCC versions it for SIMD.
On a CPU with AVX-512, `compiler_args()` also asks GCC for 512-bit vectors (`-mprefer-vector-width=512`):
under `-march=native` GCC keeps to 256 bits unless told (a tuning for older Intel cores, whose clock
dropped under 512-bit instructions), so a loop of `exp` called libmvec's 4-wide `_ZGVdN4v_exp` where the
8-wide `_ZGVeN8v_exp` exists (GradBench's lse at n = 1.28 million: 1.2x the JAX tool's primal, measured
2026-12-05). `GRADFLOW_VECTOR_WIDTH=256` keeps GCC's choice.
Elsewhere (another libc, another architecture, not GCC) all this changes nothing; `tag()` names the
choice in the compile-cache key.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import shutil
import subprocess
from typing import Iterator

import dace
from dace.properties import CodeBlock

#: glibc version -> unary and binary functions with SIMD variants from that version on (x86_64 libmvec)
_UNARY = {(2, 22): ("cos", "sin", "exp", "log"),
          (2, 35): ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "cosh", "erf", "erfc", "exp10",
                    "exp2", "expm1", "log10", "log1p", "log2", "sinh", "tan", "tanh")}
_BINARY = {(2, 22): ("pow",), (2, 35): ("atan2", "hypot")}

#: GCC's default is 10 run-time alias checks per loop
_ALIAS_CHECKS = 64


def _glibc() -> tuple[int, int] | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    name, _, version = text.partition(" ")
    parts = version.split(".")
    if name != "glibc" or len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


@functools.cache
def _gcc() -> bool:
    """The C++ compiler CMake will pick (DaCe's `compiler.cpu.executable`, else `c++`) is GCC."""
    exe = dace.Config.get("compiler", "cpu", "executable") or os.environ.get("CXX") or "c++"
    path = shutil.which(exe)
    if path is None:
        return False
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


@functools.cache
def functions() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(unary, binary) C math functions whose SIMD variants generated code may call; empty where not
    x86_64 glibc with GCC."""
    version = _glibc()
    if platform.machine() != "x86_64" or version is None or not _gcc():
        return (), ()
    pick = lambda table: tuple(f for since, names in table.items() if version >= since for f in names)  # noqa: E731
    return pick(_UNARY), pick(_BINARY)


def declarations() -> str:
    """C++ redeclaring each function (double and float) with `#pragma omp declare simd notinbranch`."""
    unary, binary = functions()
    lines = ["// gradflow.runtime.vector_math: SIMD variants of these come from glibc's libmvec", "#include <cmath>",
             'extern "C" {']
    for name in unary:
        for ctype, suffix in (("double", ""), ("float", "f")):
            lines += ["#pragma omp declare simd notinbranch", f"{ctype} {name}{suffix}({ctype}) noexcept;"]
    for name in binary:
        for ctype, suffix in (("double", ""), ("float", "f")):
            lines += ["#pragma omp declare simd notinbranch", f"{ctype} {name}{suffix}({ctype}, {ctype}) noexcept;"]
    return "\n".join(lines + ["}", ""])


def enabled() -> bool:
    return bool(functions()[0])


@functools.cache
def _avx512() -> bool:
    """This CPU has AVX-512 (the `avx512f` flag of /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def wide_vectors() -> bool:
    """Whether builds ask GCC for 512-bit vectors (module doc)."""
    return enabled() and _avx512() and os.environ.get("GRADFLOW_VECTOR_WIDTH", "512") != "256"


def tag() -> str:
    """Part of the compile-cache key: builds with and without the declarations differ."""
    if not enabled():
        return "scalar"
    return f"mvec{_ALIAS_CHECKS}{'w512' if wide_vectors() else ''}:" + ",".join(functions()[0] + functions()[1])


def compiler_args() -> str:
    """DaCe's C++ flags for a build, with the larger alias-check budget where the declarations apply (and
    512-bit vectors where `wide_vectors`)."""
    args = dace.Config.get("compiler", "cpu", "args")
    if not enabled():
        return args
    wide = " -mprefer-vector-width=512" if wide_vectors() else ""
    return f"{args} --param vect-max-version-for-alias-checks={_ALIAS_CHECKS}{wide}"


@contextlib.contextmanager
def declared(sdfg: dace.SDFG) -> Iterator[None]:
    """While active, `sdfg`'s frame code starts with `declarations()` (restored after: the SDFG may belong
    to an immutable Graph) and DaCe builds with `compiler_args()`."""
    if not enabled():
        yield
        return
    saved = dict(sdfg.global_code)
    frame = saved.get("frame")
    text = declarations() + (frame.as_string if frame is not None else "")
    sdfg.global_code = {**saved, "frame": CodeBlock(text, dace.dtypes.Language.CPP)}
    try:
        with dace.config.set_temporary("compiler", "cpu", "args", value=compiler_args()):
            yield
    finally:
        sdfg.global_code = saved
