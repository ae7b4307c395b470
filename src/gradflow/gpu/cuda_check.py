"""A compile-only check of the code DaCe generates for GPU programs: nothing runs, no GPU is needed.

Each program's CUDA file (its kernels and their launches) and host file (the program's control flow,
allocations and copies) are generated as `compile_sdfg` would (its expansions and race check first), then
compiled with `nvcc -c`. Compiling a file costs `nvcc` 10-15 s, nearly all of it in DaCe's runtime
headers and CUB, whatever the program: so the
programs are compiled together, two translation units in all (every device file, every host file), each
program's code in a namespace of its own, its C linkage dropped (names DaCe gives every program, such as
`__dace_init_cuda`, would clash) and the `#include`s it names hoisted. An error is attributed to the
program whose lines hold it; that program fails with the compiler's words and the others are compiled
again without it.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

import attrs
import dace

from gradflow.core.errors import CompilationError
from gradflow.core.graph import Graph
from gradflow.gpu.toolkit import CudaToolkit, find_toolkit
from gradflow.runtime.compile import cuda_flags, prepared_for_code_generation

#: nvcc's flags besides the architecture: DaCe's own (C++20, `--expt-relaxed-constexpr`, `WITH_CUDA`, which its
#: CMake file sets for every file of a GPU build), OpenMP for host code that has `#pragma omp`, no
#: warnings (DaCe's headers have many that say nothing about the program)
FLAGS = ("-std=c++20", "--expt-relaxed-constexpr", "-Xcompiler", "-fopenmp,-fPIC", "-w", "-DWITH_CUDA")


@attrs.frozen
class CudaBuild:
    """The check's verdict on one program: `stage` is "ok", "codegen" (DaCe could not generate its code)
    or "nvcc" (its code does not compile); `error` the first lines of what failed."""

    name: str
    stage: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.stage == "ok"


@attrs.frozen
class _Code:
    name: str
    sdfg_name: str
    device: str
    host: str


_INCLUDE = re.compile(r'^\s*#include\s*(<[^>]+>|"[^"]+")\s*$', re.MULTILINE)


def _generate(name: str, graph: Graph) -> _Code:
    sdfg = graph.to_sdfg()
    device, host = [], []
    with prepared_for_code_generation(sdfg):  # what `compile_sdfg` does first: expansions, the race check
        objects = sdfg.generate_code()
    for obj in objects:
        if obj.language == "cu":
            device.append(obj.clean_code)
        elif obj.language == "cpp" and obj.target.target_name == "cpu" and obj.name == sdfg.name:
            host.append(obj.clean_code)
    return _Code(name, sdfg.name, "\n".join(device), "\n".join(host))


def _unit(codes: list[_Code], part: str) -> tuple[str, list[tuple[int, int, str]]]:
    """One translation unit of every program's `part` ("device" or "host"), and each program's lines."""
    includes: dict[str, None] = {"<cuda_runtime.h>": None, "<dace/dace.h>": None}
    bodies = []
    for k, code in enumerate(codes):
        text = getattr(code, part)
        for found in _INCLUDE.findall(text):
            if found.startswith("<"):
                includes.setdefault(found, None)
        bodies.append((k, code, _INCLUDE.sub("", text)))
    lines = [f"#include {i}" for i in includes] + ["#undef DACE_EXPORTED", "#define DACE_EXPORTED"]
    spans = []
    for k, code, body in bodies:
        lines.append(f'#define __HASH_{code.sdfg_name} "gradflow-cuda-check"')
        start = len(lines) + 1
        lines.append(f"namespace gradflow_{part}_{k} {{  // {code.name}")
        lines.extend(body.splitlines())
        lines.append("}")
        spans.append((start, len(lines), code.name))
    return "\n".join(lines) + "\n", spans


#: an error as nvcc's front end (`file(12): error`) and as the host compiler (`file:12:5: error`) report it
_ERROR = re.compile(r"^(.*?)(?:\((\d+)\)|:(\d+):\d+): (?:catastrophic |fatal )?error")
#: where a template met in a header was instantiated: after the error (nvcc), or before it (gcc)
_AFTER = re.compile(r"at line (\d+) of (\S+)")
_BEFORE = re.compile(r"^(\S+?):(\d+):\d+:\s+required from")


def _compile(toolkit: CudaToolkit, source: Path, arch: str, part: str) -> tuple[bool, str]:
    # host code is C++ for the host compiler, as DaCe's build compiles it (nvcc passes it on with CUDA's
    # include folders); CUDA code starts with what a GPU build forces into it (`compile.cuda_flags`)
    part_flags = ["-x", "c++"] if part == "host" else list(cuda_flags())
    command = [str(toolkit.nvcc), "-c", *part_flags, f"-arch=sm_{arch}", *FLAGS, "-I", str(_dace_includes()),
               "-o", str(source.with_suffix(".o")), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    return done.returncode == 0, done.stdout + done.stderr


def _dace_includes() -> Path:
    return Path(dace.__file__).parent / "runtime" / "include"


def _line_in(source: Path, line: str) -> int | None:
    """The line of `source` an error line names, if it names `source`."""
    found = _ERROR.search(line)
    if found and Path(found.group(1)).name == source.name:
        return int(found.group(2) or found.group(3))
    return None


def _blame(output: str, source: Path, spans: list[tuple[int, int, str]]) -> dict[str, list[str]]:
    """The errors of `output` by the program whose lines hold them: the error's own line when it is in
    `source`, else (an error in a header, met while instantiating a template) the line of `source` that
    instantiated it, from the context the compiler gives. Errors it cannot place are kept under ""."""
    lines = output.splitlines()
    blamed: dict[str, list[str]] = {}
    for k, line in enumerate(lines):
        if not _ERROR.search(line):
            continue
        number = _line_in(source, line)
        for context in lines[k + 1:k + 40] if number is None else ():
            if _ERROR.search(context):
                break
            at = _AFTER.search(context)
            if at and Path(at.group(2)).name == source.name:
                number = int(at.group(1))
        for context in reversed(lines[max(0, k - 40):k]) if number is None else ():
            if _ERROR.search(context):
                break
            at = _BEFORE.search(context)
            if at and Path(at.group(1)).name == source.name:
                number = int(at.group(2))
                break
        owner = next((name for start, end, name in spans if number is not None and start <= number <= end), "")
        blamed.setdefault(owner, []).append(line.strip())
    return blamed


def check_cuda_builds(programs: Mapping[str, Graph], arch: str = "90", toolkit: CudaToolkit | None = None,
                      folder: Path | None = None) -> dict[str, CudaBuild]:
    """Generate and compile (`nvcc -c`, for `sm_<arch>`) the CUDA and host code of `programs` (name ->
    graph built for the GPU, e.g. through `OPTIMIZE_GPU`); the verdict by name (module doc)."""
    toolkit = toolkit or find_toolkit()
    folder = Path(folder or tempfile.mkdtemp(prefix="gradflow-cuda-check-"))
    verdicts: dict[str, CudaBuild] = {}
    codes = []
    for name, graph in programs.items():
        try:
            codes.append(_generate(name, graph))
        except Exception as exc:  # DaCe's code generator refused the program: that program's verdict
            first = str(exc).splitlines()[0] if str(exc) else ""
            verdicts[name] = CudaBuild(name, "codegen", f"{type(exc).__name__}: {first}")
    for part in ("device", "host"):
        pending = [c for c in codes if c.name not in verdicts]
        while pending:
            text, spans = _unit(pending, part)
            source = folder / f"gradflow_check_{part}.{'cu' if part == 'device' else 'cpp'}"
            source.write_text(text)
            ok, output = _compile(toolkit, source, arch, part)
            if ok:
                break
            blamed = _blame(output, source, spans)
            culprits = [name for name in blamed if name]
            if not culprits:  # an error outside every program's lines (the toolkit or DaCe's headers)
                raise CompilationError(f"nvcc failed on the {part} code outside any program:\n{output[-3000:]}",
                                       f"compile {source} by hand to see the whole output")
            for name in culprits:
                verdicts[name] = CudaBuild(name, "nvcc", f"{part} code: " + "; ".join(blamed[name][:3]))
            pending = [c for c in pending if c.name not in verdicts]
    for code in codes:
        verdicts.setdefault(code.name, CudaBuild(code.name, "ok"))
    return {name: verdicts[name] for name in programs}
