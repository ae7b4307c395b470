"""The built-in tables of forward mode, collected from `rule_modules()`, the one list of tangent rule
modules."""

from __future__ import annotations

import functools

from gradflow.autodiff.tangent import library, rules
from gradflow.autodiff.tangent.context import TANGENT, TANGENT_LIBRARY, TangentTables
from gradflow.core.rule_table import RuleTable, collect


def rule_modules() -> tuple:
    return (rules, library)


@functools.cache
def default_tangent_rules() -> RuleTable:
    return collect(TANGENT, rule_modules())


@functools.cache
def default_tangent_library_rules() -> RuleTable:
    return collect(TANGENT_LIBRARY, rule_modules())


def default_tangent_tables() -> TangentTables:
    return TangentTables(default_tangent_rules(), default_tangent_library_rules())
