"""Every op type of the ONNX lowering table against ONNX's reference outputs (`gradflow.verify.onnx_ops`).

The cases are chosen from the table, not by hand: for each key, two of its backend node cases spread over
the eligible ones (a key added to the table gets cases, or a written case, or this suite fails).
"""

from __future__ import annotations

import pytest

from gradflow.verify import onnx_ops

CASES = [(op, name) for op in onnx_ops.ops() for name in onnx_ops.selection(op, 2)]


@pytest.mark.parametrize("op, name", CASES, ids=[n for _, n in CASES])
def test_op_matches_reference(op: str, name: str) -> None:
    assert onnx_ops.op_of(name) == op
    onnx_ops.check(name)


def test_every_op_of_the_table_has_cases() -> None:
    missing = [op for op in onnx_ops.ops() if not onnx_ops.selection(op, 2)]
    assert not missing, f"ops of the lowering table without any conformance case: {missing}"
