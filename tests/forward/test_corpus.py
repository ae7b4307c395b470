"""Forward mode on every program of the dataflow, loop and NPBench corpora: the tangent of `of` along a
random direction equals `torch.func.jvp` of the torch reference (float64, rtol 1e-9), and Hessian-vector
products (forward over reverse) equal torch's on a sample of them. Programs forward mode refuses are listed
with the error they must raise: a typed refusal, never a wrong number. One build per case and kind
(`verify.tangents`); the data are the case's own."""

from __future__ import annotations

import pytest

from gradflow.core.errors import NotDifferentiableError
from gradflow.verify.programs import cases
from gradflow.verify.tangents import REFUSED, check_hvp, check_jvp
from tests.corpus.npbench import CASES as NPBENCH

CASES = {c.name: c for c in (*cases(), *NPBENCH)}


#: the tangent is not finite: the program's batch normalization takes `sqrt` of a zero variance (the padded
#: border), whose tangent is 0/0, and `np.maximum(x, 0)` passes half of it on at the tie x = 0; the torch
#: reference's `relu` drops it. Checked against torch with `torch.maximum` instead, below.
NOT_FINITE = {"nb_resnet"}

#: a sample of programs for the Hessian-vector products (loops, branches, library nodes, nesting), the
#: products with zero factors (the reverse of a product multiplies with a write-conflict product), and the
#: loops gradflow cannot bound before the run, whose gradient programs keep values on growable stacks (a
#: while loop, a for loop counted from data: the tangents travel through the heap with the values)
HVP = sorted({n for n in sorted(CASES)[::3] if n not in NOT_FINITE}
             | {"df_prod", "df_prod_map", "lp_api_do_while", "lp_bound_from_data", "lp_newton_sqrt"})


@pytest.mark.parametrize("name", sorted(n for n in CASES if n not in REFUSED and n not in NOT_FINITE))
def test_jvp_equals_torch(name):
    check_jvp(CASES[name])  # CheckFailure unless allclose(rtol 1e-9, atol 1e-12) to torch


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refusals_are_typed(name):
    with pytest.raises(NotDifferentiableError, match=REFUSED[name]):
        check_jvp(CASES[name])


@pytest.mark.parametrize("name", [n for n in HVP if n not in REFUSED])
def test_hvp_equals_torch(name):
    check_hvp(CASES[name])


def test_resnet_tangent_is_not_finite_as_torch_maximum_gives():
    import numpy as np
    import torch

    import tests.corpus.npbench as nb
    from gradflow.verify import tangents

    case = CASES["nb_resnet"]
    original = nb.torch.relu
    try:
        nb.torch.relu = lambda x: torch.maximum(x, torch.zeros_like(x))
        inputs = case.inputs(0)
        want = tangents.torch_jvp(case, inputs, tangents.direction(case, inputs, 0))
    finally:
        nb.torch.relu = original
    with pytest.raises(Exception, match="nan"):
        check_jvp(case)
    assert np.isnan(want)


def test_central_differences_give_the_derivative_and_skip_kinks():
    """The tangent check's second reference: a smooth function's directional derivative within rounding,
    None near a kink along the direction (within the steps; one exactly at the point is symmetric, and
    differences give the mean slope there, as the tangents of max and relu do)."""
    import numpy as np

    from gradflow.verify.tangents import central_difference

    x, v = np.array([0.3, -1.2]), np.array([1.0, 2.0])
    smooth = central_difference(lambda a: float(np.sum(np.sin(a["x"]))), {"x": x}, {"x": v})
    assert smooth is not None and abs(smooth[0] - float(np.cos(x) @ v)) < 1e-9
    kink = central_difference(lambda a: float(np.max(a["x"] * [1.0, 0.0])), {"x": np.array([0.5e-5, 0.0])},
                              {"x": v})
    assert kink is None
