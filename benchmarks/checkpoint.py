"""Binomial checkpointing of time loops: gradflow vs torch.utils.checkpoint and jax.checkpoint.

Kernels (float64, N elements, T time steps), each reduced to a scalar loss:
- `jacobi_1d` (the loop corpus's `lp_jacobi_1d`): a linear 3-point stencil between A and B;
- `whole_array_update` (`lp_whole_array_update`): A = tanh(A) * W + 0.1 * A, a nonlinear step whose
  reverse needs the state of every step.

Configurations: gradflow `STORE_ALL` and `Forwarding.checkpoint(snapshots=S)`; torch eager autograd
(everything stored) and `torch.utils.checkpoint.checkpoint_sequential` over the T steps in S segments;
JAX `lax.scan` under `jit(grad)` (everything stored) and the same scan cut into S blocks whose inner scans
are wrapped in `jax.checkpoint` (recompute each block in the backward).

Reported per configuration: the median time of a forward+backward call (after a warm-up call that
compiles); the bytes gradflow forwards from its forward to its backward sweep (`forwarded_bytes`); the
temporaries the call holds besides its arguments: for gradflow the bytes of the differentiated SDFG's
transients (tape, snapshots, working copies, gradient buffers: DaCe allocates them for the call), for JAX
XLA's `memory_analysis().temp_size_in_bytes`; and the peak resident memory above the process's level
before the call, sampled every 0.2 ms from /proc/self/statm by a thread while the call runs. The last is
the only measure for torch eager; it misses what an allocator keeps from earlier calls (DaCe allocates
transients once, at initialisation, so gradflow's rows show almost nothing there).

    OMP_NUM_THREADS=1 python benchmarks/checkpoint.py [--n 20000] [--t 1000] [--snapshots 10] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import threading
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(call, repeat: int) -> tuple[float, int]:
    """(median seconds, peak RSS increase in bytes) of `call()` after one warm-up call."""
    call()
    times, peaks = [], []
    for _ in range(repeat):
        base, peak, done = rss(), [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.0002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        done.set()
        sampler.join()
        peaks.append(max(peak[0], rss()) - base)
    return statistics.median(times), max(peaks)


# ---- gradflow --------------------------------------------------------------------------------------------


def gradflow_runs(kernel: str, n: int, t: int, snapshots: int, inputs: dict):
    import gradflow
    from gradflow.autodiff.passes import Reverse, ad_pipeline, forwarded_bytes
    from gradflow.core.graph import Graph
    from gradflow.verify.corpus import loops

    case = loops.CASES_BY_NAME[{"jacobi_1d": "lp_jacobi_1d", "whole_array_update": "lp_whole_array_update"}[kernel]]
    sizes = {"N": n, "T": t}
    for label, policy in [("gradflow STORE_ALL", gradflow.STORE_ALL),
                          (f"gradflow checkpoint({snapshots})", gradflow.Forwarding.checkpoint(snapshots=snapshots,
                                                                                              sizes=sizes))]:
        graph = ad_pipeline(Reverse(case.wrt, (case.of,), forwarding=policy))(Graph.of(case.to_sdfg())).unwrap()
        kept = forwarded_bytes(graph, sizes)
        held = transient_bytes(graph.sdfg, sizes)
        f = gradflow.value_and_grad(case.program.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=policy)
        args = {k: np.copy(v) for k, v in inputs.items()}

        def call(f=f, args=args):
            for k, v in inputs.items():
                args[k][...] = v
            return f(**args, T=t)

        yield label, call, kept, held


def transient_bytes(sdfg, sizes: dict) -> int:
    """Bytes of the SDFG's transients at `sizes` (DaCe allocates each for the call: what the fwd+bwd holds
    besides its arguments), constants (schedule tables) excluded."""
    import dace

    values = {dace.symbolic.symbol(k): v for k, v in sizes.items()}
    total = 0
    for name, desc in sdfg.arrays.items():
        if desc.transient and name not in sdfg.constants_prop:
            total += int(dace.symbolic.pystr_to_symbolic(str(desc.total_size)).subs(values)) * desc.dtype.bytes
    return total


# ---- torch -----------------------------------------------------------------------------------------------


def torch_runs(kernel: str, n: int, t: int, snapshots: int, inputs: dict, compile_budgets=()):
    """(label, call, None, None) of torch's configurations: eager, `checkpoint_sequential`, and (one per
    `compile_budgets`) `torch.compile` of the forward under that `activation_memory_budget`, compiled at
    the call's first use."""
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    torch.set_num_threads(1)
    if kernel == "jacobi_1d":
        def step(x):
            a, b = x[0], x[1]
            b = torch.cat([b[:1], 0.33333 * (a[:-2] + a[1:-1] + a[2:]), b[-1:]])
            a = torch.cat([a[:1], 0.33333 * (b[:-2] + b[1:-1] + b[2:]), a[-1:]])
            return torch.stack([a, b])

        def loss(x):
            return (x[0] * x[0] * x[1]).sum()

        def start():
            return torch.stack([torch.tensor(inputs["A"]), torch.tensor(inputs["B"])]).requires_grad_()
    else:
        w = torch.tensor(inputs["W"], requires_grad=True)
        weights = torch.arange(1, n + 1, dtype=torch.float64)

        def step(a):
            return torch.tanh(a) * w + 0.1 * a

        def loss(a):
            return (a * weights).sum()

        def start():
            return torch.tensor(inputs["A"], requires_grad=True)

    def eager():
        x0 = start()
        x = x0
        for _ in range(t):
            x = step(x)
        loss(x).backward()
        return x0.grad

    steps = torch.nn.Sequential(*[_Step(step) for _ in range(t)])

    def checkpointed():
        x0 = start()
        loss(checkpoint_sequential(steps, snapshots, x0, use_reentrant=False)).backward()
        return x0.grad

    yield "torch eager (stores all)", eager, None, None
    yield f"torch checkpoint_sequential({snapshots} segments)", checkpointed, None, None
    for budget in compile_budgets:
        yield f"torch.compile, activation_memory_budget {budget:g}", _compiled(step, loss, start, t, budget), None, None


def _compiled(step, loss, start, t: int, budget: float):
    """A forward+backward call of `torch.compile` (inductor) of the T-step forward, compiled at its first call
    with `activation_memory_budget` set to `budget` (the min-cut partitioner's share of activations kept)."""
    import torch
    import torch._functorch.config as functorch_config

    def forward(x0):
        x = x0
        for _ in range(t):
            x = step(x)
        return loss(x)

    compiled = torch.compile(forward)

    def call():
        functorch_config.activation_memory_budget = budget
        x0 = start()
        compiled(x0).backward()
        return x0.grad

    return call


class _Step:
    """A step as a module, for checkpoint_sequential (built lazily: torch imported above)."""

    def __new__(cls, fn):
        import torch

        class Step(torch.nn.Module):
            def forward(self, x):
                return fn(x)

        return Step()


# ---- JAX -------------------------------------------------------------------------------------------------


def jax_runs(kernel: str, n: int, t: int, snapshots: int, inputs: dict):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    if kernel == "jacobi_1d":
        def step(x, _):
            a, b = x
            b = b.at[1:-1].set(0.33333 * (a[:-2] + a[1:-1] + a[2:]))
            a = a.at[1:-1].set(0.33333 * (b[:-2] + b[1:-1] + b[2:]))
            return (a, b), None

        def loss(x):
            return (x[0] * x[0] * x[1]).sum()

        x0 = (jnp.asarray(inputs["A"]), jnp.asarray(inputs["B"]))
        params = ()
    else:
        weights = jnp.arange(1, n + 1, dtype=jnp.float64)

        def loss(a):
            return (a * weights).sum()

        x0 = jnp.asarray(inputs["A"])
        params = jnp.asarray(inputs["W"])

    def make_step(w):
        if kernel == "jacobi_1d":
            return step
        return lambda a, _: (jnp.tanh(a) * w + 0.1 * a, None)

    def plain(x, w):
        out, _ = jax.lax.scan(make_step(w), x, None, length=t)
        return loss(out)

    block = t // snapshots

    def blocked(x, w):
        @jax.checkpoint
        def run_block(y):
            out, _ = jax.lax.scan(make_step(w), y, None, length=block)
            return out

        out, _ = jax.lax.scan(lambda y, _: (run_block(y), None), x, None, length=snapshots)
        out, _ = jax.lax.scan(make_step(w), out, None, length=t - block * snapshots)
        return loss(out)

    for label, fn in [("jax scan (stores all)", plain), (f"jax checkpoint ({snapshots} blocks)", blocked)]:
        grad = jax.jit(jax.grad(fn, argnums=(0, 1)))
        temp = grad.lower(x0, params).compile().memory_analysis().temp_size_in_bytes

        def call(grad=grad):
            return jax.block_until_ready(grad(x0, params))

        yield label, call, None, temp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--t", type=int, default=1000)
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kernels", nargs="*", default=["jacobi_1d", "whole_array_update"])
    parser.add_argument("--out", type=pathlib.Path, help="also write the report here (e.g. benchmarks/results/"
                                                          "checkpoint.md)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    lines: list[str] = []

    def report(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    rng = np.random.default_rng(0)
    n, t, s = args.n, args.t, args.snapshots
    report(versions())
    report(f"N = {n}, T = {t}, snapshots/segments/blocks = {s}; one array = {8 * n} bytes")
    for kernel in args.kernels:
        inputs = {"A": rng.uniform(-1, 1, n), "S": np.zeros(1)}
        inputs.update({"B": rng.uniform(-1, 1, n)} if kernel == "jacobi_1d" else {"W": rng.uniform(0.5, 1.5, n)})
        report(f"\n{kernel}")
        report(f"  {'configuration':42s} {'fwd+bwd ms':>11s} {'forwarded B':>13s} {'temporaries B':>14s} "
              f"{'peak RSS +B':>13s}")
        for runs in (gradflow_runs, torch_runs, jax_runs):
            for label, call, kept, held in runs(kernel, n, t, s, inputs):
                seconds, peak = measure(call, args.repeat)
                kept_text = "-" if kept is None else f"{kept:,}"
                held_text = "-" if held is None else f"{held:,}"
                report(f"  {label:42s} {1e3 * seconds:11.2f} {kept_text:>13s} {held_text:>14s} {peak:13,}")
    if args.out is not None:
        args.out.write_text("```\n" + "\n".join(lines) + "\n```\n")


def versions() -> str:
    import platform

    import dace
    import jax
    import torch

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
            f"python {platform.python_version()}, dace {dace.__version__}, torch {torch.__version__}, "
            f"jax {jax.__version__}, numpy {np.__version__}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")


if __name__ == "__main__":
    main()
