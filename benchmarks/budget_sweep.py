"""Budgets planned at the call, on every loop-corpus and NPBench kernel: issue 31's acceptance sweep.

Per kernel (one fresh worker process each, at the case's own test sizes and inputs), through
`gradflow.value_and_grad` with **no** `sizes=` and no loop labels, as a user calls it:
- STORE_ALL's value and gradients, and its forwarded bytes at the call's sizes (`full`);
- then `Forwarding.budget(b)` for b at 10/25/50/75% of `full`: the plan the call built must keep at most b
  bytes (`ForwardingPlan.total_bytes` at the call's sizes) and give STORE_ALL's value and gradients within
  1e-12 (relative to the largest magnitude, at least 1), or the budget is refused with a `BudgetError`
  whose stated least is more than b, and that least, asked for in turn, must hold as above.
A kernel whose backward sweep needs nothing (`full` = 0) is asked for a budget of 0 bytes once. A budget
refused because a while loop has no bound and cannot be checkpointed (inside a loop that cannot be, or not
a loop region) is asked again with the bound the error asks for (`loop_bounds={'*': 64}`), and marked.

Any other outcome is a failure of the row, printed, and makes the exit status 1:

    OMP_NUM_THREADS=1 python benchmarks/budget_sweep.py [--corpus loops|npbench|all] [--only lp_lu,nb_adi]
        [--timeout 900] [--out benchmarks/results/budget_sweep.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

FRACTIONS = (0.10, 0.25, 0.50, 0.75)
#: a budget's value and gradients must equal STORE_ALL's within this, relative to max(1, largest magnitude)
RTOL = 1e-12
#: the bound a row takes when the budget is refused for a while loop it cannot price (the error's way out)
WHILE_BOUND = 64


def cases(corpus: str) -> list:
    from gradflow.verify.corpus import loops

    chosen = list(loops.CASES) if corpus in ("loops", "all") else []
    if corpus in ("npbench", "all"):
        from tests.corpus import npbench

        chosen += list(npbench.CASES)
    return chosen


def _case(name: str):
    return next(c for c in cases("all") if c.name == name)


def _message(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' / '.join(lines[:2])}"[:300]


def _error(got: dict, want: dict) -> tuple[float, str]:
    """The largest difference over the value and the gradients, relative to max(1, largest magnitude)."""
    import numpy as np

    worst, what = 0.0, ""
    for name, ref in want.items():
        ref, val = np.asarray(ref, dtype=np.float64), np.asarray(got[name], dtype=np.float64)
        err = float(np.max(np.abs(val - ref))) / max(1.0, float(np.max(np.abs(ref)))) if ref.size else 0.0
        if not err <= worst:  # NaN counts as the worst
            worst, what = err, name
    return worst, what


def worker(name: str, out: pathlib.Path) -> None:
    """One kernel: the reference, then each budget; the record is rewritten after every row."""
    import numpy as np

    import gradflow
    from gradflow import Forwarding
    from gradflow.api import grad_graph
    from gradflow.autodiff.budget import BudgetError
    from gradflow.core.errors import NotDifferentiableError

    case = _case(name)
    sizes = dict(case.symbols)
    rec: dict = {"kernel": name, "sizes": sizes, "rows": [], "failures": []}

    def save() -> None:
        out.write_text(json.dumps(rec, indent=1, default=str))

    def call(forwarding: Forwarding):
        """(value and gradients by name, the plan built at the call or None) of one call on fresh inputs."""
        f = gradflow.value_and_grad(case.program, wrt=list(case.wrt), of=case.of, forwarding=forwarding)
        # contiguous copies, as the corpus's runner passes them (a case may build an input as a view)
        value, grads = f(**{k: np.ascontiguousarray(v) for k, v in case.inputs(0).items()}, **sizes)
        plans = list(f.plans.items())
        if plans:
            ((key, plan),) = plans
            if dict(key).items() - sizes.items():
                rec["failures"].append(f"planned for {dict(key)}, the call's sizes are {sizes}")
            return {case.of: np.array([value]), **grads}, plan
        return {case.of: np.array([value]), **grads}, None

    bounds = dict(case.loop_bounds)
    start = time.perf_counter()
    want, _ = call(Forwarding(loop_bounds=bounds))
    full = grad_graph(case.program, list(case.wrt), case.of,
                      forwarding=Forwarding(sizes=sizes, loop_bounds=bounds)).meta["ad"].forwarding_plan
    rec["full"] = full_bytes = full.total_bytes(sizes)
    rec["reference_s"] = time.perf_counter() - start
    save()

    def attempt(row: dict, budget: int, bounds: dict):
        """The call under `budget`, or under the least a `BudgetError` states (then recorded)."""
        try:
            return budget, *call(Forwarding.budget(budget, loop_bounds=bounds))
        except BudgetError as refused:
            row["refused"] = refused.minimum
            if not refused.minimum > budget or str(refused.minimum) not in refused.message:
                raise AssertionError(f"refused without a least above the budget: {_message(refused)}") from None
            return refused.minimum, *call(Forwarding.budget(refused.minimum, loop_bounds=bounds))

    budgets = [("0 B", 0)] if full_bytes == 0 else [(f"{round(f * 100)}%", int(full_bytes * f)) for f in FRACTIONS]
    for label, budget in budgets:
        row: dict = {"budget": label, "asked": budget}
        rec["rows"].append(row)
        start = time.perf_counter()
        try:
            try:
                budget, got, plan = attempt(row, budget, bounds)
            except NotDifferentiableError as exc:
                # a while loop no byte count covers, which cannot be checkpointed (inside another loop, or
                # not a loop region): the error names the way out, a bound; take it
                if "no trip-count bound" not in str(exc) or "loop_bounds" not in str(exc):
                    raise
                row["needs_bound"] = WHILE_BOUND
                budget, got, plan = attempt(row, budget, {**bounds, "*": WHILE_BOUND})
        except Exception as exc:  # noqa: BLE001 - a row that fails is reported, not fatal
            row["error"] = _message(exc)
            rec["failures"].append(f"{label}: {row['error']}")
            continue
        finally:
            row["s"] = round(time.perf_counter() - start, 1)
            save()
        row["kept"] = plan.total_bytes(sizes)
        row["policy"] = plan.policy
        row["error_vs_store_all"], what = _error(got, want)
        if not row["kept"] <= budget:
            rec["failures"].append(f"{label}: the plan keeps {row['kept']} bytes for a budget of {budget}")
        if not row["error_vs_store_all"] <= RTOL:
            rec["failures"].append(f"{label}: {what} differs from STORE_ALL's by {row['error_vs_store_all']:.1e}")
        save()


def run_worker(name: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="budget_sweep_") as tmp:
        out = pathlib.Path(tmp) / "record.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", name, str(out)]
        start = time.perf_counter()
        failure = None
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                failure = f"worker exited with {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-2:])
        except subprocess.TimeoutExpired:
            failure = f"worker timed out after {timeout:.0f} s"
        rec = json.loads(out.read_text()) if out.is_file() else {"kernel": name, "rows": [], "failures": []}
        if failure:
            rec["failures"].append(failure[:400])
        rec["wall_s"] = round(time.perf_counter() - start, 1)
        return rec


def _cell(row: dict) -> str:
    if "error" in row:
        return "error"
    text = f"{row['kept']}"
    if "refused" in row:
        text = f"refused, least {row['refused']}: {text}"
    if "checkpoint" in row.get("policy", ""):
        text += " (ckpt)"
    if "needs_bound" in row:
        text += " (bound)"
    return text


def report(records: list[dict], command: str, started: str, seconds: float) -> str:
    import dace

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "?"
    if subprocess.run(["git", "status", "--porcelain", "src", "benchmarks"], cwd=ROOT, capture_output=True,
                      text=True).stdout.strip():
        commit += " plus uncommitted changes"
    failed = [r for r in records if r["failures"]]
    rows = sum(len(r["rows"]) for r in records)
    refused = sum("refused" in row for r in records for row in r["rows"])
    bounded = sorted({r["kernel"] for r in records for row in r["rows"] if "needs_bound" in row})
    lines = [
        "# Budgets planned at the call: every loop-corpus and NPBench kernel", "",
        f"Command: `{command}` (gradflow at {commit}, dace {dace.__version__}; started {started}, "
        f"{seconds / 60:.0f} min).", "",
        "Each kernel at its test sizes and inputs, through `gradflow.value_and_grad(program, wrt, of, "
        "forwarding=Forwarding.budget(b))` with no `sizes=` and no loop labels. `full` is STORE_ALL's "
        "forwarded bytes at the call's sizes; each budget column gives the bytes the plan built at the call "
        "keeps (`refused, least L: k`: a `BudgetError` stated the least L, and the plan asked for L keeps k; "
        "`(ckpt)`: the plan checkpoints; `(bound)`: refused for a while loop without a bound that cannot be "
        "checkpointed, and asked again with `loop_bounds={'*': 64}`, as the error says). Every row checks "
        "kept <= budget (or the least) and value and "
        f"gradients equal to STORE_ALL's within {RTOL:g} (the `max error` column, the worst over the budgets).",
        "",
        f"**{len(records)} kernels, {rows} budgets asked, {refused} refused with a working least; "
        f"{len(failed)} kernels with a failure.** Kernels that need a while-loop bound under a budget: "
        f"{', '.join(bounded) or 'none'}.", "",
        "| kernel | sizes | full (B) | " + " | ".join(f"{round(f * 100)}%" for f in FRACTIONS) +
        " | max error | s |",
        "|---|---|---:|" + "---:|" * len(FRACTIONS) + "---:|---:|",
    ]
    for r in records:
        cells = [_cell(row) for row in r["rows"]]
        if len(cells) == 1 and r["rows"][0]["budget"] == "0 B":
            cells = [f"0 B asked: {cells[0]}"] + [""] * (len(FRACTIONS) - 1)
        cells += ["-"] * (len(FRACTIONS) - len(cells))
        errs = [row["error_vs_store_all"] for row in r["rows"] if "error_vs_store_all" in row]
        sizes = ", ".join(f"{k}={v}" for k, v in r.get("sizes", {}).items())
        worst = f"{max(errs):.0e}" if errs else "-"
        lines.append(f"| {r['kernel']} | {sizes} | {r.get('full', '-')} | " + " | ".join(cells) +
                     f" | {worst} | {r['wall_s']:.0f} |")
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- {r['kernel']}: " + "; ".join(r["failures"]) for r in failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("loops", "npbench", "all"), default="all")
    parser.add_argument("--only", help="comma-separated kernel names")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per kernel")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/budget_sweep.md"))
    parser.add_argument("--worker", nargs=2, metavar=("KERNEL", "RECORD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], pathlib.Path(args.worker[1]))
        return
    chosen = cases(args.corpus)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",") if w.strip()}
        unknown = sorted(wanted - {c.name for c in chosen})
        if unknown:
            sys.exit(f"unknown kernel(s) in --corpus {args.corpus}: {', '.join(unknown)}")
        chosen = [c for c in chosen if c.name in wanted]
    started = datetime.datetime.now().isoformat(timespec="minutes")
    begin = time.perf_counter()
    records = []
    for i, case in enumerate(chosen, 1):
        rec = run_worker(case.name, args.timeout)
        records.append(rec)
        status = "FAILED: " + "; ".join(rec["failures"]) if rec["failures"] else "ok"
        print(f"[{i}/{len(chosen)}] {case.name} ({rec['wall_s']:.0f} s): {status}", flush=True)
    text = report(records, " ".join(["python benchmarks/budget_sweep.py"] + sys.argv[1:]), started,
                  time.perf_counter() - begin)
    pathlib.Path(args.out).write_text(text)
    print(text.split("\n\n")[3])
    sys.exit(1 if any(r["failures"] for r in records) else 0)


if __name__ == "__main__":
    main()
