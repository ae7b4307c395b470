#!/usr/bin/env python3
"""gradflow's convolution kernels against torch's convolution through them, shape by shape, in one process.

    OMP_NUM_THREADS=1 python benchmarks/conv_route.py [--repeats 5] [--out FILE]

Each shape's forward, input gradient and weight gradient (float32, NCHW, the input already padded) are
timed through `runtime/conv_kernels.h` compiled as DaCe compiles programs (-O3 -march=native), with
torch's convolution loaded (`gradflow.torch.convolution.load()`) and its mode switched call by call
(`set_mode`): "own", the kernels' unfolding and products; "torch", torch's convolution. Then "auto"
(GRADFLOW_CONV's default) after `forget_routes()`: its first call times both routes per operation, and
the table shows what it chose (forward, input gradient, weight gradient: t torch, o own) and its time
from then on. The shapes are the convolutions of `benchmarks/models.py`'s ResNet block (batch 32) and
ResNet-18 (batch 64). Times: the fastest of `--repeats` calls of all three (each after a warm-up call).
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gradflow.runtime import blas  # noqa: E402
from gradflow.torch import convolution  # noqa: E402

_SOURCE = r"""
#include "gradflow_cblas.h"
extern "C" void step(const long* d, const float* x, const float* w, const float* dy, float* y, float* dx, float* dw) {
    gradflow_conv::Shape s{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], 0};
    gradflow_conv::forward(s, x, w, y);
    gradflow_conv::grad_input(s, dy, w, dx);
    gradflow_conv::grad_weights(s, x, dy, dw);
}
"""

#: (name, N, C, padded H = W, M, K, stride)
SHAPES = [
    ("resnet_block stem", 32, 3, 18, 16, 3, 1),
    ("resnet_block body", 32, 16, 18, 16, 3, 1),
    ("resnet18 stem", 64, 3, 34, 64, 3, 1),
    ("resnet18 layer1", 64, 64, 34, 64, 3, 1),
    ("resnet18 layer2 down", 64, 64, 34, 128, 3, 2),
    ("resnet18 layer2", 64, 128, 18, 128, 3, 1),
    ("resnet18 layer2 1x1", 64, 64, 32, 128, 1, 2),
    ("resnet18 layer3", 64, 256, 10, 256, 3, 1),
    ("resnet18 layer4", 64, 512, 6, 512, 3, 1),
]


def _probe(folder: Path) -> ctypes.CDLL:
    (folder / "probe.cpp").write_text(_SOURCE)
    lib = Path(blas.library_path())
    subprocess.run(["g++", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(folder / "probe.so"),
                    str(folder / "probe.cpp"), f"-I{blas._wheel().get_include_dir()}", f"-I{blas._shim_dir()}",
                    str(lib), f"-Wl,-rpath,{lib.parent}"], check=True, capture_output=True)
    blas.one_thread()
    return ctypes.CDLL(str(folder / "probe.so"))


def _operands(n, c, h, m, k, stride):
    o = (h - k) // stride + 1
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((n, c, h, h), np.float32), rng.standard_normal((m, c, k, k), np.float32)
    dy = rng.standard_normal((n, m, o, o), np.float32)
    out = [np.zeros((n, m, o, o), np.float32), np.zeros_like(x), np.zeros_like(w)]
    dims = np.array([n, c, h, h, m, k, k, o, o, stride, stride, 1, 1], np.int64)
    return dims, [x, w, dy, *out]


def _time(step, dims, arrays, repeats: int) -> float:
    ptrs = [a.ctypes.data_as(ctypes.c_void_p) for a in (dims, *arrays)]
    step(*ptrs)  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step(*ptrs)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        step = _probe(Path(tmp)).step
        convolution.load()
        for _, dims, arrays in [(name, *_operands(*shape)) for name, *shape in SHAPES]:
            best = {"own": float("inf"), "torch": float("inf")}
            for _ in range(args.repeats):  # the routes interleaved: the machine drifts between calls alike
                for mode in best:
                    convolution.set_mode(mode)
                    best[mode] = min(best[mode], _time(step, dims, arrays, 1))
            convolution.set_mode("auto")
            convolution.forget_routes()
            best["auto"] = _time(step, dims, arrays, args.repeats)  # its warm-up call decides
            chose = {r["operation"]: "t" if r["torch"] else "o" for r in convolution.routes()}
            rows.append((best, "".join(chose.get(op, "-") for op in convolution.OPERATIONS)))
    lines = ["| convolution | N, C -> M, padded HxW, KxK, stride | own ms | torch ms | torch / own | auto chose "
             "| auto ms | auto / own |", "|---|---|---:|---:|---:|---|---:|---:|"]
    for (name, *shape), (best, chose) in zip(SHAPES, rows):
        n, c, h, m, k, s = shape
        lines.append(f"| {name} | {n}, {c} -> {m}, {h}x{h}, {k}x{k}, {s} | {best['own']:.3f} | "
                     f"{best['torch']:.3f} | {best['torch'] / best['own']:.2f} | {chose} | {best['auto']:.3f} | "
                     f"{best['auto'] / best['own']:.2f} |")
    text = "\n".join(lines) + f"\n\ntorch {torch.__version__}; `{_cpu()}`\n"
    print(text)
    if args.out:
        args.out.write_text(text)


def _cpu() -> str:
    """The CPU's model name and whether it has AVX-512 (which oneDNN's kernels use)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    return f"{model}, {'AVX-512' if ' avx512f' in info else 'no AVX-512'}"


if __name__ == "__main__":
    main()
