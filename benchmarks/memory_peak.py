"""Peak memory of one forward+backward call under falling byte budgets, measured, next to the peers' ways of
saving memory: does a smaller `Forwarding.budget` give a smaller peak, and how does it compare?

Kernels (float64, N elements, T steps, a scalar loss):
- `whole_array_update` (the loop corpus's `lp_whole_array_update`): A = tanh(A) * W + 0.1 * A, T times;
  each step's reverse needs its own A, so storing keeps T states;
- `jacobi_1d` (`lp_jacobi_1d`): a linear 3-point stencil between A and B (the loss A*A*B is not linear).

Models (`--models`, default mlp resnet_block transformer_layer): one training step of a model-zoo model at
a batch where activations are megabytes, through `gradflow.torch.compile`, next to eager torch,
`torch.utils.checkpoint` around each child module and `torch.compile` at falling
`activation_memory_budget`s (`benchmarks/memorybench/models.py` says how each is measured).

Configurations:
- gradflow: `value_and_grad` with `STORE_ALL`, then `Forwarding.budget` at 100/50/25/10% of STORE_ALL's
  forwarded bytes (planned at the call: no `sizes=`), and `Forwarding.checkpoint(snapshots=S)`;
- torch eager autograd (stores all), `torch.utils.checkpoint.checkpoint_sequential` in S segments, and
  `torch.compile` (inductor) of the T-step forward at `activation_memory_budget` 1, 0.5, 0.25, 0.1;
- JAX `jit(grad)` of a `lax.scan` (stores all), the scan in S blocks each under `jax.checkpoint`, and the
  step under `jax.checkpoint` with the `nothing_saveable` policy.

Measure: every configuration runs in a fresh process with `MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB (large
blocks are fresh mappings, returned to the system when freed, so freed memory does not hide later
allocations). The process builds what it runs and warms up. torch calls once (first-use allocations).
JAX's runs are compiled ahead of time and measured on their first run, after another small program warmed
the runtime up (XLA may reuse a finished run's buffers, so a second run measured nothing or everything by
chance); XLA's own count of its temporaries is given beside them. gradflow builds the same function twice
and calls the first (the compiled library, OpenBLAS and OpenMP warmed up), since DaCe allocates a program's
transients when its state is initialised, at the first call; the second function's program (planned for
the call's sizes) and library are built before the measured call too. Then Linux's high-water mark is
reset (`/proc/self/clear_refs`) and one call is made (for gradflow, the second function's first: its
state's initialisation and its call). *Peak* is `VmHWM` after
the call minus `VmRSS` before it: the bytes the call made resident beyond its inputs, whatever allocated
them. gradflow's rows also give what its plan forwards (`ForwardingPlan.total_bytes`) and the budget.

    OMP_NUM_THREADS=1 python benchmarks/memory_peak.py [--n 20000] [--t 200] [--snapshots 10]
        [--kernels whole_array_update jacobi_1d] [--models mlp resnet_block transformer_layer]
        [--out benchmarks/results/memory_peak.md]

A check closes the report: within gradflow's rows a smaller budget never raises the peak by more than a
MiB, and every gradflow configuration gives the same gradient (squared norms; 1e-5 relative for the
float32 models). That cross-check is what caught a wrong rename in `share_dead_buffers` on the MLP.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import numpy as np  # noqa: E402

from benchmarks.memorybench.allocation import MMAP_THRESHOLD, _status, reset_peak  # noqa: E402
from benchmarks.memorybench.models import COMPILE_BUDGETS, FRACTIONS  # noqa: E402

CASE = {"jacobi_1d": "lp_jacobi_1d", "whole_array_update": "lp_whole_array_update"}


def inputs_for(kernel: str, n: int) -> dict:
    rng = np.random.default_rng(0)
    inputs = {"A": rng.uniform(-1, 1, n), "S": np.zeros(1)}
    inputs.update({"B": rng.uniform(-1, 1, n)} if kernel == "jacobi_1d" else {"W": rng.uniform(0.5, 1.5, n)})
    return inputs


# ---- gradflow --------------------------------------------------------------------------------------------


def _policy(spec: dict):
    import gradflow

    if spec["policy"] == "store_all":
        return gradflow.STORE_ALL
    if spec["policy"] == "checkpoint":
        return gradflow.Forwarding.checkpoint(snapshots=spec["snapshots"])
    return gradflow.Forwarding.budget(spec["bytes"])


def _gradflow_function(kernel: str, policy):
    import gradflow
    from gradflow.verify.corpus import loops

    case = loops.CASES_BY_NAME[CASE[kernel]]
    return gradflow.value_and_grad(case.program.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=policy)


def store_all_bytes(kernel: str, n: int, t: int) -> int:
    """What STORE_ALL forwards at these sizes (the budgets are fractions of it)."""
    from gradflow.api import grad_graph
    from gradflow.verify.corpus import loops

    case = loops.CASES_BY_NAME[CASE[kernel]]
    graph = grad_graph(case.program.to_sdfg(), list(case.wrt), case.of)
    return graph.meta["ad"].forwarding_plan.total_bytes({"N": n, "T": t})


def gradflow_child(spec: dict) -> dict:
    if "model" in spec:
        from benchmarks.memorybench import models

        step, kept, policy, norm = models.gradflow_steps(spec["model"], _policy(spec))
        return {"peak": _peak(step), "kept": kept, "policy": policy, "grad": norm}
    n, t = spec["n"], spec["t"]
    inputs = inputs_for(spec["kernel"], n)
    warm, measured = (_gradflow_function(spec["kernel"], _policy(spec)) for _ in range(2))
    warm(**{k: v.copy() for k, v in inputs.items()}, T=t)
    args = {k: v.copy() for k, v in inputs.items()}
    # what is built once per function (the differentiated program, planned at the call or not, and its
    # loaded library) is built before the measured call, which then initialises its state and runs
    built = measured._built if measured._at_call is None else measured._at_call((), {**args, "T": t})  # noqa: SLF001
    _ = built.invoker.runner  # compiles (from the cache) and loads the library
    peak = _peak(lambda: measured(**args, T=t))
    _, grads = measured(**{k: v.copy() for k, v in inputs.items()}, T=t)
    ((_, plan),) = measured.plans.items() if measured.plans else ((None, None),)
    kept = plan.total_bytes({"N": n, "T": t}) if plan is not None else store_all_bytes(spec["kernel"], n, t)
    return {"peak": peak, "kept": kept, "policy": plan.policy if plan is not None else "store_all",
            "grad": _norm(grads)}


# ---- peers -----------------------------------------------------------------------------------------------


def peer_calls(kernel: str, n: int, t: int, snapshots: int) -> list[tuple[str, object, object]]:
    """(label, call, XLA's temporary bytes or None) of every peer configuration, built in the child that
    runs it. torch's calls are called once before the measured one; JAX's are ahead-of-time compiled
    executables measured on their first run (XLA's runtime reuses a finished call's buffers, so a second
    run measured nothing or everything by chance), the runtime warmed up by another small program."""
    from benchmarks.checkpoint import torch_runs

    inputs = inputs_for(kernel, n)
    runs = torch_runs(kernel, n, t, snapshots, inputs, compile_budgets=COMPILE_BUDGETS)
    calls = [(label, call, None) for label, call, _, _ in runs]
    return calls + _jax_runs(kernel, n, t, snapshots, inputs)


def _jax_runs(kernel: str, n: int, t: int, snapshots: int, inputs: dict) -> list[tuple[str, object, object]]:
    """JAX: the scan storing all, the scan in blocks under `jax.checkpoint`, and the step under
    `jax.checkpoint(policy=nothing_saveable)`."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    if kernel == "jacobi_1d":
        def make_step(_):
            def step(x, _):
                a, b = x
                b = b.at[1:-1].set(0.33333 * (a[:-2] + a[1:-1] + a[2:]))
                a = a.at[1:-1].set(0.33333 * (b[:-2] + b[1:-1] + b[2:]))
                return (a, b), None
            return step

        def loss(x):
            return (x[0] * x[0] * x[1]).sum()

        x0, params = (jnp.asarray(inputs["A"]), jnp.asarray(inputs["B"])), ()
    else:
        weights = jnp.arange(1, n + 1, dtype=jnp.float64)

        def make_step(w):
            return lambda a, _: (jnp.tanh(a) * w + 0.1 * a, None)

        def loss(a):
            return (a * weights).sum()

        x0, params = jnp.asarray(inputs["A"]), jnp.asarray(inputs["W"])
    block = t // snapshots

    def plain(x, w):
        return loss(jax.lax.scan(make_step(w), x, None, length=t)[0])

    def blocked(x, w):
        run_block = jax.checkpoint(lambda y: jax.lax.scan(make_step(w), y, None, length=block)[0])
        out = jax.lax.scan(lambda y, _: (run_block(y), None), x, None, length=snapshots)[0]
        return loss(jax.lax.scan(make_step(w), out, None, length=t - block * snapshots)[0])

    def remat(x, w):
        step = jax.checkpoint(make_step(w), policy=jax.checkpoint_policies.nothing_saveable)
        return loss(jax.lax.scan(step, x, None, length=t)[0])

    jax.block_until_ready(jax.jit(lambda v: jnp.sum(jnp.tanh(v)))(jnp.ones(8)))  # the runtime's first use
    runs = []
    for label, fn in [("jax scan (stores all)", plain), (f"jax checkpoint ({snapshots} blocks)", blocked),
                      ("jax scan, step under jax.checkpoint(nothing_saveable)", remat)]:
        exe = jax.jit(jax.grad(fn, argnums=(0, 1))).lower(x0, params).compile()
        runs.append((label, lambda exe=exe: jax.block_until_ready(exe(x0, params)),
                     exe.memory_analysis().temp_size_in_bytes))
    return runs


def peer_child(spec: dict) -> dict:
    """One peer configuration measured (`index`), or (`index` None) the labels of all of them."""
    if "model" in spec:
        from benchmarks.memorybench import models

        _, kind, budget = models.peer_labels()[spec["index"]]
        return {"peak": _peak(models.peer_step(spec["model"], kind, budget))}
    calls = peer_calls(spec["kernel"], spec["n"], spec["t"], spec["snapshots"])
    if spec.get("index") is None:
        return {"labels": [label for label, _, _ in calls]}
    label, call, temp = calls[spec["index"]]
    if temp is None:
        call()
    return {"peak": _peak(call), "label": label, "xla_temp": temp}


# ---- measuring -------------------------------------------------------------------------------------------


def _peak(call) -> int:
    """Bytes made resident by `call()` above the resident set before it (see the module docstring)."""
    reset_peak()
    before = _status()["VmRSS"]
    call()
    return _status()["VmHWM"] - before


def _norm(grads) -> float:
    values = grads.values() if isinstance(grads, dict) else [grads]
    return float(sum(np.sum(np.asarray(v, dtype=np.float64) ** 2) for v in values))


def _model_store_all(spec: dict) -> dict:
    from benchmarks.memorybench import models

    return {"bytes": models.store_all_bytes(spec["model"])}


def run_child(spec: dict) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "OMP_NUM_THREADS": "1",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True,
                          text=True, timeout=1800, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": " | ".join(proc.stderr.strip().splitlines()[-2:])[:300]}
    return json.loads(lines[-1])


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.2f}"


def _refusal(error: str) -> str:
    """A table cell for a configuration that did not run: a budget below the least gives that least."""
    least = re.search(r"the least any plan needs is (\d+) bytes", error)
    if least:
        return f"refused: the least that works is {mib(int(least.group(1)))} MiB"
    return "error: " + " ".join(error.split()).replace("|", "/")


def _gradflow_rows(base: dict, full: int) -> tuple[list[str], list[tuple[str, int]], list[float]]:
    """gradflow's STORE_ALL row and its budget rows at `FRACTIONS` of `full` bytes, each in a child process
    (`base` names the kernel or the model): (table lines, (row, peak) of those that ran, gradient norms)."""
    lines, peaks, norms = [], [], []
    for fraction in (None, *FRACTIONS):
        spec = {**base, "side": "gradflow", "policy": "store_all" if fraction is None else "budget",
                "bytes": int(full * (fraction or 1))}
        row = run_child(spec)
        name = "gradflow STORE_ALL" if fraction is None else f"gradflow budget {fraction:.0%}"
        if "error" in row:
            lines.append(f"| {name} | {mib(spec['bytes'])} | {_refusal(row['error'])} | |")
            continue
        shown = row["policy"] if fraction is not None else "store_all"
        lines.append(f"| {name} (`{shown}`) | {mib(spec['bytes']) if fraction is not None else '-'} "
                     f"| {mib(row['kept'])} | {mib(row['peak'])} |")
        peaks.append((name, row["peak"]))
        norms.append(row["grad"])
    return lines, peaks, norms


def kernel_report(kernel: str, n: int, t: int, snapshots: int) -> tuple[list[str], list[str]]:
    """(table lines, problems found) for one kernel."""
    full = store_all_bytes(kernel, n, t)
    lines = [f"\n### {kernel} (N = {n}, T = {t}; one state = {mib(8 * n)} MiB)\n",
             "| configuration | budget MiB | forwarded MiB (gradflow) or XLA temporaries MiB (JAX) | peak MiB |",
             "|---|---:|---:|---:|"]
    problems = []
    rows, peaks, norms = _gradflow_rows({"kernel": kernel, "n": n, "t": t}, full)
    lines += rows
    spec = {"kernel": kernel, "n": n, "t": t, "side": "gradflow", "policy": "checkpoint", "snapshots": snapshots}
    row = run_child(spec)
    lines.append(f"| gradflow checkpoint({snapshots}) | - | {mib(row.get('kept'))} | "
                 f"{mib(row.get('peak')) if 'peak' in row else 'error: ' + row['error']} |")
    norms += [row["grad"]] if "grad" in row else []
    peer = {"kernel": kernel, "n": n, "t": t, "side": "peer", "snapshots": snapshots}
    for k, label in enumerate(run_child({**peer, "index": None}).get("labels", [])):
        row = run_child({**peer, "index": k})
        lines.append(f"| {label} | - | {mib(row.get('xla_temp'))} | "
                     f"{mib(row.get('peak')) if 'peak' in row else 'error: ' + row['error']} |")
    problems += _falling(kernel, peaks)
    if norms and max(norms) - min(norms) > 1e-9 * max(norms):
        problems.append(f"{kernel}: gradflow's configurations disagree on the gradient (squared norms {norms})")
    return lines, problems


def _falling(label: str, peaks: list[tuple[str, int]]) -> list[str]:
    """Where a smaller budget (the next row) made a higher peak, beyond a MiB of slack (first-use
    allocations of the runtime vary by that much)."""
    return [f"{label}: {b} peaks at {mib(pb)} MiB, above {a}'s {mib(pa)} MiB"
            for (a, pa), (b, pb) in zip(peaks, peaks[1:]) if pb > pa + 2**20]


def model_report(model: str) -> tuple[list[str], list[str]]:
    """(table lines, problems found) for one model of the zoo (`benchmarks/memorybench/models.py`)."""
    from benchmarks.memorybench import models

    full = run_child({"side": "store_all_bytes", "model": model})
    if "error" in full:
        return [f"\n### {model}: error: {full['error']}\n"], [f"{model}: {full['error']}"]
    full = full["bytes"]
    lines = [f"\n### {model} (batch {models.BATCH[model]}, float32; STORE_ALL forwards {mib(full)} MiB)\n",
             "| configuration | budget MiB | forwarded MiB | peak MiB |", "|---|---:|---:|---:|"]
    rows, peaks, norms = _gradflow_rows({"model": model}, full)
    lines += rows
    compiled = []
    for k, (label, kind, _) in enumerate(models.peer_labels()):
        row = run_child({"side": "peer", "model": model, "index": k})
        lines.append(f"| {label} | - | - | {mib(row.get('peak')) if 'peak' in row else 'error: ' + row['error']} |")
        if kind == "compile" and "peak" in row:
            compiled.append((label, row["peak"]))
    problems = _falling(model, peaks)
    if norms and max(norms) - min(norms) > 1e-5 * max(norms):  # float32: plans may sum in another order
        problems.append(f"{model}: gradflow's configurations disagree on the gradient (squared norms {norms})")
    notes = [f"{model}: {b} peaks at {mib(pb)} MiB, above {a}'s {mib(pa)} MiB"
             for (a, pa), (b, pb) in zip(compiled, compiled[1:]) if pb > pa + 2**20]
    return lines + [f"\n{n}" for n in notes], problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--t", type=int, default=200)
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--kernels", nargs="*", default=["whole_array_update", "jacobi_1d"])
    parser.add_argument("--models", nargs="*", default=["mlp", "resnet_block", "transformer_layer"],
                        help="model-zoo models (benchmarks/models.py) measured after the kernels")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.child:
        spec = json.loads(args.child)
        children = {"gradflow": gradflow_child, "peer": peer_child, "store_all_bytes": _model_store_all}
        print(json.dumps(children[spec["side"]](spec)), flush=True)
        return
    from benchmarks.checkpoint import versions

    out = ["# Peak memory of one forward+backward call under falling budgets", "",
           f"`OMP_NUM_THREADS=1 python benchmarks/memory_peak.py --n {args.n} --t {args.t} --snapshots "
           f"{args.snapshots}`; {versions()}. Method: the module docstring of `benchmarks/memory_peak.py` "
           "(one fresh process per row; peak = resident bytes the call added above its inputs)."]
    problems: list[str] = []
    for kernel in args.kernels:
        lines, found = kernel_report(kernel, args.n, args.t, args.snapshots)
        out += lines
        problems += found
        print("\n".join(lines), flush=True)
    for model in args.models:
        lines, found = model_report(model)
        out += lines
        problems += found
        print("\n".join(lines), flush=True)
    out += ["", "Falling budgets and the measured peak: " + ("; ".join(problems) if problems else
            "a smaller budget never gave a higher peak (beyond 1 MiB), and gradflow's configurations gave equal "
            "gradients.")]
    text = "\n".join(out) + "\n"
    print(out[-1])
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
