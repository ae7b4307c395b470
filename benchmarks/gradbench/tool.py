"""gradflow as a GradBench tool: `python benchmarks/gradbench/tool.py` answers the GradBench protocol (JSON
lines on stdin/stdout: `start`, `define`, `evaluate`, `analysis`; see GradBench's CONTRIBUTING.md).

`define` succeeds for the evals in `programs/` and answers `success: false` for the others. `evaluate`
prepares the call (parses the input, builds and compiles the program: once per program, cached on disk by
gradflow; reported as a `prepare` timing), runs it once (the warm-up, a `warmup` timing), then times it
`min_runs` times and for at least `min_seconds` seconds, one `evaluate` timing per run, as the
upstream tools' `wrap.multiple_runs` does. JAX's tool compiles inside its first timed run instead; the
comparison (`run.py`) takes the minimum over runs, which excludes compilation for both.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback

#: evals with programs in `programs/`
EVALS = ("hello", "lse", "llsq", "ode", "gmm", "lstm", "ba", "ht", "kmeans")


def _timed(call, runs: int, seconds: float) -> tuple[object, list[dict]]:
    start = time.perf_counter_ns()
    result = call()
    timings = [{"name": "warmup", "nanoseconds": time.perf_counter_ns() - start}]
    elapsed = 0
    while len(timings) - 1 < runs or elapsed < seconds * 1e9:
        start = time.perf_counter_ns()
        result = call()
        took = time.perf_counter_ns() - start
        timings.append({"name": "evaluate", "nanoseconds": took})
        elapsed += took
    return result, timings


def _module(name: str):
    if name not in EVALS:
        raise LookupError(f"gradflow's GradBench tool has no programs for eval '{name}' (it has {', '.join(EVALS)})")
    return importlib.import_module(f"programs.{name}")


def respond(message: dict) -> dict:
    kind = message["kind"]
    if kind == "start":
        return {"tool": "gradflow"}
    if kind == "define":
        try:
            _module(message["module"])
            return {"success": True}
        except Exception as e:  # the protocol carries the failure to the eval
            return {"success": False, "error": "".join(traceback.format_exception(e))}
    if kind == "evaluate":
        try:
            function = _module(message["module"]).FUNCTIONS[message["function"]]
            given = message["input"]
            start = time.perf_counter_ns()
            call, post = function.prepare(given)
            prepared = {"name": "prepare", "nanoseconds": time.perf_counter_ns() - start}
            runs, seconds = (given.get("min_runs", 1), given.get("min_seconds", 0)) if isinstance(given, dict) \
                else (1, 0)
            result, timings = _timed(call, runs, seconds)
            return {"success": True, "output": post(result), "timings": [prepared, *timings]}
        except Exception as e:
            return {"success": False, "error": "".join(traceback.format_exception(e))}
    return {}


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else written to standard output (compilers, DaCe) goes to standard error
    sys.stdout = sys.stderr
    for line in sys.stdin:
        message = json.loads(line)
        protocol.write(json.dumps({"id": message["id"]} | respond(message)) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
