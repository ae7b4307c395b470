"""Run every ONNX backend node test case of the ops in scope through gradflow; report pass/fail per op.

Usage: OMP_NUM_THREADS=1 python benchmarks/onnx_conformance.py [--jobs 2] [--ops Conv,Gemm] [--filter substr]
Writes benchmarks/results/onnx_conformance.{json,md} (per-op pass/fail, failures grouped by reason category,
see `gradflow.verify.onnx_conformance.CATEGORIES`) and prints the summary. A run restricted with --ops or
--filter writes onnx_conformance_partial.{json,md} instead, so the full report is never overwritten by one.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _run(name: str):
    from gradflow.verify.onnx_conformance import all_node_cases, run_case

    return run_case(all_node_cases()[name])


def main() -> int:
    from gradflow.frontend.onnx.rules import default_table
    from gradflow.verify.onnx_conformance import CATEGORIES, OPS_IN_SCOPE, all_node_cases, cases_in_scope

    default_table()  # import every rule before the workers fork
    all_node_cases()

    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ops", default="")
    ap.add_argument("--filter", default="")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    ops = tuple(args.ops.split(",")) if args.ops else tuple(OPS_IN_SCOPE)
    cases = cases_in_scope(ops)
    names = sorted(n for n in cases if args.filter in n)
    start = time.time()
    with mp.get_context("fork").Pool(args.jobs, maxtasksperchild=50) as pool:
        outcomes = []
        for k, o in enumerate(pool.imap_unordered(_run, names, chunksize=1)):
            outcomes.append(o)
            print(f"[{k + 1}/{len(names)}] {'PASS' if o.passed else 'FAIL'} {o.name} {o.reason[:120]}", flush=True)
    elapsed = time.time() - start
    per_op = collections.defaultdict(lambda: [0, 0])
    for o in outcomes:
        per_op[o.op][0] += o.passed
        per_op[o.op][1] += 1
    total_pass = sum(o.passed for o in outcomes)
    failed = sorted((o for o in outcomes if not o.passed), key=lambda o: o.name)
    by_category = collections.Counter(o.category for o in failed)
    representable = len(outcomes) - by_category["element-type"] - by_category["non-tensor"]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "total": len(outcomes), "passed": total_pass,
        "pass_rate": total_pass / max(1, len(outcomes)), "seconds": round(elapsed, 1),
        "representable": representable,
        "failures_by_category": {c: by_category[c] for c in CATEGORIES},
        "per_op": {op: {"passed": p, "total": t} for op, (p, t) in sorted(per_op.items())},
        "failures": [{"case": o.name, "op": o.op, "category": o.category, "reason": o.reason} for o in failed],
    }
    stem = "onnx_conformance" if not (args.ops or args.filter) else "onnx_conformance_partial"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
    lines = ["# ONNX node-test conformance", "",
             f"{total_pass}/{len(outcomes)} passed ({100 * report['pass_rate']:.1f}%) in {elapsed:.0f} s "
             f"(`{' '.join(['benchmarks/onnx_conformance.py', *sys.argv[1:]])}`); "
             f"{total_pass}/{representable} of the cases whose values gradflow represents", "",
             "| failure category | cases | meaning |", "|---|---|---|"]
    lines += [f"| {c} | {by_category[c]} | {meaning} |" for c, meaning in CATEGORIES.items()]
    lines += ["", "| op | passed | total |", "|---|---|---|"]
    lines += [f"| {op} | {p} | {t} |" for op, (p, t) in sorted(per_op.items())]
    missing = [op for op in ops if op not in per_op]
    if missing:
        lines += ["", f"Ops with no node cases: {', '.join(missing)}"]
    lines += ["", "## Failures", ""]
    for c in CATEGORIES:
        cases = [o for o in failed if o.category == c]
        if cases:
            lines += [f"### {c} ({len(cases)})", ""] + [f"- `{o.name}`: {o.reason}" for o in cases] + [""]
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:5 + 2 + len(CATEGORIES)]))
    print(f"\nreport: {out_dir / (stem + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
