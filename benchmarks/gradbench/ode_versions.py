#!/usr/bin/env python3
"""The ode eval's gradient at one gradflow version, for before/after comparisons of engine changes:

    PYTHONPATH=<worktree>/src OMP_NUM_THREADS=1 python benchmarks/gradbench/ode_versions.py <worktree>

prints, per workload, the process CPU time of one gradient call in ms (the minimum over 15 rounds of many
calls) as JSON. Run it alternately at the two versions, nothing else on the machine: the workloads are
memory-bound. `<worktree>` is the checkout whose `benchmarks/gradbench/programs` is used (its own ode
program and its own `built`).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

WORKLOADS = [(1000, 1), (100000, 1), (10000, 10), (100000, 10)]


def main(root: str) -> None:
    sys.path.insert(0, root + "/benchmarks/gradbench")
    from programs.ode import FUNCTIONS

    out = {}
    for n, s in WORKLOADS:
        x = np.random.default_rng(0).uniform(0, 1, n).tolist()
        call, _ = FUNCTIONS["gradient"].prepare({"x": x, "s": s})
        call()  # built and compiled before timing
        reps = max(3, int(2e6 // (n * s)))
        best = float("inf")
        for _ in range(15):
            t0 = time.process_time()
            for _ in range(reps):
                call()
            best = min(best, (time.process_time() - t0) / reps)
        out[f"n={n},s={s}"] = round(best * 1e3, 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
