"""Forward and forward+backward time of gradflow's compiled kernels against eager torch, torch.compile and
JAX jit, on the loop corpus, the NPBench corpus and the MLP of `benchmarks/mlp.py`.

Per kernel (`benchmarks/kernelbench/specs.py`: the size, chosen so that gradflow's forward takes at least
1 ms on one thread, and the domains of the inputs), one fresh worker process:
- draws the inputs at the benchmark size and computes the eager torch reference (value and gradients);
- gradflow: forward = `compile_sdfg(optimized(program))`, forward+backward = `compile_sdfg(grad_graph(program,
  wrt, of))` (one SDFG, optimized by default), both called through `runtime.calling.Kernel` with prebuilt
  arguments; checks both against torch at this size;
- JAX (`benchmarks/peers/`, float64): checked against torch at the case's test size and at this size,
  `jit` of the forward and of `value_and_grad`;
- torch.compile of the torch reference (default mode) under a compile deadline, where the reference is not
  a per-element Python loop that dynamo would unroll;
- times every side interleaved in rounds, medians of single calls (`kernelbench/timing.py`).
Programs update their inputs in place and every side reuses its buffers; inputs are restored (untimed)
before each gradflow call only where repeated calls would blow the values up (`refill`).

    OMP_NUM_THREADS=1 python benchmarks/kernels.py [--only lp_lu,nb_gemm] [--skip-torch-compile]
        [--threads 1] [--repeats 10] [--budget 8] [--timeout 1500] [--out benchmarks/results/kernels.md]
    python benchmarks/kernels.py --calibrate [--only ...]   # gradflow forward time per size, grown to >= 1 ms
    python benchmarks/kernels.py --check-jax [--only ...]   # the JAX versions against torch at test size only

Writes the tables (with the machine, load and versions) to `--out` and the raw records next to it (.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def thread_env(threads: int) -> dict[str, str]:
    """Environment giving every side `threads` threads: OpenMP (gradflow's kernels and matrix products,
    torch), MKL, XLA. OpenBLAS (gradflow's) keeps one: gradflow shares a large product out over its OpenMP
    team itself (runtime/team_gemm.h), and does not when OpenBLAS has threads of its own."""
    xla = ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" if threads == 1
           else f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}")
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": n, "XLA_FLAGS": xla,
            "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def _keys(only: str) -> set[str]:
    """The names and bench keys in a comma-separated `--only`: a headline key's own commas
    (`lp_softmax@N=256,M=512`) stay in it, since a part `SYMBOL=value` continues the key before it."""
    keys: list[str] = []
    for part in (p.strip() for p in only.split(",")):
        if not part:
            continue
        if keys and "@" in keys[-1] and "=" in part and "@" not in part:
            keys[-1] += "," + part
        else:
            keys.append(part)
    return set(keys)


def _select(only: str | None):
    from benchmarks.kernelbench import specs

    benches = specs.benches()
    if not only:
        return benches
    wanted = _keys(only)
    chosen = [b for b in benches if b.name in wanted or b.key in wanted]
    unknown = wanted - {b.name for b in chosen} - {b.key for b in chosen}
    if unknown:
        sys.exit(f"unknown kernel(s): {', '.join(sorted(unknown))}")
    return chosen


# ------------------------------------------------------------------------------------------------ worker


def worker(mode: str, key: str, out: pathlib.Path, args) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.kernelbench import specs, worker as work

    bench = specs.by_key()[key]
    if mode == "calibrate":
        work.calibrate(bench, out)
    else:
        work.run(bench, out, args.skip_torch_compile, args.compile_timeout, args.repeats, args.budget)


def run_worker(mode: str, key: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="kernels_") as tmp:
        out = pathlib.Path(tmp) / "record.json"
        env = {**os.environ, **thread_env(args.threads),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", mode, key, str(out),
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--budget", str(args.budget),
               "--compile-timeout", str(args.compile_timeout)] + (["--skip-torch-compile"] if args.skip_torch_compile
                                                                 else [])
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
            failure = None if proc.returncode == 0 else f"worker exited with {proc.returncode}: " + \
                " | ".join(proc.stderr.strip().splitlines()[-3:])
        except subprocess.TimeoutExpired:
            failure = f"worker timed out after {args.timeout:.0f} s"
        rec = json.loads(out.read_text()) if out.is_file() else {"key": key, "kernel": key.split("@")[0]}
        rec["wall_s"] = time.perf_counter() - start
        rec["clock"] = args.clock
        if failure:
            rec.setdefault("errors", {})["worker"] = f"{failure} (during stage: {rec.get('stage', 'start')})"
        return rec


# ------------------------------------------------------------------------------------------------ report


def environment(args, load_before, load_after, started: str) -> str:
    import dace
    import jax
    import jaxlib
    import numpy
    import torch

    from gradflow.runtime import blas

    def sh(*cmd: str) -> str:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = sh("git", "rev-parse", "--short", "HEAD") or "?"
    if sh("git", "status", "--porcelain", "src", "benchmarks"):
        commit += " plus uncommitted changes"
    return (f"- machine: `{sh('uname', '-a')}`, {os.cpu_count()} CPUs; threads per side: {args.threads} "
            f"({' '.join(f'{k}={v}' for k, v in thread_env(args.threads).items())})\n"
            f"- load average (1, 5, 15 min) before / after the run: {', '.join(f'{x:.1f}' for x in load_before)} / "
            f"{', '.join(f'{x:.1f}' for x in load_after)} (wall-clock times; the sides of a kernel are measured "
            "interleaved in one process, so their ratios are more robust to load than the absolute times)\n"
            f"- python {platform.python_version()}, dace {dace.__version__}, torch {torch.__version__}, jax "
            f"{jax.__version__} (jaxlib {jaxlib.__version__}), numpy {numpy.__version__}; gradflow at commit {commit}\n"
            f"- BLAS of gradflow's builds: {blas.describe()}\n"
            f"- started {started}; command: `{' '.join(sys.argv)}`; repeats {args.repeats}, budget {args.budget} s "
            f"per side and kernel, torch.compile deadline {args.compile_timeout:.0f} s\n")


def write_report(records: list[dict], args, load_before, started: str) -> str:
    from benchmarks.kernelbench import report

    load_after = os.getloadavg()
    text = (
        "# Kernel benchmark: gradflow vs eager torch, torch.compile, JAX jit\n\n"
        f"`{' '.join(sys.argv)}` ({__doc__.splitlines()[0][:-1].lower()}; see `benchmarks/kernels.py`).\n"
        "Times are medians of single calls in ms; *f+b* is forward+backward (value and every gradient of `wrt`); "
        "*gf/peer* is gradflow's f+b time over the peer's (below 1: gradflow faster, in bold). "
        f"{report.STAR} marks the headline kernels of the performance target. Eager torch runs the corpus's "
        "reference, which for many loop kernels is a per-element Python loop (as a user writing the loop in "
        "torch would get); torch.compile is n/a where it is not tried (such references), fails or exceeds its "
        "deadline (see Problems).\n\n"
        + environment(args, load_before, load_after, started)
        + "\n## Summary\n\n" + report.summary(records)
        + "\n## Targets\n\n" + report.targets(records)
        + "\n## Kernels\n\n" + report.table(records)
        + "\n## Problems (errors and warnings per kernel)\n\n" + report.problems(records)
        + "\n## Checks (worst relative error against eager torch)\n\n" + report.checks(records)
    )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated kernel names (lp_lu, nb_gemm, mlp) or bench keys")
    parser.add_argument("--skip-torch-compile", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="threads for every side (default 1)")
    parser.add_argument("--repeats", type=int, default=10, help="timing rounds (each about 0.1 s of CPU time per side)")
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of timed calls per side and kernel")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds per kernel (its worker process)")
    parser.add_argument("--compile-timeout", type=float, default=180.0, help="deadline of torch.compile's compiles")
    parser.add_argument("--clock", choices=("cpu", "wall"),
                        help="what the tables report: the process's CPU time per call (default with --threads 1: "
                             "robust to a loaded machine) or wall-clock time (default with more threads)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "kernels.md")
    parser.add_argument("--calibrate", action="store_true", help="report gradflow's forward time per size")
    parser.add_argument("--check-jax", action="store_true", help="only check the JAX versions at test size")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "KEY", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        mode, key, out = args.worker
        worker(mode, key, pathlib.Path(out), args)
        return
    if args.clock is None:
        args.clock = "cpu" if args.threads == 1 else "wall"
    benches = _select(args.only)
    if args.check_jax:
        check_jax(benches, args)
    elif args.calibrate:
        calibrate(benches, args)
    else:
        benchmark(benches, args)


def benchmark(benches, args) -> None:
    from benchmarks.kernelbench import report

    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_before = os.getloadavg()
    records = []
    for b in benches:
        rec = run_worker("run", b.key, args)
        records.append(rec)
        g = report.both(rec, "gradflow")
        peers = "  ".join(f"gf/{label}={report._r(report.ratio(g, report.both(rec, p)))}" for p, label in report.PEERS)
        print(f"{b.key:34s} gf fwd {report._ms(report.fwd(rec, 'gradflow')):>7} ms  f+b "
              f"{report._ms(g):>7} ms  {peers}  [{rec['wall_s']:.0f} s]"
              + (f"  errors: {'; '.join(f'{k}: {v[:80]}' for k, v in rec.get('errors', {}).items())}"
                 if rec.get("errors") else ""), flush=True)
    text = write_report(records, args, load_before, started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=1, default=float))
    print("\n" + text)


def calibrate(benches, args) -> None:
    for b in benches:
        rec = run_worker("calibrate", b.key, args)
        tried = ", ".join(f"{t['symbols']}: {t['fwd_s'] * 1e3:.3g} ms" for t in rec.get("tried", []))
        print(f"{b.key:34s} {tried}" + (f"  errors: {rec['errors']}" if rec.get("errors") else ""), flush=True)


def check_jax(benches, args) -> None:
    os.environ.update(thread_env(args.threads))
    from benchmarks.kernelbench import checks
    from benchmarks.peers import kernels

    jax_kernels = kernels()
    failed = 0
    for b in {b.name: b for b in benches}.values():
        err, what = checks.jax_at_test_size(b.case, jax_kernels[b.name])
        ok = err <= checks.TEST_RTOL
        failed += not ok
        print(f"{b.name:30s} {'ok' if ok else 'WRONG'}  worst relative error {err:.1e} ({what})", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
