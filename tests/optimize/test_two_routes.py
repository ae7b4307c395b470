"""The optimization stage keeps results: on every corpus program (the dataflow, loop and NPBench corpora),
the value and every gradient of `grad` through the default `OPTIMIZE` pipeline equal those of
`grad(..., optimize=False)` on the same data (hypothesis draws the seeds; each route is compiled once per
program).

Equal means to rounding: the passes may reorder sums (a stencil's adjoint accumulated by one map per
offset, a reduction in per-output accumulators), so each array is compared to 1e-12 of its own largest
magnitude. Agreement with torch.autograd (1e-9) is checked on the optimized route by the corpus tests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gradflow.verify import programs
from gradflow.verify.corpus import dataflow, loops
from tests.corpus import npbench

programs.adopt(npbench.CASES)

NAMES = [c.name for c in (*dataflow.CASES, *loops.CASES, *npbench.CASES)]


def _close(optimized: np.ndarray, plain: np.ndarray) -> bool:
    scale = float(np.max(np.abs(plain))) if plain.size else 0.0
    return bool(np.all(np.abs(optimized - plain) <= 1e-12 * scale))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_optimized_gradients_equal_unoptimized(name: str, seed: int) -> None:
    case = programs.case_named(name)
    fast = programs.outputs(name, seed, optimize=True)
    plain = programs.outputs(name, seed, optimize=False)
    for key in (case.of, *(f"grad_{x}" for x in case.wrt)):
        assert np.all(np.isfinite(plain[key])), f"{name}: {key} is not finite unoptimized"
        assert _close(fast[key], plain[key]), (
            f"{name}: {key} optimized differs by {np.max(np.abs(fast[key] - plain[key])):.3g} "
            f"(largest magnitude {np.max(np.abs(plain[key])):.3g})")


def test_the_optimization_stage_changes_the_stencil_programs() -> None:
    """Not vacuous: the two routes compile different programs (the stencil's scatter is split)."""
    from gradflow.core.graph import fingerprint

    for name in ("lp_jacobi_1d", "lp_heat_3d", "nb_hdiff"):
        assert fingerprint(programs.differentiated(name).sdfg) != fingerprint(
            programs.differentiated(name, optimize=False).sdfg)
