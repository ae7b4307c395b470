"""gradflow: automatic differentiation of DaCe SDFGs as pure graph rewriting.

Public API: `grad`, `vjp`, `value_and_grad` (reverse mode), `jvp`, `value_and_jvp` (forward mode), `hvp`,
`grad_and_hvp`, `hessian` (second order), `jacfwd`, `jacrev` (dense Jacobians), the forwarding policies
(`STORE_ALL`, `RECOMPUTE_ALL`, `recompute`, `Forwarding`), `Graph`, `Pass`, `Pipeline` (custom pipelines),
the typed errors, and `gradflow.onnx.load` (ONNX models). Everything else is reachable through the subpackages.
"""

from gradflow.core import (
    ArgumentError,
    CacheWarning,
    CompilationError,
    GradflowError,
    Graph,
    InvalidArgumentError,
    LoopBoundError,
    NoRuleError,
    NotDifferentiableError,
    Pass,
    Pipeline,
    UnknownArrayError,
    register_pass,
    registered_passes,
)

from gradflow.core.dace_warnings import ignore_tape_pushes
from gradflow.api import grad, value_and_grad, vjp
from gradflow.forward import grad_and_hvp, hessian, hvp, jvp, value_and_jvp
from gradflow.jacobians import jacfwd, jacrev
from gradflow.autodiff.forwarding import RECOMPUTE_ALL, STORE_ALL, Forwarding, recompute
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.passes import ad_pipeline

import gradflow.onnx  # noqa: E402,F401  - `gradflow.onnx.load`; registers the `onnx_lower` pass
import gradflow.frontend.numpy_prod  # noqa: E402,F401  - `np.prod` in DaCe programs (a product Reduce)
from gradflow.frontend.stop_gradient import stop_gradient  # noqa: E402  - registers it for DaCe programs
import gradflow.transforms.internal_names  # noqa: E402,F401  - registers its pass (imported lazily elsewhere)
import gradflow.gpu  # noqa: E402,F401  - `gradflow.gpu.OPTIMIZE_GPU`; registers the `to_gpu` pass

__version__ = "0.1.0"

ignore_tape_pushes()  # DaCe's warning about the first tape push of a loop (see core/dace_warnings.py)

__all__ = [
    "grad", "vjp", "value_and_grad", "VJPResult", "ad_pipeline", "jvp", "value_and_jvp", "hvp", "grad_and_hvp",
    "hessian", "stop_gradient",
    "jacfwd", "jacrev",
    "Forwarding", "STORE_ALL", "RECOMPUTE_ALL", "recompute",
    "ArgumentError", "CacheWarning", "CompilationError", "GradflowError", "Graph", "InvalidArgumentError",
    "LoopBoundError",
    "NoRuleError",
    "NotDifferentiableError", "Pass", "Pipeline", "UnknownArrayError", "register_pass", "registered_passes",
]
