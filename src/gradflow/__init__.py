"""gradflow: reverse-mode automatic differentiation of DaCe SDFGs as pure graph rewriting.

Public API: `grad`, `vjp`, `value_and_grad` (functional AD), `Graph`, `Pass`, `Pipeline` (custom pipelines),
and the typed errors. Everything else is reachable through the subpackages.
"""

from gradflow.core import (
    ArgumentError,
    CompilationError,
    GradflowError,
    Graph,
    InvalidArgumentError,
    NoRuleError,
    NotDifferentiableError,
    Pass,
    Pipeline,
    UnknownArrayError,
    register_pass,
    registered_passes,
)

from gradflow.api import grad, value_and_grad, vjp
from gradflow.autodiff.interface import VJPResult
from gradflow.autodiff.passes import ad_pipeline

__version__ = "0.1.0"

__all__ = [
    "grad", "vjp", "value_and_grad", "VJPResult", "ad_pipeline",
    "ArgumentError", "CompilationError", "GradflowError", "Graph", "InvalidArgumentError", "NoRuleError",
    "NotDifferentiableError", "Pass", "Pipeline", "UnknownArrayError", "register_pass", "registered_passes",
]
