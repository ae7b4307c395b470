#!/usr/bin/env python3
"""Before/after: gradflow's forward and forward+backward times of the benchmark kernels at two versions, in
one run.

    python benchmarks/ab.py --baseline /tmp/old [--only nb_gemm,lp_go_fast] [--rounds 1] [--out FILE]

`--baseline` is a checkout of the earlier version (`git worktree add /tmp/old <commit>`); this checkout is
the later one. Both are driven by this checkout's benchmark specs (`benchmarks/kernelbench/specs.py`), so
they time the same kernels at the same sizes on the same inputs. Each (version, kernel) runs in its own
process with that version's `src` first on the path and its own compile cache; the versions alternate per
kernel (the order flips every round), so drift of the machine's load touches both. Times are the process's
CPU time per call (one thread), medians over rounds of medians. Each side's value and gradients are
compared with the other's: a version that changed an answer is reported, not timed silently.

The acceptance criterion of a change that must not slow kernels ("no kernel slower by more than 10%") reads
the `after/before` columns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.kernels import _select, thread_env  # noqa: E402

#: ratio (after/before) above which a kernel is retimed, and above which it counts as slower
RETIME, SLOWER = 1.05, 1.10


def worker(key: str, out: pathlib.Path, repeats: int, budget_s: float) -> None:
    """Build and time one kernel with whichever gradflow is first on the path."""
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import gradflow
    from benchmarks.kernelbench import sides, specs, timing
    from benchmarks.kernelbench.worker import _blows_up, _copies, _restore

    bench = specs.by_key()[key]
    case = bench.case
    wrt, of, symbols = tuple(case.wrt), case.of, dict(bench.symbols)
    sdfg = case.to_sdfg()
    inputs = bench.inputs(sdfg)
    rec: dict = {"key": key, "gradflow": str(pathlib.Path(gradflow.__file__).parent), "build_s": {}}
    start = time.perf_counter()
    fwd_runner = sides.runner_for(sides.gradflow_forward(sdfg))
    rec["build_s"]["fwd"] = time.perf_counter() - start
    start = time.perf_counter()
    graph = sides.gradflow_fwdbwd(sdfg, wrt, of)
    both_runner = sides.runner_for(graph)
    rec["build_s"]["fwdbwd"] = time.perf_counter() - start
    extra = sides.extra_arrays(graph, inputs, symbols)
    fresh = {**_copies(inputs), **_copies(extra)}
    sides.GradflowCall(both_runner, fresh, symbols)
    rec["value"] = float(fresh[of][0])
    rec["grads"] = {w: [float(np.sum(fresh[f"grad_{w}"])), float(np.linalg.norm(fresh[f"grad_{w}"]))] for w in wrt}
    refill = bench.refill or _blows_up(
        sides.GradflowCall(both_runner, {**_copies(inputs), **_copies(extra)}, symbols), inputs)
    timed = []
    for name, runner, arrays in (("fwd", fwd_runner, _copies(inputs)),
                                 ("fwdbwd", both_runner, {**_copies(inputs), **_copies(extra)})):
        call = sides.GradflowCall(runner, arrays, symbols)
        timed.append(timing.Timed(name, call, _restore(arrays, inputs) if refill else None))
    stats = timing.measure(timed, rounds=repeats, budget_s=budget_s)
    rec["cpu_s"] = {name: by_clock["cpu"].median for name, by_clock in stats.items()}
    out.write_text(json.dumps(rec))


def run_side(side: str, src: pathlib.Path, key: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="ab_") as tmp:
        out = pathlib.Path(tmp) / "record.json"
        env = {**os.environ, **thread_env(1), "GRADFLOW_CACHE": str(pathlib.Path(args.cache) / side),
               "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]), "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", key, str(out),
               "--repeats", str(args.repeats), "--budget", str(args.budget)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode != 0:
                return {"error": " | ".join(proc.stderr.strip().splitlines()[-2:])[-300:]}
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout:.0f} s"}
        return json.loads(out.read_text())


def _agree(a: dict, b: dict) -> str | None:
    """What differs between the two versions' answers (relative 1e-8), or None."""
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 1e-8 * max(1.0, abs(x), abs(y))

    if not close(a["value"], b["value"]):
        return f"value {a['value']!r} vs {b['value']!r}"
    for w, pair in a["grads"].items():
        if not all(close(x, y) for x, y in zip(pair, b["grads"].get(w, [float("nan")] * 2))):
            return f"gradient of {w}: (sum, norm) {pair} vs {b['grads'].get(w)}"
    return None


def measure(key: str, sides: dict[str, pathlib.Path], rounds: int, args, log) -> dict:
    times: dict[str, dict[str, list[float]]] = {s: {"fwd": [], "fwdbwd": []} for s in sides}
    rec: dict = {"key": key, "errors": {}, "builds": {}}
    order = list(sides)
    for r in range(rounds):
        for side in (order if r % 2 == 0 else order[::-1]):
            got = run_side(side, sides[side], key, args)
            if "error" in got:
                rec["errors"][side] = got["error"]
                return rec
            rec["builds"].setdefault(side, got["build_s"])
            rec.setdefault("answers", {})[side] = {"value": got["value"], "grads": got["grads"]}
            for part in ("fwd", "fwdbwd"):
                times[side][part].append(got["cpu_s"][part])
        log(f"{key}: round {r + 1}: " + ", ".join(
            f"{s} {times[s]['fwd'][-1] * 1e3:.3g}/{times[s]['fwdbwd'][-1] * 1e3:.3g} ms" for s in sides))
    rec["times"] = times
    rec["differs"] = _agree(*rec["answers"].values())
    return rec


def ratios(rec: dict) -> dict[str, float]:
    t = rec["times"]
    return {part: statistics.median(t["after"][part]) / statistics.median(t["before"][part])
            for part in ("fwd", "fwdbwd")}


def report(records: list[dict], args, started: str, commits: dict[str, str]) -> str:
    timed = [r for r in records if "times" in r]
    lines = ["# Before/after: gradflow's kernel times at two versions", "",
             f"`python benchmarks/ab.py {' '.join(sys.argv[1:])}` (started {started}; see `benchmarks/ab.py`).",
             "", f"- before: {commits['before']}; after: {commits['after']}",
             f"- CPU time per call, one thread, median over rounds (each a median of `--repeats` rounds of calls, "
             f"budget {args.budget} s per side); a kernel whose ratio exceeded {RETIME} was retimed "
             f"({args.retime_rounds} more rounds per side)", ""]
    if timed:
        both = [ratios(r)["fwdbwd"] for r in timed]
        fwd = [ratios(r)["fwd"] for r in timed]
        geo = lambda xs: statistics.geometric_mean(xs)  # noqa: E731
        slower = [r["key"] for r in timed if max(ratios(r).values()) > SLOWER]
        worst = max(timed, key=lambda r: max(ratios(r).values()))
        lines += [f"- kernels timed: {len(timed)} of {len(records)}",
                  f"- after/before, geometric mean: forward {geo(fwd):.3f}, forward+backward {geo(both):.3f}",
                  f"- largest after/before: {max(ratios(worst).values()):.3f} ({worst['key']})",
                  f"- slower by more than {int(round((SLOWER - 1) * 100))}%: "
                  f"{', '.join(slower) if slower else 'none'}",
                  f"- answers that differ between the versions: "
                  f"{', '.join(r['key'] for r in timed if r['differs']) or 'none'}", ""]
    lines += ["| kernel | before fwd ms | after fwd ms | after/before fwd | before f+b ms | after f+b ms | "
              "after/before f+b | rounds |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if "times" not in r:
            lines.append(f"| {r['key']} | failed: {'; '.join(f'{k}: {v}' for k, v in r['errors'].items())[:200]} "
                         "| | | | | | |")
            continue
        t, q = r["times"], ratios(r)
        med = lambda side, part: statistics.median(t[side][part]) * 1e3  # noqa: E731
        lines.append(f"| {r['key']} | {med('before', 'fwd'):.3g} | {med('after', 'fwd'):.3g} | {q['fwd']:.3f} | "
                     f"{med('before', 'fwdbwd'):.3g} | {med('after', 'fwdbwd'):.3g} | {q['fwdbwd']:.3f} | "
                     f"{len(t['after']['fwd'])} |")
    differs = [r for r in timed if r["differs"]]
    if differs:
        lines += ["", "## Answers that differ", ""] + [f"- {r['key']}: {r['differs']}" for r in differs]
    return "\n".join(lines) + "\n"


def _commit(path: pathlib.Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %s"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return f"`{head[:70]}`" + (" plus uncommitted changes" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("KEY", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=pathlib.Path, help="a checkout of the earlier version")
    parser.add_argument("--only", help="comma-separated kernel names or bench keys (default: all)")
    parser.add_argument("--rounds", type=int, default=1, help="processes per side and kernel")
    parser.add_argument("--retime-rounds", type=int, default=2,
                        help=f"more rounds for a kernel whose after/before exceeds {RETIME}")
    parser.add_argument("--repeats", type=int, default=5, help="timing rounds inside one process")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed calls per side and part")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per (version, kernel) process")
    parser.add_argument("--cache", default=None, help="compile caches (default: a temporary folder)")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], pathlib.Path(args.worker[1]), args.repeats, args.budget)
        return
    if args.baseline is None or not (args.baseline / "src" / "gradflow").is_dir():
        parser.error("--baseline must be a checkout of gradflow (it has src/gradflow)")
    started = datetime.datetime.now().isoformat(timespec="seconds")
    sides = {"before": args.baseline.resolve() / "src", "after": ROOT / "src"}
    log = lambda text: print(text, flush=True)  # noqa: E731
    records = []
    with tempfile.TemporaryDirectory(prefix="ab_cache_") as default_cache:
        args.cache = args.cache or default_cache
        for bench in _select(args.only):
            rec = measure(bench.key, sides, args.rounds, args, log)
            if "times" in rec and max(ratios(rec).values()) > RETIME and args.retime_rounds:
                more = measure(bench.key, sides, args.retime_rounds, args, log)
                if "times" in more:
                    for side, parts in more["times"].items():
                        for part, values in parts.items():
                            rec["times"][side][part] += values
            records.append(rec)
    text = report(records, args, started, {"before": _commit(args.baseline), "after": _commit(ROOT)})
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(records, indent=1))
    print(text)


if __name__ == "__main__":
    main()
