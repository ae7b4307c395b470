"""`onnx.backend.base.Backend` over gradflow, so ONNX's backend test machinery can drive it."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from gradflow.frontend.onnx.program import OnnxProgram, load


class GradflowBackendRep(BackendRep):
    def __init__(self, program: OnnxProgram) -> None:
        self.program = program

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            outs = self.program(**inputs)
        elif isinstance(inputs, (list, tuple)):
            outs = self.program(*inputs)
        else:
            outs = self.program(inputs)
        return namedtupledict("Outputs", self.program.output_names)(*outs)


class GradflowBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> GradflowBackendRep:
        super().prepare(model, device, **kwargs)
        return GradflowBackendRep(load(model))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info=None, **kwargs: Any) -> tuple:
        """Wrap one node into a model (output types from shape inference) and run it."""
        names = [n for n in node.input if n]
        arrays = [np.asarray(a) for a in inputs]
        in_infos = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in zip(names, arrays)]
        out_infos = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output]
        graph = onnx.helper.make_graph([node], "run_node", in_infos, out_infos)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        return cls.run_model(model, arrays, device)


prepare = GradflowBackend.prepare
run_model = GradflowBackend.run_model
run_node = GradflowBackend.run_node
supports_device = GradflowBackend.supports_device
