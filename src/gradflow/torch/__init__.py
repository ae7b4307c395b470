"""PyTorch integration: compiled forward/backward SDFG pairs as `torch.autograd.Function`s and modules.

- `function(program, inputs, outputs)`: a differentiable callable; two dispatchers generated from one
  `FunctionPlan`: `"ctypes"` (Python fast path) and `"cpp"` (generated C++ torch extension).
- `Module(program, parameters=...)`: an `nn.Module` drop-in whose parameters are named inputs.
"""

from gradflow.torch.function import DISPATCHERS, Function, function
from gradflow.torch.module import Module
from gradflow.torch.plan import FunctionPlan, build_plan

__all__ = ["DISPATCHERS", "Function", "FunctionPlan", "Module", "build_plan", "function"]
