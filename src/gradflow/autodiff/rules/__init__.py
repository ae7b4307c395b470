"""The built-in rule tables of reverse mode, collected from `rule_modules()`, the one explicit list of
rule modules (module order is rule order); the verbs and protocols are re-exported from
`autodiff/protocols.py`, where the rule modules take them from.

Passes take the tables as fields (`Reverse(reverse_rules=..., ...)`, `ExpandLibraryNodes(library_rules=...)`)
and the engine hands them to rules through the context; nothing reads a module-level registry while running.
"""

from __future__ import annotations

import functools

from gradflow.autodiff import checkpoint, control
from gradflow.autodiff.protocols import (  # noqa: F401  (the public verbs live with the tables)
    CONTROL,
    LIBRARY,
    REVERSE,
    ControlRule,
    ReverseRule,
    control_rule,
    library_rule,
    library_rule_for,
    reverse_rule,
)
from gradflow.autodiff.rules import (
    copies,
    elementwise,
    extremum,
    library,
    nested,
    product,
)
from gradflow.autodiff.rules.library import (
    contraction,
    convolution,
    matmul,
    reduce,
    transpose,
)
from gradflow.autodiff.spec import ADTables
from gradflow.core.rule_table import RuleTable, collect


def rule_modules() -> tuple:
    """The modules whose marked rules form the built-in tables."""
    return (elementwise, extremum, product, copies, nested, library, matmul, reduce, transpose, contraction,
            convolution, control, checkpoint)


@functools.cache
def default_reverse_rules() -> RuleTable:
    return collect(REVERSE, rule_modules())


@functools.cache
def default_library_rules() -> RuleTable:
    return collect(LIBRARY, rule_modules())


@functools.cache
def default_control_rules() -> RuleTable:
    return collect(CONTROL, rule_modules())


def default_tables() -> ADTables:
    """The three built-in tables, bundled as one reverse-mode build takes them."""
    return ADTables(default_reverse_rules(), default_library_rules(), default_control_rules())
