"""`gradflow.stop_gradient(x)` for DaCe programs: the value of x, through which no gradient flows (JAX's
`lax.stop_gradient`, torch's `detach`).

Called in a `@dace.program`, DaCe's frontend finds it in its op repository (the documented extension point,
as `numpy_prod` registers `np.prod`) and writes a tasklet calling `gradflow_stop_gradient` per element, which
differentiation reads as `core.stop_gradient.StopGradient`: derivative 0 in reverse and forward mode. Called
from plain Python it returns its argument. A number passes through (it has no gradient to stop).
"""

from __future__ import annotations

from typing import Any, TypeVar

import dace
from dace.frontend.common import op_repository as oprepo

from gradflow.core.stop_gradient import SPELLING

T = TypeVar("T")


def stop_gradient(x: T) -> T:
    """`x`, as a constant to differentiation: gradflow passes no gradient through it. In a DaCe program,
    an array or a scalar; elsewhere `x` itself."""
    return x


def _stop(pv: Any, sdfg: dace.SDFG, state: dace.SDFGState, x: Any) -> Any:
    if not isinstance(x, str) or x not in sdfg.arrays:  # a number, or a symbol's value
        return x
    desc = sdfg.arrays[x]
    if isinstance(desc, dace.data.Scalar):
        out, out_desc = sdfg.add_scalar(pv.get_target_name(), desc.dtype, transient=True, find_new_name=True)
    else:  # a fresh dense array, also for a view of the argument
        out, out_desc = pv.add_temp_transient(desc.shape, desc.dtype)
    code = f"__out = {SPELLING}(__inp)"
    if isinstance(desc, dace.data.Scalar) or all(s == 1 for s in desc.shape):
        tasklet = state.add_tasklet("stop_gradient", {"__inp"}, {"__out"}, code)
        state.add_edge(state.add_read(x), None, tasklet, "__inp", dace.Memlet.from_array(x, desc))
        state.add_edge(tasklet, "__out", state.add_write(out), None, dace.Memlet.from_array(out, out_desc))
        return out
    index = ", ".join(f"__i{d}" for d in range(len(desc.shape)))
    state.add_mapped_tasklet("stop_gradient", {f"__i{d}": f"0:{n}" for d, n in enumerate(desc.shape)},
                             {"__inp": dace.Memlet(f"{x}[{index}]")}, code, {"__out": dace.Memlet(f"{out}[{index}]")},
                             external_edges=True)
    return out


for _name in ("gradflow.stop_gradient", f"{__name__}.stop_gradient"):
    if oprepo.Replacements.get(_name) is None:
        oprepo.replaces(_name)(_stop)
