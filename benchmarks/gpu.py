"""GPU check (issue 35), prepared for a session lent an NVIDIA GPU: every loop and dataflow corpus
program's gradient built with `OPTIMIZE_GPU` against the same gradient on the CPU, then the time of a few
gradients against eager torch on the same GPU.

The device machine has no DaCe and no network: the wheels travel (`benchmarks/gpu_wheels.sh` fetches them
into `.whl/`, which git ignores). One `run` of the device tool, `carry=[".whl"]`, `timeout_s=540`:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
        .whl/*.whl && export PYTHONPATH=/tmp/site:src && PYTHONUNBUFFERED=1 \\
        python3 benchmarks/gpu.py --jobs 15 --deadline 480 --out $OUT/gpu.md

Stage 1 builds and compiles on all cores at once (a worker process per program: DaCe's CUDA build is 10-20
s of nvcc per program), runs each program on the CPU (`optimize=False`) and on the GPU, and compares the
gradients (float64, relative 1e-10 of the largest gradient element). Stage 2 times gradients at larger sizes.
Whatever finished by `--deadline` seconds is written; a program not done is listed as such.

Without a GPU, `--dry-run` does stage 1's builds and compiles the CUDA code with
`gradflow.gpu.check_cuda_builds` instead of running it (what CI's test does, for this script's programs).
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

os.environ.setdefault("OMP_NUM_THREADS", "1")

TOLERANCE = 1e-10
#: the benchmark kernels (`benchmarks/kernelbench/specs.py` keys) stage 2 times: issue 35's table
TIMED = ("lp_jacobi_1d@N=4000,T=50", "lp_softmax@N=256,M=512", "lp_go_fast", "mlp")


def _cases():
    """The loop and dataflow corpora (the library-node corpus, `LibCase`, has another interface)."""
    from gradflow.verify.corpus import dataflow, loops

    return {c.name: c for c in (*loops.CASES, *dataflow.CASES)}


def _forwarding(case):
    from gradflow.autodiff.forwarding import STORE_ALL

    forwarding = case.forwarding or STORE_ALL
    # an unbounded while loop keeps a growable tape, which `to_gpu` refuses: bound every loop
    return forwarding.with_loop_bounds(**{"*": 64, **dict(case.loop_bounds)})


def _arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def _configure(arch: str, folder: str) -> None:
    import dace

    dace.config.Config.set("compiler", "cuda", "cuda_arch", value=arch)
    dace.config.Config.set("default_build_folder", value=folder)


def check_one(name: str, arch: str, folder: str) -> dict:
    """Stage 1 for one program, in a worker process: CPU and GPU gradients on the same inputs."""
    import numpy as np

    from gradflow.gpu import OPTIMIZE_GPU
    from gradflow.verify.routes import gradient

    _configure(arch, folder)
    case = _cases()[name]
    start = time.perf_counter()
    try:
        inputs = case.inputs(seed=0)
        _, cpu = gradient(case.program, case.wrt, case.of, inputs, case.symbols, forwarding=_forwarding(case),
                          optimize=False)
        _, gpu = gradient(case.program, case.wrt, case.of, inputs, case.symbols, forwarding=_forwarding(case),
                          optimize=OPTIMIZE_GPU)
    except Exception as exc:
        return {"name": name, "verdict": "error", "detail": f"{type(exc).__name__}: {str(exc)[:300]}",
                "tail": traceback.format_exc()[-1200:], "seconds": time.perf_counter() - start}
    worst = 0.0
    for x in case.wrt:
        scale = max(float(np.max(np.abs(cpu[x]), initial=0.0)), 1e-300)
        worst = max(worst, float(np.max(np.abs(np.asarray(gpu[x]) - cpu[x]), initial=0.0)) / scale)
    verdict = "ok" if worst <= TOLERANCE else "WRONG"
    return {"name": name, "verdict": verdict, "detail": f"largest relative difference {worst:.1e}",
            "seconds": time.perf_counter() - start}


def time_one(key: str, arch: str, folder: str, calls: int = 20) -> dict:
    """Stage 2 for one benchmark kernel (`benchmarks/kernelbench/specs.py`, by key): median ms of a gradflow
    GPU gradient (arrays copied in and out per call) and of eager torch on CUDA (tensors resident)."""
    import numpy as np
    import torch

    import gradflow
    from benchmarks.kernelbench.specs import by_key
    from gradflow.gpu import OPTIMIZE_GPU

    _configure(arch, folder)
    bench = by_key()[key]
    case = bench.case
    try:
        inputs = bench.inputs(case.program.to_sdfg(simplify=False))
        f = gradflow.value_and_grad(case.program, wrt=list(case.wrt), of=case.of, forwarding=_forwarding(case),
                                    optimize=OPTIMIZE_GPU)
        symbols = {k: v for k, v in bench.symbols.items() if k not in inputs}
        ours = []
        for _ in range(calls + 1):
            arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
            begin = time.perf_counter()
            f(**arrays, **symbols)
            ours.append(time.perf_counter() - begin)
        reference = bench.torch_fn()
        tensors = {k: torch.tensor(v, device="cuda", requires_grad=k in case.wrt) for k, v in inputs.items()}
        theirs = []
        for _ in range(calls + 3):
            torch.cuda.synchronize()
            begin = time.perf_counter()
            value = reference(**tensors)
            torch.autograd.grad(value.reshape(()), [tensors[x] for x in case.wrt], allow_unused=True)
            torch.cuda.synchronize()
            theirs.append(time.perf_counter() - begin)
    except Exception as exc:
        return {"name": key, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"name": key, "gradflow_ms": 1e3 * float(np.median(ours[1:])),
            "torch_ms": 1e3 * float(np.median(theirs[3:]))}


def dry_run(names: list[str]) -> int:
    from gradflow.api import grad_graph
    from gradflow.gpu import OPTIMIZE_GPU, check_cuda_builds

    cases = _cases()
    graphs = {n: grad_graph(cases[n].program, list(cases[n].wrt), cases[n].of, forwarding=_forwarding(cases[n]),
                            optimize=OPTIMIZE_GPU) for n in names}
    verdicts = check_cuda_builds(graphs)
    for name, verdict in verdicts.items():
        print(f"{name}: {verdict.stage} {verdict.error}")
    return sum(not v.ok for v in verdicts.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--only", default="", help="comma-separated corpus case names (default: all)")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds after which nothing new starts")
    parser.add_argument("--out", default="gpu.md")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: compile the CUDA code only")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or sorted(_cases())
    if args.dry_run:
        return 1 if dry_run(names) else 0
    start = time.monotonic()
    arch = _arch()
    folder = str(pathlib.Path(args.out).resolve().parent / "build")
    rows, timed = [], []
    with futures.ProcessPoolExecutor(args.jobs) as pool:
        pending = {pool.submit(check_one, n, arch, folder): n for n in names}
        for done in futures.as_completed(pending, timeout=args.deadline):
            rows.append(done.result())
            print(rows[-1]["name"], rows[-1]["verdict"], rows[-1]["detail"], flush=True)
        left = args.deadline - (time.monotonic() - start)
        jobs = [pool.submit(time_one, key, arch, folder) for key in TIMED if left > 60]
        try:
            for done in futures.as_completed(jobs, timeout=max(left, 1)):
                timed.append(done.result())
        except futures.TimeoutError:
            pass
        pool.shutdown(wait=False, cancel_futures=True)
    _write(args.out, arch, names, rows, timed)
    return 0


def _write(out: str, arch: str, names: list[str], rows: list[dict], timed: list[dict]) -> None:
    import torch

    lines = [f"# GPU check: {torch.cuda.get_device_name()} (sm_{arch}), torch {torch.__version__}", "",
             "Stage 1: the gradient with `OPTIMIZE_GPU` against `optimize=False` on the CPU, corpus inputs "
             f"(seed 0), relative tolerance {TOLERANCE:g} of the largest gradient element.", ""]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    tally = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    lines.append(f"{len(rows)} of {len(names)} programs done: {tally}")
    lines += ["", "| program | verdict | detail | s |", "|---|---|---|---:|"]
    for row in sorted(rows, key=lambda r: (r["verdict"] == "ok", r["name"])):
        lines.append(f"| {row['name']} | {row['verdict']} | {row['detail']} | {row['seconds']:.0f} |")
    missing = sorted(set(names) - {r["name"] for r in rows})
    if missing:
        lines += ["", "Not done by the deadline: " + ", ".join(missing)]
    lines += ["", "Stage 2: median ms of a gradient (gradflow: arrays copied to the device and back in every "
              "call; torch: tensors resident).", "", "| kernel | gradflow ms | eager torch ms |", "|---|---:|---:|"]
    for t in timed:
        if "error" in t:
            lines.append(f"| {t['name']} | {t['error']} | |")
        else:
            lines.append(f"| {t['name']} | {t['gradflow_ms']:.3g} | {t['torch_ms']:.3g} |")
    pathlib.Path(out).write_text("\n".join(lines) + "\n")
    tails = [f"## {r['name']}\n{r['tail']}" for r in rows if r.get("tail")]
    if tails:
        pathlib.Path(out).with_suffix(".errors.md").write_text("\n\n".join(tails) + "\n")


if __name__ == "__main__":
    sys.exit(main())
