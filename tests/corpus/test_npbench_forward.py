"""The NPBench corpus is honest: every DaCe program computes what its torch reference computes.

Independent of AD. For each kernel (its plain forward program compiled once, through gradflow's cache):
1. the value of `of` equals `torch_fn` at rtol 1e-9, on two seeds of the case's input generator;
2. the torch reference's gradient, contracted with a random direction, equals a central finite difference
   of the compiled DaCe program along that direction, so the references the AD benchmark compares
   against (`benchmarks/npbench_ad.py`) have the right derivative too.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from gradflow.core.graph import Graph
from gradflow.runtime.compile import compile_sdfg

from . import npbench
from gradflow.verify.corpus.case import Case, run_compiled, torch_grads, torch_value

RTOL = 1e-9

#: The kernels upstream DaCe's `tests/npbench` differentiates (each file with a `test_autodiff`).
UPSTREAM_AD_KERNELS = (
    "adi atax bicg cavity_flow cholesky conv2d_bias correlation covariance deriche doitgen durbin fdtd_2d gemm "
    "gemver gesummv go_fast gramschmidt hdiff heat_3d jacobi_1d jacobi_2d k2mm k3mm lenet lu ludcmp mlp mvt "
    "resnet seidel_2d symm syr2k syrk trisolv trmm vadv softmax"
).split()


@functools.cache
def compiled_forward(name: str):
    return compile_sdfg(Graph.of(npbench.CASES_BY_NAME[name].to_sdfg()))


def test_corpus_has_every_upstream_ad_kernel() -> None:
    assert sorted(npbench.CASES_BY_NAME) == sorted(f"nb_{k}" for k in UPSTREAM_AD_KERNELS)
    assert len(npbench.CASES) == len(npbench.CASES_BY_NAME) == 37


def _directional_fd(case: Case, compiled, inputs, direction, h):
    def f(t):
        shifted = dict(inputs)
        for w in case.wrt:
            shifted[w] = inputs[w] + t * direction[w]
        return float(run_compiled(case, compiled, shifted)[case.of][0])

    return (f(h) - f(-h)) / (2 * h), (f(2 * h) - f(-2 * h)) / (4 * h)


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in npbench.CASES])
def test_forward_matches_torch(case: Case) -> None:
    inputs = case.inputs(seed=0)
    assert set(inputs) == set(case.program.argnames), "make_inputs must return exactly the program's arrays"
    assert all(v.dtype == np.float64 for v in inputs.values())
    assert inputs[case.of].shape == (1,)
    assert set(case.wrt) <= set(inputs)
    assert {str(s) for s in case.to_sdfg().free_symbols} <= set(case.symbols)

    compiled = compiled_forward(case.name)
    for seed in (0, 1):
        inputs = case.inputs(seed)
        expected = torch_value(case, inputs)
        assert np.isfinite(expected)
        out = run_compiled(case, compiled, inputs)
        np.testing.assert_allclose(out[case.of][0], expected, rtol=RTOL, atol=0.0, err_msg=f"seed {seed}")


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in npbench.CASES])
def test_reference_derivative_matches_finite_differences(case: Case) -> None:
    inputs = case.inputs(seed=0)
    grads = torch_grads(case, inputs)
    for w in case.wrt:
        assert np.all(np.isfinite(grads[w]))
    rng = np.random.default_rng(1)
    direction = {w: rng.normal(size=inputs[w].shape) for w in case.wrt}
    predicted = sum(float(np.sum(grads[w] * direction[w])) for w in case.wrt)
    scale = max(1.0, sum(float(np.abs(inputs[w]).max()) for w in case.wrt))
    fd_h, fd_2h = _directional_fd(case, compiled_forward(case.name), inputs, direction, h=1e-6 * scale)
    fd = (4 * fd_h - fd_2h) / 3  # Richardson extrapolation removes the O(h^2) term of the central difference
    np.testing.assert_allclose(predicted, fd, rtol=1e-6, atol=1e-7 * max(1.0, abs(fd)))
