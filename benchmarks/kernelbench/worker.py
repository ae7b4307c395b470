"""One kernel in one process: build every side, check it, time all of them interleaved, write a JSON record.

The record is rewritten after every stage, so a kernel that runs out of time or crashes still reports what
it got (the driver kills a worker that exceeds its time limit). Stages: inputs at the benchmark size; the
eager torch reference (value and gradients, the yardstick of every check); gradflow's forward and
forward+backward graphs, built and checked; JAX, checked at the test size and at the benchmark size;
`torch.compile` under a deadline; then the timing.
"""

from __future__ import annotations

import json
import pathlib
import time
import traceback
from typing import Any

import numpy as np

from benchmarks.kernelbench import checks, sides, timing
from benchmarks.kernelbench.specs import HEADLINE, Bench

#: `torch.compile` is not tried when the reference's autograd graph has more nodes than this (about one per
#: differentiable torch call): dynamo unrolls Python loops, and would trace a per-element loop reference
#: call by call for minutes.
MAX_TRACED_OPS = 20000
#: Growth of the values over `PROBE_CALLS` repeated in-place calls beyond which inputs are restored
#: before every timed call.
PROBE_CALLS, MAX_GROWTH = 20, 1e3


def _message(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _copies(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in arrays.items()}


def _restore(work: dict[str, np.ndarray], inputs: dict[str, np.ndarray]):
    pairs = [(work[k], v) for k, v in inputs.items()]

    def prep() -> None:
        for dst, src in pairs:
            np.copyto(dst, src)

    return prep


def _blows_up(call: sides.GradflowCall, inputs: dict[str, np.ndarray]) -> bool:
    """Whether repeated calls on the same buffers drive the inputs' values to non-finite or much larger
    magnitudes (the timed calls would then measure arithmetic on values the kernel never sees in use)."""
    for _ in range(PROBE_CALLS):
        call()
    for k, v in inputs.items():
        now = call.arrays[k]
        if not np.all(np.isfinite(now)):
            return True
        if np.max(np.abs(now), initial=0.0) > MAX_GROWTH * max(float(np.max(np.abs(v), initial=0.0)), 1.0):
            return True
    return False


def run(bench: Bench, out: pathlib.Path, skip_torch_compile: bool, compile_timeout: float, repeats: int,
        budget_s: float) -> None:
    import torch

    from benchmarks.peers import kernels as jax_kernels

    case = bench.case
    wrt, of = tuple(case.wrt), case.of
    symbols = dict(bench.symbols)
    rec: dict[str, Any] = {"key": bench.key, "kernel": bench.name, "role": bench.role, "symbols": symbols,
                           "refill": bench.refill, "note": bench.note, "stage": "inputs", "errors": {},
                           "checks": {}, "build_s": {}, "times": {}, "warnings": []}

    def save() -> None:
        out.write_text(json.dumps(rec, indent=1, default=float))

    def stage(name: str) -> None:
        rec["stage"] = name
        save()

    save()
    sdfg = case.to_sdfg()
    inputs = bench.inputs(sdfg)
    f32 = any(v.dtype == np.float32 for v in inputs.values())
    tol = checks.BENCH_RTOL_F32 if f32 else checks.BENCH_RTOL
    rec["dtype"] = "float32" if f32 else "float64"

    # --- eager torch: the reference value and gradients at this size
    stage("torch reference")
    torch_fn = bench.torch_fn()
    ref_value, ref_grads, ref_first, nodes = checks.torch_reference(torch_fn, inputs, wrt, MAX_TRACED_OPS)
    rec["torch_autograd_nodes"] = nodes

    peers: list[timing.Timed] = []

    # --- gradflow
    stage("gradflow forward")
    gf_fwd_runner = gf_both_runner = None
    try:
        start = time.perf_counter()
        gf_fwd_runner = sides.runner_for(sides.gradflow_forward(sdfg))
        rec["build_s"]["gradflow_fwd"] = time.perf_counter() - start
        fresh = _copies(inputs)
        sides.GradflowCall(gf_fwd_runner, fresh, symbols)
        rec["checks"]["gradflow_fwd"] = checks.worst(fresh[of][0], None, ref_value, None)
    except Exception as exc:  # reported per side; the other sides still run
        rec["errors"]["gradflow_fwd"] = _message(exc)
        rec["tracebacks"] = {"gradflow_fwd": traceback.format_exc()[-3000:]}
    stage("gradflow forward+backward")
    try:
        start = time.perf_counter()
        graph = sides.gradflow_fwdbwd(sdfg, wrt, of)
        rec["build_s"]["gradflow_diff"] = time.perf_counter() - start
        gf_both_runner = sides.runner_for(graph)
        rec["build_s"]["gradflow_fwdbwd"] = time.perf_counter() - start
        extra = sides.extra_arrays(graph, inputs, symbols)
        fresh = {**_copies(inputs), **_copies(extra)}
        sides.GradflowCall(gf_both_runner, fresh, symbols)
        if sides.OVERFLOW in fresh and fresh[sides.OVERFLOW][0] != 0:
            raise RuntimeError(f"a while loop ran past its bound of {sides.LOOP_BOUNDS['*']}")
        rec["checks"]["gradflow_fwdbwd"] = checks.worst(
            fresh[of][0], {w: fresh[f"grad_{w}"] for w in wrt}, ref_value, ref_grads)
    except Exception as exc:
        rec["errors"]["gradflow_fwdbwd"] = _message(exc)
        rec.setdefault("tracebacks", {})["gradflow_fwdbwd"] = traceback.format_exc()[-3000:]
        gf_both_runner = None
    for side in ("gradflow_fwd", "gradflow_fwdbwd"):
        err = rec["checks"].get(side)
        if err is not None and not err[0] <= tol:
            rec["errors"][side] = f"wrong: {err[1]} differs from torch by {err[0]:.1e} (tolerance {tol:.0e})"
    save()

    refill = bench.refill
    if not refill and gf_both_runner is not None and "gradflow_fwdbwd" not in rec["errors"]:
        probe = sides.GradflowCall(gf_both_runner, {**_copies(inputs), **_copies(extra)}, symbols)
        if _blows_up(probe, inputs):
            refill = True
            rec["warnings"].append(f"inputs restored before every call: {PROBE_CALLS} repeated calls grew them "
                                   f"by more than {MAX_GROWTH:.0e} or made them non-finite")
    rec["refill"] = refill
    if gf_fwd_runner is not None and "gradflow_fwd" not in rec["errors"]:
        work = _copies(inputs)
        call = sides.GradflowCall(gf_fwd_runner, work, symbols)
        peers.append(timing.Timed("gradflow_fwd", call, _restore(work, inputs) if refill else None))
    if gf_both_runner is not None and "gradflow_fwdbwd" not in rec["errors"]:
        work = {**_copies(inputs), **_copies(extra)}
        call = sides.GradflowCall(gf_both_runner, work, symbols)
        peers.append(timing.Timed("gradflow_fwdbwd", call, _restore(work, inputs) if refill else None))

    # --- eager torch
    tensors, leaves = sides.torch_tensors(inputs, wrt)
    fwd, both = sides.torch_calls(torch_fn, tensors, leaves)
    peers.append(timing.Timed("torch_fwd", fwd))
    peers.append(timing.Timed("torch_fwdbwd", both, first=ref_first))

    # --- JAX
    stage("jax")
    try:
        kernel = jax_kernels()[bench.name]
        rec["checks"]["jax_test_size"] = checks.jax_at_test_size(case, kernel)
        if not rec["checks"]["jax_test_size"][0] <= checks.TEST_RTOL:
            raise RuntimeError(f"disagrees with torch at the test size: {rec['checks']['jax_test_size']}")
        jfwd, jboth = sides.jax_calls(kernel, inputs, wrt, kernel.statics(symbols, inputs))
        start = time.perf_counter()
        value = jfwd()
        rec["build_s"]["jax_fwd"] = time.perf_counter() - start
        start = time.perf_counter()
        both_value, grads = jboth()
        rec["build_s"]["jax_fwdbwd"] = time.perf_counter() - start
        rec["checks"]["jax_fwd"] = checks.worst(float(value), None, ref_value, None)
        rec["checks"]["jax_fwdbwd"] = checks.worst(float(both_value), {k: np.asarray(g) for k, g in grads.items()},
                                                   ref_value, ref_grads)
        if not max(rec["checks"]["jax_fwd"][0], rec["checks"]["jax_fwdbwd"][0]) <= tol:
            raise RuntimeError(f"disagrees with torch at the benchmark size: {rec['checks']['jax_fwdbwd']}")
        peers += [timing.Timed("jax_fwd", jfwd), timing.Timed("jax_fwdbwd", jboth)]
    except Exception as exc:
        rec["errors"]["jax"] = _message(exc)
    save()

    # --- torch.compile
    stage("torch.compile")
    if skip_torch_compile:
        rec["errors"]["torch_compile"] = "skipped (--skip-torch-compile)"
    elif nodes > MAX_TRACED_OPS:
        rec["errors"]["torch_compile"] = (f"not tried: the reference's autograd graph has over {MAX_TRACED_OPS} "
                                          "nodes (per-element Python loops, which dynamo would unroll)")
    else:
        try:
            compiled = torch.compile(torch_fn)
            cfwd, cboth = sides.torch_calls(compiled, tensors, leaves)
            with sides.deadline(compile_timeout):
                start = time.perf_counter()
                cfwd()
                rec["build_s"]["torch_compile_fwd"] = time.perf_counter() - start
                start = time.perf_counter()
                value, grads = cboth()
                rec["build_s"]["torch_compile_fwdbwd"] = time.perf_counter() - start
            err = checks.worst(float(value), {w: (np.zeros(inputs[w].shape) if g is None else g.detach().numpy())
                                              for w, g in zip(wrt, grads)}, ref_value, ref_grads)
            rec["checks"]["torch_compile_fwdbwd"] = err
            if not err[0] <= tol:
                raise RuntimeError(f"disagrees with eager torch: {err}")
            peers += [timing.Timed("torch_compile_fwd", cfwd), timing.Timed("torch_compile_fwdbwd", cboth)]
        except (Exception, sides.Deadline) as exc:
            rec["errors"]["torch_compile"] = _message(exc)
    save()

    # --- timing
    stage("timing")
    results = timing.measure(peers, rounds=repeats, budget_s=budget_s)
    rec["times"] = {name: {clock: s.as_dict() for clock, s in by_clock.items()} for name, by_clock in results.items()}
    for t in peers:
        if isinstance(t.call, sides.GradflowCall):
            bad = [k for k in inputs if not np.all(np.isfinite(t.call.arrays[k]))]
            if bad:
                rec["warnings"].append(f"{t.name}: non-finite values in {', '.join(bad)} after timing")
    stage("done")


def calibrate(bench: Bench, out: pathlib.Path, target_s: float = 1e-3, max_steps: int = 14) -> None:
    """gradflow's forward time at the bench's size, then at sizes grown by sqrt(2) steps (the `scale`
    symbols) until it reaches `target_s` with a 20% margin; records every size tried."""
    case = bench.case
    sdfg = case.to_sdfg()
    runner = sides.runner_for(sides.gradflow_forward(sdfg))
    rec: dict[str, Any] = {"key": bench.key, "kernel": bench.name, "tried": []}
    current = bench
    for step in range(max_steps):
        inputs = current.inputs(sdfg)
        work = _copies(inputs)
        call = sides.GradflowCall(runner, work, current.symbols)
        t = timing.Timed("fwd", call, _restore(work, inputs) if current.refill else None)
        stats = timing.measure([t], rounds=5, round_s=0.02, budget_s=2.0)
        rec["tried"].append({"symbols": dict(current.symbols), "fwd_s": stats["fwd"]["cpu"].median,
                             "fwd_wall_s": stats["fwd"]["wall"].median})
        out.write_text(json.dumps(rec))
        if stats["fwd"]["cpu"].median >= 1.2 * target_s or not bench.scale or bench.role == HEADLINE:
            break
        current = bench.resized(2 ** ((step + 1) / 2))
