"""Cost of forward mode and of Hessian-vector products: gradflow's jvp against its forward, its hvp against its
gradient, and both against JAX (`jax.jvp` of the jit-compiled kernel, `jax.jvp` of `jax.grad`, the
composition JAX users write), on the kernels of `benchmarks/kernels.py` at their benchmark sizes.

Per kernel: gradflow's forward (`optimized`), tangent program (`jvp_graph`), gradient (`grad_graph`) and
Hessian-vector program (`hvp`'s: the tangent program of the gradient, through `forward.BEFORE_TANGENT`), each
compiled and bound to prebuilt arguments (`kernelbench.sides.GradflowCall`); the JAX kernel of
`benchmarks/peers/` under `jit`. The tangent and the Hessian-vector product along one random direction are
checked against JAX's (relative 1e-8) before timing. Every side is timed interleaved in rounds
(`kernelbench/timing.py`), medians of the process CPU time of single calls, one thread.

    OMP_NUM_THREADS=1 python benchmarks/forward_mode.py [--only lp_lu,nb_gemm] [--out FILE]

Writes the table to `--out` (default `benchmarks/results/forward_mode.md`).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import pathlib
import platform
import statistics
import sys
import traceback

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def _bound(graph, arrays: dict, symbols: dict, extra: dict | None = None):
    from benchmarks.kernelbench.sides import GradflowCall, extra_arrays, runner_for

    given = {k: np.array(v, copy=True) for k, v in {**arrays, **(extra or {})}.items()
             if k in graph.sdfg.arrays and not graph.sdfg.arrays[k].transient}
    given.update(extra_arrays(graph, given, symbols))
    return GradflowCall(runner_for(graph), given, symbols), given


def _relative(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def measure_kernel(bench, kernel) -> dict:
    import jax

    from benchmarks.kernelbench.sides import LOOP_BOUNDS, gradflow_forward
    from benchmarks.kernelbench.timing import Timed, measure
    from gradflow.api import grad_graph
    from gradflow.autodiff.forwarding import STORE_ALL
    from gradflow.forward import BEFORE_TANGENT, jvp_graph

    case = bench.case
    sdfg = case.to_sdfg()
    arrays = bench.inputs(sdfg)
    symbols = dict(bench.symbols)
    rng = np.random.default_rng(1)
    tangents = {x: rng.standard_normal(np.shape(arrays[x])).astype(np.asarray(arrays[x]).dtype) for x in case.wrt}
    wrt, of = list(case.wrt), case.of
    forwarding = STORE_ALL.with_loop_bounds(**LOOP_BOUNDS)

    forward, _ = _bound(gradflow_forward(sdfg), arrays, symbols)
    tangent_graph = jvp_graph(sdfg, wrt, [of])
    tangent, t_args = _bound(tangent_graph, arrays, symbols, {f"tan_{x}": tangents[x] for x in wrt})
    gradient, _ = _bound(grad_graph(sdfg, wrt, of, forwarding=forwarding), arrays, symbols)
    inner = grad_graph(sdfg, wrt, of, forwarding=forwarding, optimize=BEFORE_TANGENT)  # as `gradflow.hvp`
    grads = inner.meta["ad"].grads
    hessian_graph = jvp_graph(inner, wrt, [grads[x] for x in wrt])
    hvp, h_args = _bound(hessian_graph, arrays, symbols, {f"tan_{x}": tangents[x] for x in wrt})

    statics = kernel.statics(symbols, arrays)
    fn = functools.partial(kernel.fn, **statics)
    moved = {k: jax.device_put(v) for k, v in arrays.items()}
    diff = {k: moved[k] for k in wrt}
    rest = {k: v for k, v in moved.items() if k not in wrt}
    direction = {k: jax.device_put(tangents[k]) for k in wrt}
    j_fwd = jax.jit(lambda a: fn(**a))
    j_jvp = jax.jit(lambda d, t, r: jax.jvp(lambda d: fn(**d, **r), (d,), (t,)))
    j_grad = jax.jit(jax.value_and_grad(lambda d, r: fn(**d, **r)))
    j_hvp = jax.jit(lambda d, t, r: jax.jvp(jax.grad(lambda d: fn(**d, **r)), (d,), (t,))[1])

    # checks: one fresh call of each tangent program against JAX
    _, want_t = j_jvp(diff, direction, rest)
    tan_of = tangent_graph.meta["tangent"].arguments()[of]
    fresh = {k: np.array(v, copy=True) for k, v in t_args.items()}
    tangent_check, _ = _bound(tangent_graph, fresh, symbols)
    tangent_check()
    errors = {"jvp": _relative(fresh[tan_of], want_t)}
    want_h = j_hvp(diff, direction, rest)
    names = hessian_graph.meta["tangent"].arguments()
    fresh = {k: np.array(v, copy=True) for k, v in h_args.items()}
    hvp_check, _ = _bound(hessian_graph, fresh, symbols)
    hvp_check()
    errors["hvp"] = max(_relative(fresh[names[grads[x]]], want_h[x]) for x in wrt)

    peers = [Timed("forward", forward), Timed("jvp", tangent), Timed("grad", gradient), Timed("hvp", hvp),
             Timed("jax_forward", lambda: jax.block_until_ready(j_fwd(moved))),
             Timed("jax_jvp", lambda: jax.block_until_ready(j_jvp(diff, direction, rest))),
             Timed("jax_grad", lambda: jax.block_until_ready(j_grad(diff, rest))),
             Timed("jax_hvp", lambda: jax.block_until_ready(j_hvp(diff, direction, rest)))]
    for p in peers:  # compile and warm up
        p.call()
    stats = measure(peers, rounds=8, budget_s=4.0)
    return {"ms": {k: v["cpu"].median * 1e3 for k, v in stats.items()}, "errors": errors}


def report(rows: dict, failures: dict) -> str:
    import jax

    head = ["# Forward mode and Hessian-vector products: cost against the forward, the gradient and JAX", "",
            f"{datetime.date.today()}, {platform.processor() or platform.machine()}, one thread, float64, "
            f"JAX {jax.__version__}; `OMP_NUM_THREADS=1 python benchmarks/forward_mode.py` "
            "(medians of CPU time per call, interleaved rounds). `jvp/fwd`: gradflow's tangent program over its "
            "forward; `gf/JAX`: gradflow's time over JAX's for the same quantity; `hvp/grad`: gradflow's "
            "Hessian-vector program over its gradient. Errors: relative to JAX's tangent and H v.", "",
            "| kernel | fwd ms | jvp ms | jvp/fwd | JAX jvp ms | jvp gf/JAX | grad ms | hvp ms | hvp/grad | "
            "JAX hvp ms | hvp gf/JAX | err jvp | err hvp |", "|" + "---|" * 13]
    ratios = {"jvp/fwd": [], "jvp gf/JAX": [], "hvp/grad": [], "hvp gf/JAX": []}
    for name, r in rows.items():
        ms = r["ms"]
        row = {"jvp/fwd": ms["jvp"] / ms["forward"], "jvp gf/JAX": ms["jvp"] / ms["jax_jvp"],
               "hvp/grad": ms["hvp"] / ms["grad"], "hvp gf/JAX": ms["hvp"] / ms["jax_hvp"]}
        for k, v in row.items():
            ratios[k].append(v)
        head.append(f"| {name} | {ms['forward']:.3f} | {ms['jvp']:.3f} | {row['jvp/fwd']:.2f} | {ms['jax_jvp']:.3f} "
                    f"| {row['jvp gf/JAX']:.2f} | {ms['grad']:.3f} | {ms['hvp']:.3f} | {row['hvp/grad']:.2f} | "
                    f"{ms['jax_hvp']:.3f} | {row['hvp gf/JAX']:.2f} | {r['errors']['jvp']:.1e} | "
                    f"{r['errors']['hvp']:.1e} |")
    if rows:
        geo = {k: math.exp(statistics.fmean(math.log(x) for x in v)) for k, v in ratios.items()}
        med = {k: statistics.median(v) for k, v in ratios.items()}
        head += ["", f"{len(rows)} kernels. Median jvp/fwd {med['jvp/fwd']:.2f}, median hvp/grad "
                 f"{med['hvp/grad']:.2f}; geometric mean gf/JAX: jvp {geo['jvp gf/JAX']:.2f}, hvp "
                 f"{geo['hvp gf/JAX']:.2f}."]
    if failures:
        head += ["", "## Not measured", ""] + [f"- {k}: {v}" for k, v in failures.items()]
    return "\n".join(head) + "\n"


def main() -> None:
    from benchmarks.kernelbench.specs import benches
    from benchmarks.peers import kernels

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated kernel names")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/forward_mode.md"))
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    jax_kernels = kernels()
    rows, failures = {}, {}
    for bench in benches():
        if bench.role == "headline" or bench.name not in jax_kernels or (only and bench.name not in only):
            continue
        try:
            rows[bench.name] = measure_kernel(bench, jax_kernels[bench.name])
            print(bench.name, rows[bench.name], flush=True)
        except Exception as exc:  # one kernel's failure is reported, not fatal
            failures[bench.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc()
    pathlib.Path(args.out).write_text(report(rows, failures))
    print(pathlib.Path(args.out).read_text())


if __name__ == "__main__":
    main()
