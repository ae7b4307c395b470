"""What `gradflow.grad` returns is an ordinary SDFG: DaCe's own `compile()` builds it (with DaCe's default
library implementations, not gradflow's BLAS) and its gradients match torch.autograd, for every program
of the corpora. (Elsewhere the same results run through gradflow's compiler; this is the second way.)"""

from __future__ import annotations

import numpy as np
import pytest

import gradflow
from gradflow.verify import programs
from gradflow.verify.corpus.case import torch_grads, torch_value
from gradflow.verify.corpus.library import CASES as LIBRARY_CASES

RTOL, ATOL = 1e-9, 1e-12
OVERFLOW = "gradflow_overflow"


def _run(sdfg, arrays: dict, symbols: dict, tmp_path) -> dict:
    sdfg.build_folder = str(tmp_path / "build")  # private: workers compile programs of the same name
    sdfg(**arrays, **symbols)
    return arrays


@pytest.mark.parametrize("name", [c.name for c in programs.cases()])
def test_corpus_program(name: str, tmp_path) -> None:
    case = programs.case_named(name)
    sdfg = gradflow.grad(case.to_sdfg(), wrt=list(case.wrt), of=case.of, forwarding=programs.forwarding_of(case))
    inputs = case.inputs(2)
    arrays = {k: np.array(v, copy=True) for k, v in inputs.items()}
    arrays.update({f"grad_{x}": np.full_like(inputs[x], np.nan) for x in case.wrt})
    if OVERFLOW in sdfg.arrays:
        arrays[OVERFLOW] = np.full(1, -1, dtype=np.int64)
    _run(sdfg, arrays, dict(case.symbols), tmp_path)
    if OVERFLOW in sdfg.arrays:
        assert arrays[OVERFLOW][0] == 0
    np.testing.assert_allclose(arrays[case.of][0], torch_value(case, inputs), rtol=RTOL, atol=ATOL)
    expected = torch_grads(case, inputs)
    for x in case.wrt:
        np.testing.assert_allclose(arrays[f"grad_{x}"], expected[x], rtol=RTOL, atol=ATOL, err_msg=x)


@pytest.mark.parametrize("case", LIBRARY_CASES, ids=lambda c: c.name)
def test_library_case(case, tmp_path) -> None:
    import torch

    sizes = {s: 3 for s in case.symbols}
    inputs = case.make_inputs(np.random.default_rng(4), sizes)
    sdfg = gradflow.grad(case.program.to_sdfg(simplify=True), wrt=list(case.wrt), of="S")
    arrays = {k: v.copy() for k, v in inputs.items()}
    arrays.update(S=np.zeros(1), **{f"grad_{x}": np.full_like(inputs[x], np.nan) for x in case.wrt})
    _run(sdfg, arrays, sizes, tmp_path)
    tensors = {k: torch.tensor(v, requires_grad=k in case.wrt) for k, v in inputs.items()}
    out = case.torch_fn(**tensors)
    grads = torch.autograd.grad(out, [tensors[x] for x in case.wrt])
    np.testing.assert_allclose(arrays["S"][0], out.item(), rtol=RTOL, atol=ATOL)
    for x, g in zip(case.wrt, grads):
        np.testing.assert_allclose(arrays[f"grad_{x}"], g.numpy(), rtol=RTOL, atol=ATOL, err_msg=x)
