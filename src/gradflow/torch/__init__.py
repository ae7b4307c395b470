"""PyTorch integration: compiled forward/backward SDFG pairs as `torch.autograd.Function`s and modules.

- `function(program, inputs, outputs)`: a differentiable callable; two dispatchers generated from one
  `FunctionPlan`: `"ctypes"` (Python fast path) and `"cpp"` (generated C++ torch extension).
- `Module(program, parameters=...)`: an `nn.Module` drop-in whose parameters are named inputs.
- `torch.compile(model, backend="gradflow")` (`backend`): each graph TorchDynamo captures, compiled by
  `compile` (see `gradflow/torch/dynamo.py`).
- `compile(module, example_inputs)`: a torch model as a drop-in compiled `nn.Module` (same parameters,
  buffers, state_dict; exported to ONNX, lowered and differentiated by gradflow).
"""

from gradflow.torch.batch import BatchSpecializationWarning
from gradflow.torch.compiled import CompiledModule, compile
from gradflow.torch.dynamo import BackendError, backend, register
from gradflow.torch.export import ExportError, LostParameterError
from gradflow.torch.function import DISPATCHERS, Function, function
from gradflow.torch.module import Module
from gradflow.torch.plan import FunctionPlan, build_plan

register()  # torch.compile(model, backend="gradflow")

__all__ = ["DISPATCHERS", "BackendError", "BatchSpecializationWarning", "CompiledModule", "ExportError",
           "Function", "FunctionPlan", "LostParameterError", "Module", "backend", "build_plan", "compile",
           "function"]
