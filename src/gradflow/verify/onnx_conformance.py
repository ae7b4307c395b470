"""ONNX backend node test cases for the ops gradflow covers, run through `GradflowBackend`.

Cases come from `onnx.backend.test.case.node.collect_testcases` (generated in memory; expected outputs
computed by ONNX's reference implementation). A case passes when every data set matches with the case's
own tolerances. Shared by the ONNX table's checks (`verify/onnx_ops.py`), the CI test (a curated subset)
and benchmarks/onnx_conformance.py (all cases). A check of the frontend against references, so it lives
with the other checks (`verify/compare.py` decides agreement), above the frontend it runs.
"""

from __future__ import annotations

import functools
import traceback
import warnings
from typing import Any

import attrs
import numpy as np

from gradflow.frontend.onnx.backend import GradflowBackend
from gradflow.frontend.onnx.errors import UnsupportedOpError, UnsupportedTypeError
from gradflow.verify.compare import CheckFailure, agree

#: The ops in scope of issue 5 (the frontend lowers more; these are the ones measured).
OPS_IN_SCOPE = (
    "Abs Add AveragePool Cast Clip Concat Conv ConvTranspose Cos Div Dropout Erf Exp Expand Flatten Gather "
    "GatherElements GatherND Gelu Gemm GlobalAveragePool Identity LayerNormalization LeakyRelu Log LogSoftmax "
    "MatMul Max MaxPool Min Mul Neg Pad Pow Reciprocal ReduceL2 ReduceLogSumExp ReduceMean ReduceSum Relu "
    "Reshape Resize ScatterElements ScatterND Sigmoid Sin Slice Softmax SoftmaxCrossEntropyLoss Split Sqrt "
    "Squeeze Sub Tanh Tile TopK Transpose Trilu Unsqueeze Where BatchNormalization Constant Shape ReduceMax "
    "ReduceMin Softplus Sum CumSum Einsum Floor Ceil PRelu InstanceNormalization ArgMax ArgMin Mod OneHot"
).split()


@functools.cache
def all_node_cases() -> dict[str, Any]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return {c.name: c for c in node.collect_testcases(None)}


def case_op(case: Any) -> str:
    """The op a node case tests: the op type of its (single, non-expanded) node."""
    ops = [n.op_type for n in case.model.graph.node]
    return ops[-1] if len(ops) == 1 else ops[0]


def cases_in_scope(ops: tuple[str, ...] = tuple(OPS_IN_SCOPE)) -> dict[str, Any]:
    """Non-expanded node cases whose tested op is in `ops` (expanded variants test other ops' composition)."""
    out = {}
    for name, case in all_node_cases().items():
        if name.endswith("_expanded") or "_expanded_" in name:
            continue
        if len(case.model.graph.node) != 1:
            continue
        if case_op(case) in ops:
            out[name] = case
    return out


#: Why a case failed, from the most to the least expected.
CATEGORIES = {
    "element-type": "an element type gradflow does not represent (UnsupportedTypeError: float8/float4, 2-/4-bit ints)",
    "non-tensor": "a sequence / optional / map value (UnsupportedTypeError)",
    "unsupported": "an op, attribute or opset the rules do not cover (UnsupportedOpError)",
    "mismatch": "ran, but the outputs differ from the reference beyond the case's tolerances",
    "error": "any other exception (a bug)",
}


@attrs.frozen
class Outcome:
    name: str
    op: str
    passed: bool
    reason: str = ""
    category: str = ""  # a key of CATEGORIES when not passed


def _category(exc: BaseException) -> str:
    if isinstance(exc, UnsupportedTypeError):
        return "non-tensor" if exc.type_name in ("sequence", "optional", "map", "sparse_tensor", "untyped") else "element-type"
    if isinstance(exc, UnsupportedOpError):
        return "unsupported"
    return "error"


def measure_case(case: Any) -> float:
    """Load the case's model with gradflow, run every data set and compare with the reference outputs at
    the case's own tolerances: the worst relative error, or `CheckFailure` naming the output at fault.
    Lowering and compile errors propagate (typed `GradflowError`s)."""
    rep = GradflowBackend.prepare(case.model, "CPU")
    worst = 0.0
    for n, (inputs, expected) in enumerate(case.data_sets):
        outs = rep.run([_as_array(a) for a in inputs])
        expected = [np.asarray(_as_array(a)) for a in expected]
        if len(outs) != len(expected):
            raise CheckFailure(f"{case.name}: {len(outs)} outputs, expected {len(expected)}")
        for k, (got, want) in enumerate(zip(outs, expected)):
            got = np.asarray(got)
            if got.dtype != want.dtype:
                raise CheckFailure(f"{case.name}: output {k} has dtype {got.dtype}, expected {want.dtype}")
            worst = max(worst, agree(got, want, rtol=case.rtol, atol=case.atol,
                                     what=f"{case.name}: output {k} of data set {n}"))
    return worst


def run_case(case: Any) -> Outcome:
    """`measure_case`, with every failure classified (`CATEGORIES`) instead of raised."""
    op = case_op(case)
    try:
        measure_case(case)
    except CheckFailure as exc:
        return Outcome(case.name, op, False, str(exc)[:240], "mismatch")
    except Exception as exc:  # noqa: BLE001 - every failure is a reported reason
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Outcome(case.name, op, False, f"{type(exc).__name__}: {msg[:240]}", _category(exc))
    return Outcome(case.name, op, True)


def _as_array(value: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


def format_trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-3000:]
