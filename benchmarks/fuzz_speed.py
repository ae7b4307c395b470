#!/usr/bin/env python3
"""Seconds per program of `gradflow fuzz`'s check at two versions, on the same drawn programs.

    python benchmarks/fuzz_speed.py --baseline /tmp/old [--seed 999] [--n 12] [--out fuzz_speed.md]

`--baseline` is a checkout of the earlier version (`git worktree add /tmp/old <commit>`); this checkout is
the later one. The programs are drawn once (this checkout's grammar, `campaign.draw`), each checked under
the configurations a campaign gives it (`campaign.configs_for(i, seed, "two")`) and the higher modes, by
one process per version, in turn program by program so both see the same load. Each version has a compile
cache of its own, emptied before the run: every build is cold, as in a campaign, whose workers empty
theirs after every program. Reported: each program's verdict at both versions (they must agree) and the
ratio of the total seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent

_CHILD = """
import json, os, sys, time
from gradflow.verify.fuzz import campaign
from gradflow.verify.fuzz.check import check_program, spec_of
seed, n = int(sys.argv[1]), int(sys.argv[2])
programs = campaign.draw(n, seed)
for line in sys.stdin:
    i = int(line)
    spec = spec_of(programs[i], campaign.configs_for(i, seed, "two"), seed=seed * 100003 + i)
    start = time.perf_counter()
    verdict = check_program(spec)
    print(json.dumps({"kind": verdict.kind, "seconds": time.perf_counter() - start}), flush=True)
"""


def _start(src: pathlib.Path, cache: pathlib.Path, seed: int, n: int) -> subprocess.Popen:
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(src), "GRADFLOW_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(seed), str(n)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, type=pathlib.Path, help="checkout of the earlier version")
    parser.add_argument("--seed", type=int, default=999)
    parser.add_argument("--n", type=int, default=12, help="programs")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the table here too")
    args = parser.parse_args()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gradflow-fuzz-speed-"))
    sides = {"before": args.baseline.resolve() / "src", "after": HERE.parent / "src"}
    procs = {side: _start(src, scratch / side, args.seed, args.n) for side, src in sides.items()}
    rows = []
    try:
        for i in range(args.n):
            row = {"i": i}
            order = list(procs) if i % 2 == 0 else list(reversed(procs))  # alternate who goes first
            for side in order:
                procs[side].stdin.write(f"{i}\n")
                procs[side].stdin.flush()
                row[side] = json.loads(procs[side].stdout.readline())
            rows.append(row)
            print(f"program {i}: {row['before']['kind']} {row['before']['seconds']:.1f} s -> "
                  f"{row['after']['kind']} {row['after']['seconds']:.1f} s", flush=True)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=60)
        shutil.rmtree(scratch, ignore_errors=True)
    before = sum(r["before"]["seconds"] for r in rows)
    after = sum(r["after"]["seconds"] for r in rows)
    differ = [r["i"] for r in rows if r["before"]["kind"] != r["after"]["kind"]]
    lines = [f"`python benchmarks/fuzz_speed.py --baseline {args.baseline} --seed {args.seed} --n {args.n}`", "",
             f"- programs: {len(rows)}; seconds before {before:.1f}, after {after:.1f}: after/before "
             f"**{after / before:.3f}**",
             f"- verdicts that differ: {differ if differ else 'none'}", "",
             "| program | verdict before | s before | verdict after | s after |", "|---:|---|---:|---|---:|"]
    lines += [f"| {r['i']} | {r['before']['kind']} | {r['before']['seconds']:.1f} | {r['after']['kind']} | "
              f"{r['after']['seconds']:.1f} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
