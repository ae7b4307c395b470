"""Forward+backward of a 3-layer MLP (numpy in a `@dace.program`, float32): gradflow vs eager torch.autograd.

    x[64, 784] -> relu(x @ W1 + b1) -> relu(. @ W2 + b2) -> . @ W3 + b3 -> S = sum((o - T)^2)
    layer sizes 784-512-512-10, batch 64; gradients with respect to W1, b1, W2, b2, W3, b3.

gradflow: `gradflow.grad` gives one SDFG computing S and all six gradients; the three matrix products of
the forward and the five of the backward (the input x needs no gradient) are cblas_sgemm calls
(`gradflow.runtime.blas`, OpenBLAS from scipy-openblas32). It is compiled once and called with prebuilt
arguments (`CompiledSDFG.fast_call`, so the ~90 us of Python argument handling is not counted; the plain
`__call__` time is reported too).
torch: the same network with eager autograd (`loss.backward()` with zeroed `.grad`), on the same threads.

Both run in one process on the same data; gradients are checked against each other (float32, rtol 1e-3)
before timing. Figures are medians over repeats of mean per-iteration times.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mlp.py [--iters 50] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import dace
import numpy as np
import torch

import gradflow
from gradflow.core.graph import Graph
from gradflow.runtime import blas
from gradflow.runtime.compile import compile_sdfg

f32 = dace.float32
BATCH, D_IN, D_H, D_OUT = 64, 784, 512, 10
PARAMS = ("W1", "b1", "W2", "b2", "W3", "b3")


@dace.program
def mlp(x: f32[BATCH, D_IN], W1: f32[D_IN, D_H], b1: f32[D_H], W2: f32[D_H, D_H], b2: f32[D_H],
        W3: f32[D_H, D_OUT], b3: f32[D_OUT], T: f32[BATCH, D_OUT], S: f32[1]):
    h1 = np.maximum(x @ W1 + b1, 0.0)
    h2 = np.maximum(h1 @ W2 + b2, 0.0)
    o = h2 @ W3 + b3
    d = o - T
    S[0] = np.sum(d * d)


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"x": (BATCH, D_IN), "W1": (D_IN, D_H), "b1": (D_H,), "W2": (D_H, D_H), "b2": (D_H,),
              "W3": (D_H, D_OUT), "b3": (D_OUT,), "T": (BATCH, D_OUT)}
    data = {k: (rng.normal(size=s) / np.sqrt(s[0] if len(s) == 2 and k != "x" else 1)).astype(np.float32)
            for k, s in shapes.items()}
    return data


def _torch_step(t: dict[str, torch.Tensor]) -> torch.Tensor:
    for k in PARAMS:
        t[k].grad = None
    h1 = torch.relu(t["x"] @ t["W1"] + t["b1"])
    h2 = torch.relu(h1 @ t["W2"] + t["b2"])
    o = h2 @ t["W3"] + t["b3"]
    loss = ((o - t["T"]) ** 2).sum()
    loss.backward()
    return loss


def _time(fn, iters: int, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)

    start = time.perf_counter()
    sdfg = gradflow.grad(mlp, wrt=list(PARAMS), of="S")
    compiled = compile_sdfg(Graph.adopt(sdfg))
    build_s = time.perf_counter() - start

    data = _data()
    arrays = {**{k: v.copy() for k, v in data.items()}, "S": np.zeros(1, np.float32),
              **{f"grad_{k}": np.zeros_like(data[k]) for k in PARAMS}}
    compiled(**arrays)
    tensors = {k: torch.from_numpy(v.copy()).requires_grad_(k in PARAMS) for k, v in data.items()}
    loss = _torch_step(tensors)
    np.testing.assert_allclose(arrays["S"][0], loss.item(), rtol=1e-3)
    for k in PARAMS:
        np.testing.assert_allclose(arrays[f"grad_{k}"], tensors[k].grad.numpy(), rtol=1e-3, atol=1e-3,
                                   err_msg=f"gradient of {k}")

    # Prebuilt arguments for fast_call (the same buffers every iteration; S is reset by the program).
    prebuilt = compiled.construct_arguments(**arrays)
    t_fast = _time(lambda: compiled.fast_call(*prebuilt), args.iters, args.repeats)
    t_call = _time(lambda: compiled(**arrays), args.iters, args.repeats)
    t_torch = _time(lambda: _torch_step(tensors), args.iters, args.repeats)

    print(f"3-layer MLP {D_IN}-{D_H}-{D_H}-{D_OUT}, batch {BATCH}, float32, forward+backward; threads={threads}")
    print(f"BLAS: {blas.describe()}")
    print(f"gradflow build (grad + compile or cache hit): {build_s:.1f} s")
    print(f"{'route':<28}{'ms / iteration':>16}{'vs torch':>10}")
    for name, t in (("gradflow (fast_call)", t_fast), ("gradflow (CompiledSDFG())", t_call),
                    ("torch eager autograd", t_torch)):
        print(f"{name:<28}{t * 1e3:>16.3f}{t / t_torch:>10.2f}")


if __name__ == "__main__":
    main()
