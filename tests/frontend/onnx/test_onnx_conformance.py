"""The ONNX backend interface and the classification of conformance failures. The per-op conformance
cases run in tests/verify/test_onnx_ops.py (chosen from the lowering table); all cases:
benchmarks/onnx_conformance.py."""

from __future__ import annotations

import numpy as np

from gradflow.frontend.onnx.backend import GradflowBackend
from gradflow.verify.onnx_conformance import all_node_cases, run_case


def test_backend_run_node_and_device():
    from onnx import helper

    assert GradflowBackend.supports_device("CPU") and not GradflowBackend.supports_device("CUDA")
    node = helper.make_node("Mul", ["a", "b"], ["c"])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    (c,) = GradflowBackend.run_node(node, [a, b])
    np.testing.assert_array_equal(c, a * b)


def test_failures_are_classified_by_reason():
    cases = all_node_cases()
    fp8 = run_case(cases["test_cast_FLOAT_to_FLOAT8E4M3FN"])
    assert not fp8.passed and fp8.category == "element-type" and "FLOAT8E4M3FN" in fp8.reason
    seq = run_case(cases["test_identity_sequence"])
    assert not seq.passed and seq.category == "non-tensor" and "sequence" in seq.reason
