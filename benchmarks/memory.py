"""Memory per forwarding policy, as planned and as measured: forwarded bytes, budgets, allocation, peak RSS
and fwd+bwd time of every loop-corpus (and NPBench) kernel under STORE_ALL, RECOMPUTE_ALL and byte budgets.

Per kernel, at the kernel benchmark's size (`benchmarks/kernelbench/specs.py`, a forward of about a ms or
more; loop-corpus cases it does not size get `EXTRA` below), one fresh worker process
(`benchmarks/memorybench/worker.py`) differentiates the program under each policy of
`benchmarks/memorybench/policies.py` (STORE_ALL, RECOMPUTE_ALL, `Forwarding.budget` at 10/25/50/75% of
STORE_ALL's forwarded bytes) and reports:
- forwarded bytes: what the plan keeps for the backward sweep (saved temporaries and tape), and for a
  budget whether that is within it, or the `BudgetError` with the least any plan needs;
- allocated bytes: the transients the compiled SDFG allocates, counted from its descriptors (tape,
  recompute buffers, gradient buffers, working copies, temporaries; `memorybench/allocation.py`);
- peak RSS increase of initialising and calling the compiled fwd+bwd once, in a fresh process;
- fwd+bwd time: median of single calls with prebuilt arguments, all policies interleaved
  (`kernelbench/timing.py`; CPU time with one thread);
- that the value and gradients equal STORE_ALL's (a mismatch is printed and makes the exit status 1).

    OMP_NUM_THREADS=1 python benchmarks/memory.py [--corpus loops|npbench|all] [--only lp_lu,lp_durbin]
        [--repeats 5] [--budget 2] [--timeout 900] [--no-rss] [--out benchmarks/results/memory.md]
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

CORPORA = ("loops", "npbench", "all")


def extra_benches():
    """Loop-corpus cases the kernel benchmark does not size, at sizes where they take some time."""
    from benchmarks.kernelbench import inputs as dom
    from benchmarks.kernelbench.specs import Bench
    from gradflow.verify.corpus import loops

    lp = loops.CASES_BY_NAME
    return (
        Bench(lp["lp_cholesky_dot"], {"N": 200}, domains={"A": dom.spd}, refill=True),
        Bench(lp["lp_lu_slices"], {"N": 200}, domains={"A": dom.dominant}, refill=True),
        Bench(lp["lp_trisolv_dot"], {"N": 2000}, domains={"L": dom.lower_triangular}),
        Bench(lp["lp_doitgen"], {"N": 32, "M": 32, "K": 64}, refill=True),
        Bench(lp["lp_covariance"], {"N": 500, "M": 200}),
        # a nonlinear time loop: every store/recompute plan keeps all T states; budgets below that checkpoint
        Bench(lp["lp_whole_array_update"], {"N": 1000, "T": 200}),
        # index arrays: the case's own generator (valid indices) at its test size
        Bench(lp["lp_masked_normalise"], dict(lp["lp_masked_normalise"].symbols)),
        Bench(lp["lp_indexed_updates"], dict(lp["lp_indexed_updates"].symbols)),
    )


def benches(corpus: str):
    """The kernels of `corpus`, one bench each (the headline-only sizes of the kernel benchmark left out)."""
    from benchmarks.kernelbench import specs
    from benchmarks.kernelbench.specs import Bench
    from gradflow.verify.corpus import loops

    chosen = []
    if corpus in ("loops", "all"):
        sized = {b.name: b for b in specs.LOOP_BENCHES if b.role != specs.HEADLINE}
        sized.update({b.name: b for b in extra_benches()})
        # a case the kernel benchmark does not size runs at its test size (say so: its times are small)
        chosen += [sized[c.name] if c.name in sized else Bench(c, dict(c.symbols)) for c in loops.CASES]
    if corpus in ("npbench", "all"):
        chosen += list(specs.NPBENCH_BENCHES)
    return chosen


def select(corpus: str, only: str | None):
    chosen = benches(corpus)
    if not only:
        return chosen
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = sorted(set(wanted) - {b.name for b in chosen})
    if unknown:
        sys.exit(f"unknown kernel(s) in --corpus {corpus}: {', '.join(unknown)}")
    return [b for b in chosen if b.name in wanted]


def bench_named(name: str):
    return next(b for b in benches("all") if b.name == name)


def run_worker(name: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="memory_") as tmp:
        out = pathlib.Path(tmp) / "record.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", name, str(out),
               "--repeats", str(args.repeats), "--budget", str(args.budget)] + (["--no-rss"] if args.no_rss else [])
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
            failure = None if proc.returncode == 0 else f"worker exited with {proc.returncode}: " + \
                " | ".join(proc.stderr.strip().splitlines()[-3:])
            sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if "MISMATCH" in ln))
        except subprocess.TimeoutExpired:
            failure = f"worker timed out after {args.timeout:.0f} s"
        rec = json.loads(out.read_text()) if out.is_file() else {"key": name, "kernel": name, "rows": {}}
        rec["wall_s"] = time.perf_counter() - start
        if failure:
            rec.setdefault("errors", {})["worker"] = f"{failure} (during stage: {rec.get('stage', 'start')})"
        return rec


def environment(args, load_before, started: str) -> str:
    import dace
    import numpy
    import scipy

    def sh(*cmd: str) -> str:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = sh("git", "rev-parse", "--short", "HEAD") or "?"
    if sh("git", "status", "--porcelain", "src", "benchmarks"):
        commit += " plus uncommitted changes"
    load_after = os.getloadavg()
    return (f"- machine: `{sh('uname', '-srm')}`, {os.cpu_count()} CPUs, one thread per kernel (OMP_NUM_THREADS=1)\n"
            f"- load average (1, 5, 15 min) before / after: {', '.join(f'{x:.1f}' for x in load_before)} / "
            f"{', '.join(f'{x:.1f}' for x in load_after)}\n"
            f"- python {platform.python_version()}, dace {dace.__version__}, numpy {numpy.__version__}, scipy "
            f"{scipy.__version__}; gradflow at commit {commit}\n"
            f"- started {started}; command: `{' '.join(sys.argv)}`; {args.repeats} timing rounds, {args.budget} s of "
            "timed calls per policy and kernel\n")


def write_report(records: list[dict], args, load_before, started: str) -> str:
    from benchmarks.memorybench import report

    clock = "cpu"
    problems = [(r["key"], p) for r in records for p in report.problems(r)]
    slow = [(r["key"], n, x) for r in records for n, x in report.slower_than_baseline(r, clock)]
    bought = [(r["key"], n, x) for r in records for n, x in report.below_baseline(r, clock)]
    return (
        "# Memory per forwarding policy: planned, allocated, measured\n\n"
        f"`{' '.join(sys.argv)}` (see `benchmarks/memory.py` and `docs/benchmarks.md`). Sizes in bytes "
        "(KiB = 1024 B). *forwarded*: what the plan keeps for the backward sweep beyond the program's "
        "arguments; *within*: a budget's forwarded bytes at most its limit, or the `BudgetError`'s least; "
        "*allocated*: transients of the compiled fwd+bwd SDFG counted from its descriptors, in brackets the "
        "tape's part; *peak RSS +*: measured increase of initialising and calling it once in a fresh "
        "process; *f+b ms*: median CPU time of one fwd+bwd call; */ recompute_all*: that time over "
        f"RECOMPUTE_ALL's (worse means above {1 + report.SLOWER:.2f}; compared at the budgets RECOMPUTE_ALL's "
        "own plan fits: a smaller budget is a trade of memory for time, listed apart). "
        "Every row's value and gradients are checked equal to STORE_ALL's.\n\n"
        + environment(args, load_before, started)
        + "\n## Summary\n\n" + report.summary(records, clock)
        + "\n## Budget plans slower than RECOMPUTE_ALL (at budgets its plan fits)\n\n"
        + ("".join(f"- {k}: {n} takes x{x:.2f} RECOMPUTE_ALL's time\n" for k, n, x in slow) or "none\n")
        + "\n## Budgets below what RECOMPUTE_ALL keeps (its plan does not fit), time over RECOMPUTE_ALL's\n\n"
        + ("".join(f"- {k}: {n} x{x:.2f}\n" for k, n, x in bought) or "none\n")
        + "\n## Problems\n\n" + ("".join(f"- {k}: {p}\n" for k, p in problems) or "none\n")
        + "\n## Kernels\n\n" + "\n".join(report.kernel_table(r, clock) for r in records)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=CORPORA, default="loops")
    parser.add_argument("--only", help="comma-separated kernel names (lp_lu, nb_gemm)")
    parser.add_argument("--repeats", type=int, default=5, help="timing rounds")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed calls per policy and kernel")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per kernel (its worker process)")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS processes")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "memory.md")
    parser.add_argument("--worker", nargs=2, metavar=("KERNEL", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--rss", nargs=4, metavar=("SDFG", "ARRAYS", "ABOUT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true", help="rewrite --out from its .json records")
    args = parser.parse_args()

    import warnings

    warnings.simplefilter("ignore")
    if args.rss:
        from benchmarks.memorybench import worker

        worker.rss_main(*args.rss)
        return
    if args.worker:
        from benchmarks.memorybench import worker

        name, out = args.worker
        worker.run(bench_named(name), pathlib.Path(out), args.repeats, args.budget, not args.no_rss)
        return

    from benchmarks.memorybench import report

    if args.report_only:
        records = json.loads(args.out.with_suffix(".json").read_text())
        missing = [b.name for b in select(args.corpus, args.only) if b.name not in {r["kernel"] for r in records}]
        note = f"\n**Incomplete**: no record for {', '.join(missing)} (the run stopped first).\n" if missing else ""
        text = write_report(records, args, os.getloadavg(), "(from the records)")
        head, _, rest = text.partition("\n## Summary")
        args.out.write_text(head + note + "\n## Summary" + rest)
        return
    chosen = select(args.corpus, args.only)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_before = os.getloadavg()
    records = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for b in chosen:
        rec = run_worker(b.name, args)
        records.append(rec)
        args.out.with_suffix(".json").write_text(json.dumps(records, indent=1, default=float))  # so far
        rows = rec.get("rows", {})
        cells = "  ".join(f"{n}={report.size(r.get('forwarded'))}/{report.ms(report.median(r, 'cpu'))}ms"
                          for n, r in rows.items())
        print(f"{b.name:28s} {cells}  [{rec['wall_s']:.0f} s]"
              + (f"  problems: {'; '.join(p[:100] for p in report.problems(rec))}" if report.problems(rec) else ""),
              flush=True)
    text = write_report(records, args, load_before, started)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=1, default=float))
    print("\n" + text)
    mismatches = [r["key"] for r in records for row in r.get("rows", {}).values() if "MISMATCH" in row.get("error", "")]
    if mismatches:
        sys.exit(f"gradient mismatch against store_all in: {', '.join(mismatches)}")


if __name__ == "__main__":
    main()
