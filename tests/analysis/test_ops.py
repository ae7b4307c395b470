"""analysis.ops: a state as an ordered sequence of operations, and the refusal when no order exists."""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch

import gradflow
from gradflow.analysis.ops import decompose
from gradflow.core.errors import NotDifferentiableError


def _swap_squares(through_temporary: bool) -> dace.SDFG:
    """x[0:2] = x[2:4] ** 2 and x[2:4] = x[0:2] ** 2 as two maps between the same two access nodes of x (a
    state DaCe's frontend does not make, but a hand-built or transformed SDFG may), then
    S = sum((i + 1) * x[i]). With `through_temporary` the second map reads a copy of x taken first."""
    sdfg = dace.SDFG("swap_squares")
    sdfg.add_array("x", [4], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    state = sdfg.add_state("assign_7_4")
    old, new = state.add_read("x"), state.add_write("x")
    source = old
    if through_temporary:
        sdfg.add_transient("t", [4], dace.float64)
        source = state.add_access("t")
        state.add_nedge(old, source, dace.Memlet("x[0:4]"))
    for name, reads, offset_in, offset_out in (("front", old, 2, 0), ("back", source, 0, 2)):
        state.add_mapped_tasklet(name, {"i": "0:2"}, {"a": dace.Memlet(f"{reads.data}[i + {offset_in}]")},
                                 "b = a * a", {"b": dace.Memlet(f"x[i + {offset_out}]")},
                                 input_nodes={reads.data: reads}, output_nodes={"x": new}, external_edges=True)
    total = sdfg.add_state_after(state, "sum_9")
    total.add_mapped_tasklet("weigh", {"i": "0:4"}, {"a": dace.Memlet("x[i]")}, "b = (i + 1) * a",
                             {"b": dace.Memlet("S[0]", wcr="lambda p, q: p + q")}, external_edges=True)
    sdfg.validate()
    return sdfg


def test_reads_each_before_the_other_overwrites_is_refused_in_the_users_terms() -> None:
    sdfg = _swap_squares(through_temporary=False)
    state = next(s for s in sdfg.states() if s.label == "assign_7_4")
    with pytest.raises(NotDifferentiableError) as caught:
        decompose(state)
    text = str(caught.value)
    assert "updates of 'x'" in text and "line 7" in text
    assert "x[0:2] from x[2:4]" in text and "x[2:4] from x[0:2]" in text
    assert "temporary" in caught.value.hint
    with pytest.raises(NotDifferentiableError, match="no order of them keeps every read"):
        gradflow.grad(sdfg, wrt="x")


def test_the_hint_read_through_a_temporary_is_differentiated() -> None:
    sdfg = _swap_squares(through_temporary=True)
    x = np.array([0.3, -1.2, 2.5, 0.7])
    value, grad_x = gradflow.value_and_grad(sdfg, wrt="x", of="S")(x=x.copy(), S=np.zeros(1))

    xt = torch.tensor(x, requires_grad=True)
    swapped = torch.cat([xt[2:4] ** 2, xt[0:2] ** 2])
    total = (swapped * torch.arange(1, 5, dtype=torch.float64)).sum()
    total.backward()
    np.testing.assert_allclose(value, total.item(), rtol=1e-12)
    np.testing.assert_allclose(grad_x, xt.grad.numpy(), rtol=1e-12)
