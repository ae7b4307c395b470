#!/usr/bin/env python3
"""Before/after for the models of `benchmarks/models.py`: gradflow / eager torch at two versions.

    python benchmarks/models_ab.py --baseline /tmp/old [--only resnet_block,lenet] [--rounds 2] [--seconds 12]

`--baseline` is a checkout of the earlier version (`git worktree add /tmp/old <commit>`); this checkout is the
later one. Each (round, version, model) runs in a process of its own, with that version's `src` first on
the path, at one thread: the model is compiled (float32, the batch symbolic), then forward+backward
calls of gradflow's and eager torch's alternate call by call for `--seconds`, and the process prints the
ratio of their medians. Interleaving makes both sides share the machine's load at every moment, which
matters on a 2-core machine where separate runs of one tree read 3 to 6 ms; the versions alternate within
each round. The model definitions and inputs are this checkout's (`models.py`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def worker(name: str, seconds: float) -> dict:
    """Compile `name`, then time gradflow and eager torch call by call; their medians in ms."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    import models

    import gradflow.torch as gt

    make, inputs, _ = models.MODELS[name]
    torch.manual_seed(0)
    eager = make()
    mine = copy.deepcopy(eager)
    x = inputs(torch.float32)
    fast = gt.compile(mine, (x,), dynamic=True)
    sides = [(fast, [p for p in mine.parameters() if p.requires_grad]),
             (eager, [p for p in eager.parameters() if p.requires_grad])]
    with torch.no_grad():
        g = torch.randn(eager(x).shape, generator=torch.Generator().manual_seed(4))

    def call(module, params) -> float:
        start = time.perf_counter()
        models._fwd_bwd(module, params, x, g)
        return time.perf_counter() - start

    for _ in range(10):
        for side in sides:
            call(*side)
    times: list[list[float]] = [[], []]
    end = time.time() + seconds
    while time.time() < end:
        for k, side in enumerate(sides):
            times[k].append(call(*side))
    med = [sorted(t)[len(t) // 2] * 1e3 for t in times]
    return {"model": name, "gradflow_ms": med[0], "torch_ms": med[1], "ratio": med[0] / med[1],
            "calls": len(times[0]), "gradflow": str(pathlib.Path(gt.__file__).parents[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="checkout of the earlier version")
    parser.add_argument("--only", default="resnet_block,lenet,mobilenet_relu6", help="comma-separated models")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0, help="timed seconds per process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.seconds)))
        return
    trees = {"before": pathlib.Path(args.baseline).resolve() / "src", "after": HERE.parent / "src"}
    rows: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name in args.only.split(","):
            for version in (("before", "after") if r % 2 == 0 else ("after", "before")):
                env = dict(os.environ, PYTHONPATH=str(trees[version]), OMP_NUM_THREADS="1")
                out = subprocess.run([sys.executable, __file__, "--baseline", args.baseline, "--worker", name,
                                      "--seconds", str(args.seconds)], env=env, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{version} {name} failed:\n{out.stderr[-3000:]}")
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"round {r} {version:6} {name}: gradflow {rec['gradflow_ms']:.3f} ms, torch "
                      f"{rec['torch_ms']:.3f} ms, ratio {rec['ratio']:.3f} ({rec['calls']} calls each)", flush=True)
                rows.setdefault((name, version), []).append(rec["ratio"])
    print("\n| model | gradflow / torch before | after |\n|---|---|---|")
    for name in args.only.split(","):
        before, after = (", ".join(f"{x:.3f}" for x in rows[(name, v)]) for v in ("before", "after"))
        print(f"| {name} | {before} | {after} |")


if __name__ == "__main__":
    main()
