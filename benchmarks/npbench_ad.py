"""Status and timing of reverse-mode AD on the NPBench corpus: gradflow against upstream DaCe's `dace.autodiff`.

For every kernel of `tests/corpus/npbench.py` (the 37 NPBench kernels upstream's AD suite differentiates),
each side runs in its own fresh subprocess (a crash or a hang loses one cell, not the table), with its own
empty gradflow build cache so that compile times are cold builds:
- gradflow: time `gradflow.grad(sdfg, wrt, of)` (differentiation only), then the build of the result;
- upstream: time `dace.autodiff.add_backward_pass(sdfg, inputs=wrt, outputs=[of])` on a fresh parse of the
  same program (it edits the SDFG in place), with the options upstream's own test of the kernel passes,
  then the build of the result.
Both builds go through `gradflow.runtime.compile.compile_sdfg` (same compiler flags, same BLAS). Each
result then runs on two seeds of the case's inputs and every gradient is compared with torch.autograd of
the case's float64 reference (rtol 1e-9, atol 1e-12, as the test suite): `ok`, `wrong (...)`, or the
error class with the first line of its message and the stage that raised it.

    OMP_NUM_THREADS=1 python benchmarks/npbench_ad.py [--only atax,lu] [--timeout 300] [--out FILE]

Writes the table (plus machine, versions and full failure messages) to `benchmarks/results/npbench_ad.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

SIDES = ("gradflow", "upstream")
RTOL, ATOL = 1e-9, 1e-12
SEEDS = (0, 1)
#: Extra `add_backward_pass` options, as upstream's own `test_autodiff` of the kernel passes them.
UPSTREAM_OPTIONS = {"nb_durbin": {"simplify": False}}


# ---------------------------------------------------------------------------------------------- worker side


def _first_lines(exc: BaseException, n: int = 3) -> str:
    """The first `n` non-empty lines of the message, the per-run build cache folder shortened to `<cache>`."""
    text = str(exc).replace(os.environ.get("GRADFLOW_CACHE") or "\0", "<cache>")
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n])


def _where(exc: BaseException) -> str:
    """The innermost frame of the traceback inside gradflow or dace: where the error was raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/gradflow/" in f.filename or "/dace/" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename.split("/site-packages/")[-1].split("/src/")[-1]
    return f"{path}:{f.lineno} ({f.name})"


def _extra_arrays(sdfg, case, inputs, fill):
    """Arrays the differentiated SDFG takes beyond the case's inputs, allocated at the case's sizes."""
    import dace

    extra = {}
    for name, desc in sdfg.arrays.items():
        if desc.transient or name in inputs:
            continue
        shape = tuple(int(dace.symbolic.evaluate(dace.symbolic.pystr_to_symbolic(str(s)), case.symbols))
                      for s in desc.shape)
        dtype = desc.dtype.as_numpy_dtype()
        extra[name] = np.full(shape, fill(name) if np.issubdtype(dtype, np.floating) else 0, dtype=dtype)
    return extra


def _check(case, compiled, sdfg, grad_name, fill) -> str:
    """Run on every seed and compare the value of `of` and every gradient with torch: 'ok' or 'wrong (...)'."""
    from gradflow.verify.corpus.case import run_compiled, torch_grads, torch_value

    worst, what = 0.0, ""
    for seed in SEEDS:
        inputs = case.inputs(seed)
        arrays = run_compiled(case, compiled, {**inputs, **_extra_arrays(sdfg, case, inputs, fill)})
        value, expected_value = arrays[case.of][0], torch_value(case, inputs)
        if not np.isclose(value, expected_value, rtol=RTOL, atol=ATOL):
            return f"wrong (value of {case.of}: {value:.6g}, torch {expected_value:.6g})"
        expected = torch_grads(case, inputs)
        for w in case.wrt:
            got, ref = arrays[grad_name(w)], expected[w]
            if np.allclose(got, ref, rtol=RTOL, atol=ATOL):
                continue
            if not np.all(np.isfinite(got)):
                return f"wrong (d{case.of}/d{w} not finite)"
            err = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-300))
            if err > worst:
                worst, what = err, f"d{case.of}/d{w}"
    return "ok" if not what else f"wrong ({what}: max rel err {worst:.1e})"


def worker(side: str, name: str, out: pathlib.Path, diff_only: bool = False) -> None:
    """Differentiate, build and check one kernel on one side; record each stage in `out` as it finishes
    (`diff_only`: stop after differentiating)."""
    import warnings

    warnings.simplefilter("ignore")
    from gradflow.core.graph import Graph
    from gradflow.runtime.compile import compile_sdfg
    from tests.corpus.npbench import CASES_BY_NAME

    case = CASES_BY_NAME[name]
    record = {"kernel": name, "side": side, "diff_s": None, "compile_s": None, "status": None, "stage": "diff"}

    def save():
        out.write_text(json.dumps(record))

    save()
    try:
        sdfg = case.to_sdfg()
        if side == "gradflow":
            import gradflow

            start, cpu = time.perf_counter(), time.process_time()
            result = gradflow.grad(sdfg, wrt=list(case.wrt), of=case.of)
            # gradflow overwrites its gradient outputs: NaN-filled, a result that is never written shows
            grad_name, fill = (lambda w: f"grad_{w}"), (lambda n: np.nan if n.startswith("grad_") else 0.0)
        else:
            from dace.autodiff import add_backward_pass

            start, cpu = time.perf_counter(), time.process_time()
            add_backward_pass(sdfg=sdfg, inputs=list(case.wrt), outputs=[case.of], **UPSTREAM_OPTIONS.get(name, {}))
            result = sdfg
            seed = f"gradient_{case.of}"  # upstream adds into zeroed gradients from the seed d of / d of = 1
            grad_name, fill = (lambda w: f"gradient_{w}"), (lambda n: 1.0 if n == seed else 0.0)
        record.update(diff_wall_s=time.perf_counter() - start, diff_s=time.process_time() - cpu, stage="compile")
        save()
        if diff_only:
            record.update(status="diff only", stage="done")
            save()
            return
        start = time.perf_counter()
        compiled = compile_sdfg(Graph.adopt(result))
        record.update(compile_s=time.perf_counter() - start, stage="run")
        save()
        record.update(status=_check(case, compiled, result, grad_name, fill), stage="done")
    except Exception as exc:  # the table reports any failure by class and message
        first = re.sub(r"^building SDFG '[^']*' in \S+ failed: ", "", _first_lines(exc, 1))  # keep DaCe's cause
        record.update(status=f"{type(exc).__name__} ({record['stage']}): {first}", message=_first_lines(exc, 6),
                      where=_where(exc))
    save()

# ---------------------------------------------------------------------------------------------- driver side


def run_one(side: str, name: str, timeout: float, diff_only: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="npbench_ad_") as tmp:
        out = pathlib.Path(tmp) / "result.json"
        env = dict(os.environ, GRADFLOW_CACHE=str(pathlib.Path(tmp) / "cache"), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", side, name, str(out)]
        cmd += ["--diff-only"] if diff_only else []
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
            crashed = proc.returncode != 0
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            crashed, tail = None, ""
        record = json.loads(out.read_text()) if out.is_file() else {"kernel": name, "side": side, "stage": "start"}
        if record.get("status") is None:
            if crashed is None:
                record["status"] = f"timeout ({record['stage']}, > {timeout:.0f} s)"
            else:
                record["status"] = f"crash ({record['stage']}, exit {proc.returncode}): {tail}"
                record["message"] = "\n".join(proc.stderr.strip().splitlines()[-6:])
        return record


def measure(side: str, name: str, args) -> dict:
    """One full run (differentiate, build, check) unless `--diff-only`, plus differentiation-only runs up
    to `--diff-runs` fresh processes; the differentiation time reported is the least of them."""
    record = run_one(side, name, args.timeout, diff_only=args.diff_only)
    times = [record["diff_s"]] if record.get("diff_s") is not None else []
    for _ in range(max(args.diff_runs, 1) - 1):
        if not times:
            break  # it fails before differentiating: nothing to time
        extra = run_one(side, name, args.timeout, diff_only=True)
        if extra.get("diff_s") is not None:
            times.append(extra["diff_s"])
    if times:
        record["diff_s"] = min(times)
        record["diff_runs"] = len(times)
    return record


def _secs(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _cell(text: str) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 110 else text[:107] + "..."


def _ratio(g, u) -> str:
    return "-" if g is None or u is None or u <= 0 else f"{g / u:.2f}"


def table(rows: dict[str, dict[str, dict]]) -> str:
    head = ("| kernel | gradflow diff s | upstream diff s | diff ratio | gradflow compile s | upstream compile s "
            "| gradflow status | upstream status |\n|---|---:|---:|---:|---:|---:|---|---|\n")
    lines = []
    for name, r in rows.items():
        g, u = r["gradflow"], r["upstream"]
        lines.append(f"| {name.removeprefix('nb_')} | {_secs(g.get('diff_s'))} | {_secs(u.get('diff_s'))} | "
                     f"{_ratio(g.get('diff_s'), u.get('diff_s'))} | "
                     f"{_secs(g.get('compile_s'))} | {_secs(u.get('compile_s'))} | {_cell(g['status'])} | "
                     f"{_cell(u['status'])} |")
    ok = {s: sum(r[s]["status"] == "ok" for r in rows.values()) for s in SIDES}
    diff = {s: [r[s]["diff_s"] for r in rows.values() if r[s].get("diff_s") is not None] for s in SIDES}
    comp = {s: [r[s]["compile_s"] for r in rows.values() if r[s].get("compile_s") is not None] for s in SIDES}
    both = [(r["gradflow"]["diff_s"], r["upstream"]["diff_s"]) for r in rows.values()
            if r["gradflow"].get("diff_s") is not None and r["upstream"].get("diff_s") is not None]
    lines.append(f"| **total** ({len(rows)} kernels) | {sum(diff['gradflow']):.2f} ({len(diff['gradflow'])}) | "
                 f"{sum(diff['upstream']):.2f} ({len(diff['upstream'])}) | "
                 f"{_ratio(sum(diff['gradflow']), sum(diff['upstream']))} | {sum(comp['gradflow']):.2f} "
                 f"({len(comp['gradflow'])}) | {sum(comp['upstream']):.2f} ({len(comp['upstream'])}) | "
                 f"**{ok['gradflow']} ok** | **{ok['upstream']} ok** |")
    slower = [name.removeprefix("nb_") for name, r in rows.items()
              if (r["gradflow"].get("diff_s") or 0) > (r["upstream"].get("diff_s") or float("inf"))]
    summary = (f"\ngradflow differentiates faster than upstream on {len(both) - len(slower)} of {len(both)} kernels"
               + (f"; slower on {', '.join(slower)}" if slower else "") + ".\n")
    return head + "\n".join(lines) + "\n" + summary


def details(rows: dict[str, dict[str, dict]]) -> str:
    out = []
    for name, r in rows.items():
        for side in SIDES:
            rec = r[side]
            if rec["status"] == "ok" or "message" not in rec:
                continue
            where = f" — raised at `{rec['where']}`" if rec.get("where") else ""
            out.append(f"### {name.removeprefix('nb_')}: {side}{where}\n\n```\n{rec['message']}\n```\n")
    return "\n".join(out)


def environment(load_before: tuple[float, ...]) -> str:
    import dace
    import numpy
    import torch

    from gradflow.runtime import blas

    def run(*cmd: str) -> str:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = run("git", "rev-parse", "--short", "HEAD") or "?"
    if run("git", "status", "--porcelain", "src", "tests", "benchmarks/npbench_ad.py"):
        commit += " plus uncommitted changes"
    return (f"- machine: `{run('uname', '-a')}`, {os.cpu_count()} CPUs, OMP_NUM_THREADS=1\n"
            f"- python {platform.python_version()}, dace {dace.__version__}, torch {torch.__version__}, "
            f"numpy {numpy.__version__}, gradflow at commit {commit}\n"
            f"- BLAS for both sides' builds: {blas.describe()}\n"
            f"- load average (1, 5, 15 min) before / after the run: {_load(load_before)} / {_load(os.getloadavg())} "
            "(build times are wall-clock: a loaded machine inflates them; compare the two sides within one run)\n"
            f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}\n")


def _load(avg: tuple[float, ...]) -> str:
    return ", ".join(f"{x:.1f}" for x in avg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated kernels (with or without the nb_ prefix)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per kernel and side")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "npbench_ad.md")
    parser.add_argument("--diff-runs", type=int, default=3,
                        help="fresh processes per side that time the differentiation (the least is reported)")
    parser.add_argument("--diff-only", action="store_true", help="only time the differentiation (no builds, no checks)")
    parser.add_argument("--worker", nargs=3, metavar=("SIDE", "KERNEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        side, name, out = args.worker
        worker(side, name, pathlib.Path(out), args.diff_only)
        return

    from tests.corpus.npbench import CASES_BY_NAME

    names = sorted(CASES_BY_NAME)
    if args.only:
        wanted = {n if n.startswith("nb_") else f"nb_{n}" for n in args.only.split(",") if n}
        unknown = wanted - set(names)
        if unknown:
            parser.error(f"unknown kernels: {', '.join(sorted(unknown))}")
        names = [n for n in names if n in wanted]
    load_before = os.getloadavg()
    rows: dict[str, dict[str, dict]] = {}
    for name in names:
        rows[name] = {side: measure(side, name, args) for side in SIDES}
        g, u = rows[name]["gradflow"], rows[name]["upstream"]
        print(f"{name:16s} gradflow {_secs(g.get('diff_s')):>6s}/{_secs(g.get('compile_s')):>6s} s "
              f"{g['status'][:70]:70s} upstream {_secs(u.get('diff_s')):>6s}/{_secs(u.get('compile_s')):>6s} s "
              f"{u['status'][:60]}", flush=True)
    text = table(rows)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "OMP_NUM_THREADS=1 python benchmarks/npbench_ad.py" + (f" --only {args.only}" if args.only else "") \
        + (" --diff-only" if args.diff_only else "") + (f" --diff-runs {args.diff_runs}" if args.diff_runs != 3 else "")
    args.out.write_text(
        "# Reverse-mode AD on the NPBench corpus: gradflow vs upstream DaCe\n\n"
        f"`{command}` — each kernel and side in a fresh subprocess (timeout {args.timeout:.0f} s), cold builds. "
        "Times in seconds: *diff* is `gradflow.grad` / `dace.autodiff.add_backward_pass` alone, the process's "
        f"CPU time of its first call, the least over {max(args.diff_runs, 1)} fresh processes (CPU time, so that "
        "a loaded machine does not inflate one side more than the other); *compile* the "
        "build of the differentiated SDFG. Status: gradients on two seeds against torch.autograd at rtol 1e-9 "
        "(`ok`, `wrong`), else the error class, the stage that raised it and the first line of its message. "
        "Totals sum the times that exist (their count in parentheses).\n\n"
        + environment(load_before) + "\n" + text + "\n## Failure messages\n\n" + details(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
