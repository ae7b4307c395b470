"""Reverse over reverse on the whole loop corpus: for each loop program, `gradflow.vjp` of its gradient
program (`grad`, `optimize=False`, tapes included) along a random cotangent, checked against torch's double
backward (`gradflow.verify.tangents.check_grad_of_grad`, float64, rtol 1e-9 / atol 1e-12), or the typed
refusal it gets. A verification sweep, not a timing: the table says which programs differentiate twice.

    OMP_NUM_THREADS=1 python benchmarks/second_order.py [--only lp_lu,lp_jacobi_1d] [--out FILE]

Writes the table to `--out` (default `benchmarks/results/second_order.md`).
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def one(name: str) -> str:
    """The verdict for one program (run in a child process: a crash is a verdict too)."""
    from gradflow.core.errors import GradflowError
    from gradflow.verify.compare import CheckFailure
    from gradflow.verify.programs import cases
    from gradflow.verify.tangents import check_grad_of_grad

    case = {c.name: c for c in cases()}[name]
    try:
        worst = check_grad_of_grad(case)
    except CheckFailure as exc:
        return f"WRONG | {str(exc).splitlines()[0][:150]}"
    except GradflowError as exc:
        return f"refused | {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    return f"ok | worst relative error {worst:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/second_order.md"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("VERDICT " + one(args.one), flush=True)
        return
    from gradflow.verify.programs import cases

    names = [c.name for c in cases() if c.name.startswith("lp_")]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    rows, counts = [], {}
    for name in names:
        start = time.time()
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        verdicts = [line[8:] for line in done.stdout.splitlines() if line.startswith("VERDICT ")]
        verdict = verdicts[0] if verdicts else f"CRASH | exit code {done.returncode}"
        counts[verdict.split(" |")[0]] = counts.get(verdict.split(" |")[0], 0) + 1
        rows.append(f"| {name} | {verdict} | {time.time() - start:.0f} |")
        print(rows[-1], flush=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    text = [f"# Reverse over reverse on the loop corpus ({datetime.date.today()}, {head})", "",
            f"`OMP_NUM_THREADS=1 python benchmarks/second_order.py`: {len(rows)} programs: {summary}.", "",
            "| program | verdict | detail | seconds (build + run) |", "|---|---|---|---:|", *rows, ""]
    pathlib.Path(args.out).write_text("\n".join(text))


if __name__ == "__main__":
    main()
