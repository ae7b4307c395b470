"""Checks of the ONNX lowering table: every op type against ONNX's reference implementation.

Cases are ONNX's own backend node tests (`onnx.backend.test`, generated in memory; their expected
outputs come from ONNX's reference implementation), one single-node model each. For every key of the
lowering table, `selection(op, limit)` picks cases spread over the op's eligible cases (sorted by name);
eligible means every tensor of the case has an element type gradflow represents (see
`frontend/onnx/dtypes.py`: float8/float4/2- and 4-bit types, sequences and optionals are documented as
unsupported and are not an op's fault). An op type the backend tests do not cover gets written cases in
`WRITTEN` (a model and inputs), compared with `onnx.reference.ReferenceEvaluator`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import attrs
import numpy as np

from gradflow.frontend.onnx.errors import UnsupportedTypeError
from gradflow.frontend.onnx.rules import default_table
from gradflow.verify.onnx_conformance import all_node_cases, case_op, cases_in_scope, measure_case


@attrs.frozen
class WrittenCase:
    """A hand-written single-op case: `build()` returns (model, inputs); outputs come from onnx.reference."""

    name: str
    op: str
    build: Callable[[], tuple[Any, list[np.ndarray]]]
    rtol: float = 1e-5
    atol: float = 1e-6


def _split_then_pick(split: list[int] | int | None, axis: int, keepdims: int, positions: list[int],
                     shape: tuple[int, ...]) -> Callable[[], tuple[Any, list[np.ndarray]]]:
    """A model SplitToSequence -> SequenceAt (one output per position): the backend node tests of both ops
    return sequences, which gradflow does not represent as graph outputs."""

    def build():
        from onnx import TensorProto, helper, shape_inference

        inits = [] if split is None else [helper.make_tensor("split", TensorProto.INT64, np.shape(split),
                                                             np.asarray(split).reshape(-1).tolist())]
        nodes = [helper.make_node("SplitToSequence", ["x"] + ([] if split is None else ["split"]), ["seq"], axis=axis,
                                  keepdims=keepdims)]
        outs = []
        for k, pos in enumerate(positions):
            inits.append(helper.make_tensor(f"pos{k}", TensorProto.INT64, (), [pos]))
            nodes.append(helper.make_node("SequenceAt", ["seq", f"pos{k}"], [f"y{k}"]))
            outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
        graph = helper.make_graph(nodes, "split_then_pick", [x], outs, initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model = shape_inference.infer_shapes(model, strict_mode=True)
        return model, [np.random.default_rng(0).standard_normal(shape).astype(np.float32)]

    return build


def _stopped(shape: tuple[int, ...], elem: int) -> Callable[[], tuple[Any, list[np.ndarray]]]:
    """A model `y = x * StopGradient(x * x)` (gradflow's own domain; its gradient is checked in
    `tests/autodiff/test_stop_gradient.py`)."""

    def build():
        from onnx import helper

        nodes = [helper.make_node("Mul", ["x", "x"], ["xx"]),
                 helper.make_node("StopGradient", ["xx"], ["s"], domain="gradflow"),
                 helper.make_node("Mul", ["x", "s"], ["y"])]
        graph = helper.make_graph(nodes, "stopped", [helper.make_tensor_value_info("x", elem, shape)],
                                  [helper.make_tensor_value_info("y", elem, shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                        helper.make_opsetid("gradflow", 1)])
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        return model, [np.random.default_rng(0).standard_normal(shape).astype(dtype)]

    return build


def _reference_ops() -> list[type]:
    """onnx.reference implementations of gradflow's own ops (the value: a stop is the identity)."""
    from onnx.reference.op_run import OpRun

    class StopGradient(OpRun):
        op_domain = "gradflow"

        def _run(self, x):  # noqa: D102
            return (x,)

    return [StopGradient]


#: op type -> written cases, for op types without backend node tests (or whose tests gradflow cannot run).
WRITTEN: dict[str, tuple[WrittenCase, ...]] = {
    "StopGradient": (
        WrittenCase("written_stop_gradient_float", "StopGradient", _stopped((3, 4), 1)),
        WrittenCase("written_stop_gradient_double", "StopGradient", _stopped((5,), 11), rtol=1e-13, atol=1e-14),
    ),
    "SplitToSequence": (
        WrittenCase("written_split_to_sequence_chunks", "SplitToSequence", _split_then_pick(2, 1, 1, [0, -1], (3, 5))),
        WrittenCase("written_split_to_sequence_sizes", "SplitToSequence",
                    _split_then_pick([1, 3], 0, 1, [1, 0], (4, 2))),
    ),
    "SequenceAt": (
        WrittenCase("written_sequence_at_no_keepdims", "SequenceAt", _split_then_pick(None, 0, 0, [2, -3], (3, 4))),
    ),
}


def _supported(case: Any) -> bool:
    from gradflow.frontend.onnx.dtypes import elem_dtype, input_dtype

    graph = case.model.graph
    try:
        for vi in list(graph.input) + list(graph.output):
            input_dtype(vi)
        for node in graph.node:
            for a in node.attribute:
                if a.name == "to":
                    elem_dtype(a.i, "the Cast target")
    except UnsupportedTypeError:
        return False
    return True


@functools.cache
def eligible(op: str) -> tuple[str, ...]:
    """The backend node cases of `op` gradflow can represent, by name."""
    cases = cases_in_scope((op,))
    return tuple(sorted(n for n, c in cases.items() if _supported(c)))


def selection(op: str, limit: int) -> tuple[str, ...]:
    """Up to `limit` case names of `op`, spread evenly over its eligible cases (first and last included)."""
    names = eligible(op) + tuple(w.name for w in WRITTEN.get(op, ()))
    if len(names) <= limit:
        return names
    if limit == 1:
        return names[:1]
    picks = sorted({round(i * (len(names) - 1) / (limit - 1)) for i in range(limit)})
    return tuple(names[i] for i in picks)


def ops() -> tuple[str, ...]:
    """The keys of the built-in lowering table."""
    return tuple(sorted(default_table().keys()))


def check(name: str) -> float:
    """Run case `name` (a backend node case or a written one): the worst relative error against the
    reference, or `CheckFailure`; lowering and compile errors propagate as typed errors."""
    written = {w.name: w for cases in WRITTEN.values() for w in cases}
    if name in written:
        return _check_written(written[name])
    return measure_case(all_node_cases()[name])


def _check_written(case: WrittenCase) -> float:
    from onnx.reference import ReferenceEvaluator

    from gradflow.frontend.onnx.program import load
    from gradflow.verify.compare import agree

    model, inputs = case.build()
    expected = ReferenceEvaluator(model, new_ops=_reference_ops()).run(
        None, {i.name: v for i, v in zip(model.graph.input, inputs)})
    got = load(model)(*inputs)
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, expected)):
        worst = max(worst, agree(np.asarray(g), np.asarray(w), rtol=case.rtol, atol=case.atol,
                                 what=f"{case.name}: output {k}"))
    return worst


def op_of(name: str) -> str:
    written = {w.name: w.op for cases in WRITTEN.values() for w in cases}
    return written.get(name) or case_op(all_node_cases()[name])
