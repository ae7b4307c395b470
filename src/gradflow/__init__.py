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

__version__ = "0.1.0"

__all__ = [
    "ArgumentError", "CompilationError", "GradflowError", "Graph", "InvalidArgumentError", "NoRuleError",
    "NotDifferentiableError", "Pass", "Pipeline", "UnknownArrayError", "register_pass", "registered_passes",
]
