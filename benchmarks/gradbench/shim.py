"""Run an upstream GradBench program with one local adjustment:

    python shim.py eval PATH/evals/<eval>/run.py ARGS...   the eval, its C++ reference replaced by a stub
    python shim.py jax PATH/tools/jax/run.py ARGS...       the JAX tool, timed to its results, in float64
    python shim.py pytorch PATH/tools/pytorch/run.py ARGS  the PyTorch tool, its default dtype float64

The evals' C++ reference is built from a header fetched from the web; `run.py` validates against the JAX
and PyTorch tools instead, and the eval's analysis says the reference was unavailable. JAX dispatches CPU
computations asynchronously: its tool's timed call returns before the result is computed (the conversion
to JSON, outside the timing, waits for it), so its timings measured dispatch only (lse at n = 20000:
0.011 ms, 0.11 ms to the result; turning `jax_cpu_enable_async_dispatch` off does not stop it). The shim
wraps the functions the tool times in `jax.block_until_ready`, before the tool's modules are imported.
Most of the JAX tool's modules enable float64 themselves; `ode` does not and computed in float32 (4e-7
from the float64 answer): `jax_enable_x64` is set for all, as the evals' inputs are float64.
The PyTorch tool makes some tensors without a dtype, which torch makes float32: ht's Euler rotations
(`torch.eye(3)`, 6e-9 from the float64 answer) and ba's weight errors (1e-8); the shim sets torch's default
dtype to float64, which leaves the tensors the tool types itself as they were.
"""

import os
import runpy
import sys

mode, path, *rest = sys.argv[1:]
if mode == "eval":
    import gradbench.cpp

    def _unavailable(**_):
        return {"success": False,
                "error": "the C++ reference is not built here; run.py validates against the JAX and PyTorch tools"}

    gradbench.cpp.evaluate = _unavailable
elif mode == "jax":
    import gradbench.wrap as wrap
    import jax

    def _blocking(decorate):
        """`decorate` (one of `wrap`'s decorator factories) timing the function until its result exists."""
        def factory(**options):
            def decorator(function):
                timed = decorate(**options)(lambda input: jax.block_until_ready(function(input)))
                return wrap.Wrapped(function=function, wrapped=timed.wrapped)
            return decorator
        return factory

    wrap.multiple_runs, wrap.function = _blocking(wrap.multiple_runs), _blocking(wrap.function)
    jax.config.update("jax_enable_x64", True)
elif mode == "pytorch":
    import torch

    torch.set_default_dtype(torch.float64)
else:
    raise SystemExit(f"shim.py: unknown mode {mode!r} (eval, jax or pytorch)")
sys.argv = [path, *rest]
sys.path[0] = os.path.dirname(os.path.abspath(path))  # as if `python PATH` had been run
runpy.run_path(path, run_name="__main__")
