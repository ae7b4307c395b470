"""Paired A/B of one `OPTIMIZE` pass on a GradBench eval's programs: each of the eval's functions built with
and without the pass, timed in one process (interleaved rounds, CPU time), the two sides' results compared
with each other (the values themselves GradBench validates against JAX: `run.py EVAL`).

    OMP_NUM_THREADS=1 python benchmarks/gradbench/pass_ab.py ode --without write_in_place
    OMP_NUM_THREADS=1 python benchmarks/gradbench/pass_ab.py kmeans --without reduce_in_maps

Evals: ode (primal, gradient) and kmeans (cost; dir, the gradient over the Hessian's diagonal).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from programs.kmeans import kmeans  # noqa: E402
from programs.ode import ode  # noqa: E402

import gradflow  # noqa: E402
from gradflow.api import optimized  # noqa: E402
from gradflow.optimize import OPTIMIZE  # noqa: E402
from gradflow.runtime import Runner  # noqa: E402

#: a side's functions of one workload: name -> a call returning its result
Calls = dict[str, Callable[[], np.ndarray]]


def _ode(pipe) -> tuple[list, Callable[[tuple], Calls]]:
    forward = Runner(optimized(gradflow.Graph.of(ode), pipe))
    value_and_grad = gradflow.value_and_grad(ode, wrt="x", of="last", optimize=pipe)

    def calls(workload: tuple) -> Calls:
        n, s = workload
        x, y, last = np.random.default_rng(0).random(n), np.zeros(n), np.zeros(1)

        def primal():
            forward(x=x, y=y, last=last, S=s)
            return y.copy()
        return {"primal": primal, "gradient": lambda: value_and_grad(x=x, S=s)[1]}
    return [(1000, 1), (100000, 1), (10000, 10), (1000, 100)], calls


def _kmeans(pipe) -> tuple[list, Callable[[tuple], Calls]]:
    forward = Runner(optimized(gradflow.Graph.of(kmeans), pipe))
    grad_and_hvp = gradflow.grad_and_hvp(kmeans, wrt="centroids", of="S", optimize=pipe)

    def calls(workload: tuple) -> Calls:
        k, n, d = workload
        rng = np.random.default_rng(0)
        points, centroids, S = rng.random((n, d)), rng.random((k, d)), np.zeros(1)

        def cost():
            forward(points=points, centroids=centroids, S=S)
            return S.copy()

        def direction():
            gradient, diagonal = grad_and_hvp(points=points, centroids=centroids, S=np.zeros(1),
                                              tan_centroids=np.ones_like(centroids))
            return gradient["centroids"] / diagonal["centroids"]
        return {"cost": cost, "dir": direction}
    return [(10, 1000, 8), (100, 10000, 8), (1000, 1000, 16), (1000, 10000, 8)], calls


EVALS = {"ode": _ode, "kmeans": _kmeans}


def cpu_ms(call: Callable[[], np.ndarray], calls: int, seconds: float = 0.2) -> float:
    """CPU milliseconds per call, over `calls` calls or as many as `seconds` of CPU time allow (one at least)."""
    start = time.process_time()
    done = 0
    while done < calls and (done == 0 or time.process_time() - start < seconds):
        call()
        done += 1
    return (time.process_time() - start) / done * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eval", choices=sorted(EVALS))
    parser.add_argument("--without", required=True, help="the OPTIMIZE pass left out of the 'before' side")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    sides = {name: EVALS[args.eval](pipe) for name, pipe in (("before", OPTIMIZE.without(args.without)),
                                                              ("after", OPTIMIZE))}
    for workload in sides["after"][0]:
        calls = {name: side[1](workload) for name, side in sides.items()}
        results = {name: {f: call() for f, call in c.items()} for name, c in calls.items()}  # built, warm
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, c in calls.items():
                for f, call in c.items():
                    times.setdefault((name, f), []).append(cpu_ms(call, args.calls))
        parts = []
        for f in calls["after"]:
            before, after = (statistics.median(times[(name, f)]) for name in ("before", "after"))
            differ = np.max(np.abs(results["before"][f] - results["after"][f]))
            parts.append(f"{f} {before:.4f} -> {after:.4f} ms ({after / before:.3f}, sides differ by {differ:.1e})")
        print(f"{args.eval} {workload}: " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
