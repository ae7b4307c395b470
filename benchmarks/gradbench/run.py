"""Relay: run an upstream GradBench eval against gradflow's tool and the JAX and PyTorch tools, in one run.

    python benchmarks/gradbench/run.py lse --gradbench /path/to/gradbench [--eval-args -n 2500 5000]

The eval (GradBench's `python/gradbench/gradbench/evals/<eval>/run.py`) runs in its own process and talks
to gradflow's tool (`tool.py`) as it would through GradBench's driver: every message goes to gradflow,
gradflow's answer goes back to the eval. The same messages also go to the reference tools, one tool at a
time (their timings never overlap), and their answers are kept for the comparison.

Validation: the upstream evals check outputs against a C++ reference that needs a header from the web;
here gradflow's outputs are compared with the JAX and PyTorch tools' outputs instead, element by element,
with a relative tolerance: |a - b| <= rtol * max(|a|, |b|) + rtol * 1e-6 * (largest |b| of the output), so
values far below the output's scale (a gradient that is zero up to rounding) are compared at that scale.
The upstream comparison is absolute below 1 (an all-zero lse gradient would pass it); this one is not.
The eval's own analysis is recorded too (for `hello` it is a Python check). `shim.py` says how the eval
and the JAX and PyTorch tools are run (a stub for the C++ reference; JAX's CPU dispatch made synchronous,
without which its tool times the dispatch of a call, not its computation; both tools in float64).

Times: the minimum over the runs of each `evaluate` timing (the tools' first runs, which include JAX's
compilation, only count if they are the fastest). All tools run with one thread (OMP_NUM_THREADS=1,
XLA_FLAGS for one Eigen thread, JAX's tool pins itself to CPU 0 as upstream does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCES = ("jax", "pytorch")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
              "PYTHONWARNINGS": "ignore"}


class Process:
    """A child speaking JSON lines on stdin/stdout."""

    def __init__(self, command: list[str], cwd: Path, env: dict, log) -> None:
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True, bufsize=1)

    def send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict | None:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def ask(self, message: dict) -> dict | None:
        self.send(message)
        return self.receive()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _numbers(value) -> list[float]:
    """The numbers of a JSON value, in a fixed order (dict keys sorted)."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _numbers(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


def _shape(value):
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__ if not isinstance(value, (int, float)) else "number"


def compare(got, want, rtol: float) -> tuple[bool, float]:
    """(agrees within `rtol` as the module docstring says, the largest relative error)."""
    if _shape(got) != _shape(want):
        return False, math.inf
    a, b = _numbers(got), _numbers(want)
    scale = max((abs(x) for x in b), default=0.0)
    worst, ok = 0.0, True
    for x, y in zip(a, b):
        if math.isnan(x) or math.isnan(y):
            ok &= math.isnan(x) and math.isnan(y)
            continue
        floor = rtol * 1e-6 * scale
        error = abs(x - y) / max(abs(x), abs(y), floor / rtol if floor else 1e-300)
        worst = max(worst, error)
        ok &= abs(x - y) <= rtol * max(abs(x), abs(y)) + floor
    return ok, worst


def best(response: dict | None) -> float | None:
    """The fastest `evaluate` timing of a response, in milliseconds."""
    if not response or not response.get("success"):
        return None
    times = [t["nanoseconds"] for t in response.get("timings") or [] if t["name"] == "evaluate"]
    return min(times) / 1e6 if times else None


def relay(eval_name: str, gradbench: Path, tools: tuple[str, ...], eval_args: list[str], rtol: float,
          log_path: Path, reference_functions: tuple[str, ...] = ()) -> list[dict]:
    """Run one eval; the reference tools evaluate only `reference_functions` when given (a Jacobian that
    takes them hours at the larger workloads), their other records say they were not asked."""
    python = sys.executable
    package = gradbench / "python" / "gradbench"
    env = {**os.environ, **ONE_THREAD,
           "PYTHONPATH": os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    stderr = open(log_path.with_suffix(".stderr.log"), "a")
    shim = str(HERE / "shim.py")
    evaluator = Process([python, shim, "eval", str(package / "gradbench" / "evals" / eval_name / "run.py"),
                         *eval_args], gradbench, env, stderr)
    commands = {"gradflow": [python, str(HERE / "tool.py")],
                "jax": [python, shim, "jax", str(package / "gradbench" / "tools" / "jax" / "run.py")],
                "pytorch": [python, shim, "pytorch", str(package / "gradbench" / "tools" / "pytorch" / "run.py")]}
    children = {t: Process(commands[t], gradbench, env, stderr) for t in ("gradflow", *tools)}
    records, pending = [], {}
    defined: dict[str, set[str]] = {t: set() for t in children}
    with open(log_path, "a") as log:
        try:
            while True:
                message = evaluator.receive()
                if message is None or message.get("kind") == "end":
                    break
                # a tool whose `define` failed for the module is not asked to evaluate it (upstream tools exit)
                asked = {t: p for t, p in children.items()
                         if message["kind"] != "evaluate" or message["module"] in defined[t]}
                skipped = {t for t in tools if message["kind"] == "evaluate" and reference_functions
                           and message["function"] not in reference_functions}
                answers = {t: p.ask(message) for t, p in asked.items() if t not in skipped} | {
                    t: {"id": message["id"], "success": False, "error": "the tool does not define this module"}
                    for t in children if t not in asked} | {
                    t: {"id": message["id"], "success": False, "error": "not asked (--reference-functions)"}
                    for t in skipped & set(asked)}
                if message["kind"] == "define":
                    for t, answer in answers.items():
                        if answer and answer.get("success"):
                            defined[t].add(message["module"])
                evaluator.send(answers["gradflow"] or {"id": message["id"]})
                if message["kind"] == "analysis" and message.get("of") in pending:
                    pending[message["of"]]["eval_analysis"] = {"valid": message["valid"],
                                                               "error": (message.get("error") or "")[:500]}
                if message["kind"] != "evaluate":
                    continue
                record = {"eval": eval_name, "function": message["function"],
                          "workload": message.get("description", ""), "id": message["id"]}
                for t, answer in answers.items():
                    record[t] = {"ms": best(answer), "success": bool(answer and answer.get("success")),
                                 "error": ((answer or {}).get("error") or "")[-800:]}
                    if t == "gradflow":
                        record[t]["prepare_ms"] = next((x["nanoseconds"] / 1e6 for x in (answer or {}).get(
                            "timings") or [] if x["name"] == "prepare"), None)
                mine = answers["gradflow"]
                for t in tools:
                    theirs = answers[t]
                    if mine and mine.get("success") and theirs and theirs.get("success"):
                        ok, worst = compare(mine["output"], theirs["output"], rtol)
                        record[t]["agrees"], record[t]["max_rel_error"] = ok, worst
                records.append(record)
                pending[message["id"]] = record
                print(_line(record, tools), flush=True)
        finally:
            for p in (evaluator, *children.values()):
                p.close()
        for record in records:
            log.write(json.dumps(record) + "\n")
    if evaluator.proc.returncode:
        raise SystemExit(f"the {eval_name} eval exited with status {evaluator.proc.returncode}: see "
                         f"{log_path.with_suffix('.stderr.log')}")
    return records


def _ms(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _line(record: dict, tools) -> str:
    parts = [f"{record['eval']} {record['function']} {record['workload']}: gradflow {_ms(record['gradflow']['ms'])} ms"]
    for t in tools:
        r = record[t]
        parts.append(f"{t} {_ms(r['ms'])} ms" + (f" (agrees: {r.get('agrees')}, {r.get('max_rel_error', math.nan):.1e})"
                                                   if "agrees" in r else ""))
    if not record["gradflow"]["success"]:
        parts.append("gradflow FAILED: " + record["gradflow"]["error"].strip().splitlines()[-1][:200])
    return "; ".join(parts)


def report(records: list[dict], tools=REFERENCES) -> str:
    """A markdown table: per eval, function and workload, each tool's best time, gradflow's ratio to each,
    and whether its output agrees."""
    head = "| eval | function | workload | gradflow ms | " + " | ".join(f"{t} ms" for t in tools) + " | " + \
        " | ".join(f"gradflow / {t}" for t in tools) + " | validated |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        mine = r["gradflow"]["ms"]
        ratios = [f"{mine / r[t]['ms']:.2f}" if mine and r.get(t, {}).get("ms") else "—" for t in tools]
        checks = [f"{t} {r[t]['max_rel_error']:.0e}" + ("" if r[t]["agrees"] else " **NO**")
                  for t in tools if "agrees" in r.get(t, {})]
        valid = ", ".join(checks) if r["gradflow"]["success"] else "gradflow failed: " + \
            (r["gradflow"]["error"].strip().splitlines() or ["?"])[-1][:120]
        rows.append(f"| {r['eval']} | {r['function']} | {r['workload']} | {_ms(mine)} | "
                    + " | ".join(_ms(r.get(t, {}).get("ms")) for t in tools) + " | " + " | ".join(ratios)
                    + f" | {valid} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evals", nargs="+",
                        help="GradBench evals to run (hello, lse, llsq, ode, gmm, lstm, ba, ht, kmeans)")
    parser.add_argument("--gradbench", type=Path, default=Path(os.environ.get("GRADBENCH", "gradbench")),
                        help="a checkout of github.com/gradbench/gradbench (or $GRADBENCH)")
    parser.add_argument("--tools", nargs="*", default=list(REFERENCES), choices=REFERENCES,
                        help="reference tools to run beside gradflow")
    parser.add_argument("--eval-args", nargs=argparse.REMAINDER, default=[],
                        help="arguments passed to every eval (e.g. --min-seconds 0.2); must come last")
    parser.add_argument("--reference-functions", nargs="*", default=[],
                        help="ask the reference tools for these functions only (default: all)")
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--log", type=Path, default=Path("gradbench.jsonl"), help="JSON lines, appended")
    parser.add_argument("--report", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    if not (args.gradbench / "python" / "gradbench" / "gradbench" / "eval.py").exists():
        parser.error(f"--gradbench {args.gradbench} is not a GradBench checkout "
                     "(no python/gradbench/gradbench/eval.py)")
    records = []
    for name in args.evals:
        records += relay(name, args.gradbench.resolve(), tuple(args.tools), args.eval_args, args.rtol, args.log,
                         tuple(args.reference_functions))
    table = report(records, tuple(args.tools))
    if args.report:
        args.report.write_text(table)
    print(table)
    failed = [r for r in records if not r["gradflow"]["success"]
              or any(r.get(t, {}).get("agrees") is False for t in args.tools)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
