"""Paired A/B of one `OPTIMIZE` pass on GradBench's ode: the primal and the gradient built with and without
the pass, timed in one process (interleaved rounds, CPU time), their values compared with each other (the
values themselves GradBench validates against JAX: `run.py ode`).

    OMP_NUM_THREADS=1 python benchmarks/gradbench/ode_pass_ab.py --without write_in_place
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from programs.ode import ode  # noqa: E402

import gradflow  # noqa: E402
from gradflow.api import optimized  # noqa: E402
from gradflow.optimize import OPTIMIZE  # noqa: E402
from gradflow.runtime import Runner  # noqa: E402

WORKLOADS = [(1000, 1), (100000, 1), (10000, 10), (1000, 100)]


def cpu_ms(forward, value_and_grad, x: np.ndarray, s: int, calls: int) -> tuple[float, float]:
    """CPU milliseconds per call of the primal and of the gradient."""
    y, last = np.zeros_like(x), np.zeros(1)
    start = time.process_time()
    for _ in range(calls):
        forward(x=x, y=y, last=last, S=s)
    middle = time.process_time()
    for _ in range(calls):
        value_and_grad(x=x, S=s)
    end = time.process_time()
    return (middle - start) / calls * 1e3, (end - middle) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without", required=True, help="the OPTIMIZE pass left out of the 'before' side")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    sides = {}
    for name, pipe in (("before", OPTIMIZE.without(args.without)), ("after", OPTIMIZE)):
        sides[name] = (Runner(optimized(gradflow.Graph.of(ode), pipe)),
                       gradflow.value_and_grad(ode, wrt="x", of="last", optimize=pipe))
    for n, s in WORKLOADS:
        x = np.random.default_rng(0).random(n)
        times: dict[str, tuple[list, list]] = {name: ([], []) for name in sides}
        values, grads = {}, {}
        for name, (forward, value_and_grad) in sides.items():
            values[name] = np.zeros(n)
            forward(x=x, y=values[name], last=np.zeros(1), S=s)
            grads[name] = value_and_grad(x=x, S=s)[1]
        for _ in range(args.rounds):
            for name, (forward, value_and_grad) in sides.items():
                primal, gradient = cpu_ms(forward, value_and_grad, x, s, args.calls)
                times[name][0].append(primal)
                times[name][1].append(gradient)
        (pb, gb), (pa, ga) = [tuple(statistics.median(t) for t in times[k]) for k in ("before", "after")]
        differ = [np.max(np.abs(d["before"] - d["after"])) for d in (values, grads)]
        print(f"n={n} s={s}: primal {pb:.4f} -> {pa:.4f} ms ({pa / pb:.3f}), gradient {gb:.4f} -> {ga:.4f} ms "
              f"({ga / gb:.3f}); the sides' values differ by {differ[0]:.1e}, their gradients by {differ[1]:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
