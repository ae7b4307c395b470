#!/usr/bin/env python3
"""Where a model's training step spends its time: DaCe's timer on every state of the programs gradflow
compiles for it, summed per state.

    OMP_NUM_THREADS=1 python benchmarks/state_profile.py gpt2layer [--calls 20] [--top 30]

The model is one of `benchmarks/models.py`, compiled with `gradflow.torch.compile` in a child process
with an empty cache of its own (timed programs are other programs: nothing is reused or left behind),
then run `--calls` times (forward + backward). DaCe writes the timers' reports when the child exits; per
program: each state's milliseconds per call (the building call counted), largest first, and the total in
states. A state's name is DaCe's, which it cuts short. Timers cost a little per state.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent


def _child(model_name: str, calls: int) -> None:
    """Compile and run the model with timers on every state; print the build folders (the reports are
    written there when DaCe unloads the programs, at this process's exit)."""
    import dace
    import torch

    sys.path.insert(0, str(HERE))
    import models

    import gradflow.torch as gt

    torch.set_num_threads(1)
    built: list[dace.SDFG] = []
    compile_sdfg = dace.SDFG.compile

    def timed(self, *a, **k):
        for sdfg in self.all_sdfgs_recursive():
            for state in sdfg.states():
                state.instrument = dace.InstrumentationType.Timer
        built.append(self)
        return compile_sdfg(self, *a, **k)

    dace.SDFG.compile = timed
    make, inputs, _ = models.MODELS[model_name]
    torch.manual_seed(0)
    model = make()
    x = inputs(torch.float32)
    fast = gt.compile(model, (x,))
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        g = torch.randn(model(x).shape)
    torch.autograd.grad(fast(x), params, g)  # builds
    started = time.perf_counter()
    for _ in range(calls):
        torch.autograd.grad(fast(x), params, g)
    step = 1e3 * (time.perf_counter() - started) / calls
    folders = [sdfg.build_folder for sdfg in built]
    for folder in folders:  # a build moved into the cache still saves its report under its first path
        pathlib.Path(folder, "perf").mkdir(parents=True, exist_ok=True)
    print(json.dumps({"step_ms": step, "folders": folders}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.model, args.calls)
        return
    cache = tempfile.mkdtemp(prefix="gradflow_state_profile_")
    env = {**os.environ, "GRADFLOW_CACHE": cache, "DACE_instrumentation_report_each_invocation": "0"}
    out = subprocess.run([sys.executable, __file__, args.model, "--calls", str(args.calls), "--child"], env=env,
                         check=True, capture_output=True, text=True).stdout
    run = json.loads(out.strip().splitlines()[-1])
    print(f"{args.model}: {run['step_ms']:.2f} ms per step with timers, {args.calls} steps")
    calls = args.calls + 1  # the reports count the building call too
    for folder in run["folders"]:
        for report in sorted(pathlib.Path(folder, "perf").glob("*.json")):
            total: collections.Counter = collections.Counter()
            for event in json.loads(report.read_text())["traceEvents"]:
                if "dur" in event:
                    total[event["name"]] += event["dur"]
            print(f"\n{pathlib.Path(folder).name}: {sum(total.values()) / 1e3 / calls:.2f} ms per call in states")
            for name, us in total.most_common(args.top):
                print(f"{us / 1e3 / calls:8.3f} ms  {name[:66]}")
    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
