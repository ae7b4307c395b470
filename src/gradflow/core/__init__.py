"""gradflow's core: the graph value, passes and pipelines, rule tables, errors, declarative tables."""

from gradflow.core.errors import (
    ArgumentError,
    CacheWarning,
    CompilationError,
    GradflowError,
    InvalidArgumentError,
    LoopBoundError,
    NoRuleError,
    NotDifferentiableError,
    PassError,
    PurityError,
    RuleTableError,
    UnknownArrayError,
    render,
)
from gradflow.core.graph import Graph, fingerprint
from gradflow.core.passes import PASS_REGISTRY, Pass, Pipeline, register_pass, registered_passes, unwrap_or_raise
from gradflow.core.rule_table import Rule, RuleTable, collect, rule_verb

__all__ = [
    "ArgumentError", "CacheWarning", "CompilationError", "GradflowError", "InvalidArgumentError", "LoopBoundError",
    "NoRuleError",
    "NotDifferentiableError", "PassError", "PurityError", "RuleTableError", "UnknownArrayError", "render",
    "Graph", "fingerprint", "PASS_REGISTRY", "Pass", "Pipeline", "register_pass", "registered_passes",
    "unwrap_or_raise", "Rule", "RuleTable", "collect", "rule_verb",
]
