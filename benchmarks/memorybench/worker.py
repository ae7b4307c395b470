"""One kernel in one process: differentiate it under every policy, check, count, time, measure, record.

Per policy (`policies.POLICIES`): `grad_graph(program, wrt, of, forwarding=policy)` (optimized, as users get
it); the bytes forwarded to the backward sweep (`gradflow.autodiff.passes.forwarded_bytes`, what the plan
keeps) and, under a budget, whether they are within it (or the `BudgetError` and the least it states); the
transients the compiled SDFG allocates (`allocation.allocated_bytes`); one call on fresh inputs whose value
and gradients must equal `STORE_ALL`'s (a mismatch is an error of the row, reported loudly); then all
policies are timed interleaved with `kernelbench.timing` (medians of single calls with prebuilt arguments),
and each distinct program's peak RSS is measured in a fresh process (`memory.py --rss`), along with the
forward alone (`optimized(program)`) for scale. Policies that build the same program (equal fingerprints)
share one compile, timing and measurement. The record is rewritten after every stage.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from benchmarks.kernelbench import checks, sides, timing
from benchmarks.kernelbench.specs import Bench
from benchmarks.memorybench import allocation, policies

#: a policy's value and gradients must equal STORE_ALL's within this (norm-wise relative; float32: looser)
SAME_RTOL, SAME_RTOL_F32 = 1e-9, 1e-5
RSS_TIMEOUT_S = 300
#: the kernel benchmark's blow-up probe (20 repeated calls) runs only for kernels faster than this per call
PROBE_UNDER_S = 0.5


def _message(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' / '.join(lines[:2])}"[:400]


def _copies(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in arrays.items()}


def _restore(work: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> Callable[[], None]:
    pairs = [(work[k], v) for k, v in inputs.items()]

    def prep() -> None:
        for dst, src in pairs:
            np.copyto(dst, src)

    return prep


def build(bench: Bench, policy: policies.Policy, sdfg, reference_bytes: int | None, row: dict) -> Any:
    """Differentiate under `policy` and fill `row` with the plan's figures; the graph, or None when the
    policy rejected the program (the row says why)."""
    from gradflow.api import grad_graph
    from gradflow.autodiff.budget import BudgetError
    from gradflow.autodiff.passes import forwarded_bytes
    from gradflow.core.errors import GradflowError

    symbols = dict(bench.symbols)
    forwarding = policy.forwarding(reference_bytes or 0, symbols)
    if policy.limit is not None:
        if reference_bytes is None:
            row["error"] = f"no budget: {policies.REFERENCE} did not build, so its bytes are unknown"
            return None
        row["limit"] = policy.limit(reference_bytes)
    start = time.perf_counter()
    try:
        graph = grad_graph(sdfg, list(bench.case.wrt), bench.case.of, forwarding=forwarding)
    except BudgetError as exc:
        row["rejected"] = {"minimum": exc.minimum, "message": _message(exc)}
        return None
    except GradflowError as exc:
        row["error"] = _message(exc)
        return None
    row["build_s"] = time.perf_counter() - start
    ad = graph.meta["ad"]
    row["forwarded"] = forwarded_bytes(graph, symbols)
    plan = ad.forwarding_plan
    if plan.predicted is not None:
        row["predicted"] = plan.predicted.predicted_bytes
        row["predicted_work"] = plan.predicted.predicted_cost
        row["minimum"] = plan.predicted.minimum_bytes
    try:
        row["rerun_work"] = plan.total_work(symbols)
    except GradflowError:  # a rerun inside a loop whose trip count is read from data has no number
        row["rerun_work"] = "unknown (a trip count read from data)"
    row["recomputed"] = sorted(ad.recomputed)
    if "limit" in row:
        row["respected"] = row["forwarded"] <= row["limit"]
    row["allocated"] = allocation.allocated_bytes(graph.sdfg, symbols).as_dict()
    row["fingerprint"] = graph.fingerprint
    return graph


def run(bench: Bench, out: pathlib.Path, repeats: int, budget_s: float, rss: bool) -> None:
    from gradflow.optimize import optimized

    case = bench.case
    wrt, of = tuple(case.wrt), case.of
    symbols = dict(bench.symbols)
    rec: dict[str, Any] = {"key": bench.key, "kernel": bench.name, "symbols": symbols, "stage": "inputs",
                           "rows": {}, "errors": {}, "warnings": []}

    def save(stage: str | None = None) -> None:
        if stage:
            rec["stage"] = stage
        out.write_text(json.dumps(rec, indent=1, default=float))

    save()
    sdfg = case.to_sdfg()
    inputs = bench.inputs(sdfg)
    f32 = any(v.dtype == np.float32 for v in inputs.values())
    tol = SAME_RTOL_F32 if f32 else SAME_RTOL

    graphs: dict[str, Any] = {}
    calls: dict[str, sides.GradflowCall] = {}
    reference: tuple | None = None
    reference_bytes: int | None = None
    extra: dict[str, np.ndarray] = {}
    for policy in policies.POLICIES:
        save(f"build {policy.name}")
        row = rec["rows"].setdefault(policy.name, {})
        graph = build(bench, policy, sdfg, reference_bytes, row)
        save()
        if graph is None:
            continue
        if policy.name == policies.REFERENCE:
            reference_bytes = row["forwarded"]
            extra = sides.extra_arrays(graph, inputs, symbols)
        try:
            start = time.perf_counter()
            runner = sides.runner_for(graph)
            row["compile_s"] = time.perf_counter() - start
            fresh = {**_copies(inputs), **_copies(extra)}
            call = sides.GradflowCall(runner, fresh, symbols)  # runs it once on `fresh`
        except Exception as exc:  # noqa: BLE001 - a row that does not build or run is reported, not fatal
            row["error"] = _message(exc)
            continue
        if sides.OVERFLOW in fresh and fresh[sides.OVERFLOW][0] != 0:
            row["error"] = f"a while loop ran past its bound of {policies.LOOP_BOUNDS['*']}"
            continue
        got = (fresh[of][0], {w: fresh[f"grad_{w}"] for w in wrt})
        if reference is None:
            reference = got
        err, what = checks.worst(got[0], got[1], reference[0], reference[1])
        row["vs_store_all"] = [err, what]
        if not err <= tol:
            row["error"] = (f"GRADIENT MISMATCH: {what} differs from store_all's by {err:.1e} "
                            f"(tolerance {tol:.0e})")
            print(f"{bench.key}: {policy.name}: {row['error']}", file=sys.stderr, flush=True)
            continue
        graphs[policy.name] = graph
        calls[policy.name] = call
    save()

    # --- timing: one peer per distinct program
    save("timing")
    refill = bench.refill
    if not refill and policies.REFERENCE in calls and timing.time_once(
            timing.Timed("probe", calls[policies.REFERENCE]))[1] < PROBE_UNDER_S:
        from benchmarks.kernelbench.worker import _blows_up  # the kernel benchmark's probe, reused

        probe = sides.GradflowCall(sides.runner_for(graphs[policies.REFERENCE]),
                                   {**_copies(inputs), **_copies(extra)}, symbols)
        refill = _blows_up(probe, inputs)
    rec["refill"] = refill
    first_of: dict[str, str] = {}
    peers = []
    for name, graph in graphs.items():
        same = first_of.setdefault(graph.fingerprint, name)
        if same != name:
            rec["rows"][name]["same_program_as"] = same
            continue
        work = {**_copies(inputs), **_copies(extra)}
        call = sides.GradflowCall(sides.runner_for(graph), work, symbols)
        peers.append(timing.Timed(name, call, _restore(work, inputs) if refill else None))
    results = timing.measure(peers, rounds=repeats, budget_s=budget_s)
    for name in graphs:
        stats = results.get(rec["rows"][name].get("same_program_as", name))
        if stats is not None:
            rec["rows"][name]["time"] = {clock: s.as_dict() for clock, s in stats.items()}
    save()

    # --- peak RSS, each distinct program in a fresh process; the forward alone for scale
    if rss:
        save("rss")
        why = allocation.rss_supported()
        if why is not None:
            rec["errors"]["rss"] = why
        else:
            with tempfile.TemporaryDirectory(prefix="memory_rss_") as tmp:
                folder = pathlib.Path(tmp)
                arrays = folder / "arrays.npz"
                np.savez(arrays, **inputs, **extra)
                forward = optimized(sdfg)
                rec["forward_allocated"] = allocation.allocated_bytes(forward.sdfg, symbols).as_dict()
                targets = {"forward": forward, **{n: g for n, g in graphs.items()
                                                  if "same_program_as" not in rec["rows"][n]}}
                for name, graph in targets.items():
                    measured = measure_rss(graph, arrays, symbols, folder / f"{len(os.listdir(folder))}")
                    if name == "forward":
                        rec["forward_rss"] = measured
                    else:
                        rec["rows"][name]["rss"] = measured
                    save()
                for name, row in rec["rows"].items():
                    if "same_program_as" in row and "rss" in rec["rows"][row["same_program_as"]]:
                        row["rss"] = rec["rows"][row["same_program_as"]]["rss"]
    save("done")


def measure_rss(graph, arrays: pathlib.Path, symbols: dict, stem: pathlib.Path) -> dict:
    """Peak RSS of `graph`'s first call, measured by `memory.py --rss` in a fresh process."""
    program = stem.with_suffix(".sdfg")
    result = stem.with_suffix(".json")
    graph.sdfg.save(str(program))
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, **allocation.worker_env()}
    cmd = [sys.executable, str(root / "benchmarks" / "memory.py"), "--rss", str(program), str(arrays),
           json.dumps({"symbols": symbols, "fingerprint": graph.fingerprint}), str(result)]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=RSS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {RSS_TIMEOUT_S} s"}
    if proc.returncode != 0 or not result.is_file():
        return {"error": f"exited with {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-2:])}
    return json.loads(result.read_text())


def rss_main(program: str, arrays: str, about: str, out: str) -> None:
    """`memory.py --rss`: load the SDFG and the arguments, then measure. The SDFG is keyed by the
    fingerprint of the graph it was saved from, so the compiled library is the cache's (a JSON round trip
    can change what a nested SDFG hashes to, and a rebuild here would take minutes)."""
    import dace

    from gradflow.core.graph import Graph
    from gradflow.runtime.calling import Runner
    from gradflow.runtime.plan import ARRAY, SCALAR
    from gradflow.runtime.validate import data_pointer

    given = json.loads(about)
    sizes = {k: int(v) for k, v in given["symbols"].items()}
    start = time.perf_counter()
    graph = Graph.adopt(dace.SDFG.from_file(program))
    graph._fingerprint.append(given["fingerprint"])  # noqa: SLF001 - the saved graph's, see above
    runner = Runner(graph)
    load_s = time.perf_counter() - start
    plan = runner.plan
    wanted = set(plan.names)
    with np.load(arrays) as stored:
        values = {k: np.ascontiguousarray(stored[k]) for k in stored.files if k in wanted}
    fixed = {s: sizes[s] for s in plan.symbols if s in sizes}
    inferred = runner.symbols_for(values, fixed)
    args = [data_pointer(values[a.name]) if a.kind == ARRAY else values[a.name].item() if a.kind == SCALAR
            else inferred[a.name] for a in plan.args]
    measured = allocation.peak_rss(runner.kernel, inferred, args)
    pathlib.Path(out).write_text(json.dumps({**measured, "load_s": load_s}))
