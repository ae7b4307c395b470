"""The corpora are honest: every DaCe program computes what its torch reference computes.

For each case (compiled once):
1. forward value: DaCe's `of` after the run equals `torch_fn` on the same inputs;
2. reference derivative: the torch gradient, contracted with a random direction, equals a central finite
   difference of the *compiled DaCe program* along that direction. This checks the torch reference's
   derivative (what gradflow's gradients are compared against) without involving gradflow.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradflow.verify.corpus import dataflow, loops
from gradflow.verify.corpus.case import Case, run_compiled, torch_grads, torch_value

_CASES = [pytest.param(c, 1e-12, id=c.name) for c in dataflow.CASES] + [
    pytest.param(c, 1e-10, id=c.name) for c in loops.CASES
]


def _directional_fd(case: Case, compiled, inputs, direction, h):
    def f(t):
        shifted = dict(inputs)
        for w in case.wrt:
            shifted[w] = inputs[w] + t * direction[w]
        return float(run_compiled(case, compiled, shifted)[case.of][0])

    return (f(h) - f(-h)) / (2 * h), (f(2 * h) - f(-2 * h)) / (4 * h)


@pytest.mark.slow
@pytest.mark.parametrize("case, rtol", _CASES)
def test_corpus_case(case: Case, rtol: float):
    inputs = case.inputs(seed=0)
    program_args = set(case.program.argnames)
    assert set(inputs) == program_args, "make_inputs must return exactly the program's arrays"
    assert all(v.dtype == np.float64 or v.dtype.kind in "iu" for v in inputs.values()), "float64 values, integer indices"
    assert inputs[case.of].shape == (1,)
    assert set(case.wrt) <= set(inputs)

    sdfg = case.to_sdfg(simplify=True)
    assert {str(s) for s in sdfg.free_symbols} <= set(case.symbols)
    sdfg.name = f"{sdfg.name}_fwdtest"  # own build folder: other test files may compile the same program
    compiled = sdfg.compile()

    # 1. forward value
    out = run_compiled(case, compiled, inputs)
    expected = torch_value(case, inputs)
    np.testing.assert_allclose(out[case.of][0], expected, rtol=rtol, atol=rtol)
    assert np.isfinite(expected)

    # 2. the torch reference's derivative agrees with finite differences of the DaCe program
    grads = torch_grads(case, inputs)
    rng = np.random.default_rng(1)
    direction = {w: rng.normal(size=inputs[w].shape) for w in case.wrt}
    predicted = sum(float(np.sum(grads[w] * direction[w])) for w in case.wrt)
    scale = max(1.0, sum(float(np.abs(inputs[w]).max()) for w in case.wrt))
    fd_h, fd_2h = _directional_fd(case, compiled, inputs, direction, h=1e-6 * scale)
    # Richardson extrapolation removes the O(h^2) term of the central difference
    fd = (4 * fd_h - fd_2h) / 3
    np.testing.assert_allclose(predicted, fd, rtol=1e-6, atol=1e-7 * max(1.0, abs(fd)))
    for w in case.wrt:
        assert np.all(np.isfinite(grads[w]))
