"""The three rule tables of reverse mode, their registration verbs, and the built-in tables.

- `reverse` (verb `reverse_rule`), keyed by operation kind ("map", "tasklet", "copy", "library",
  "nested"): a `ReverseRule` says which forward values its reverse reads (`needs`, so the engine can
  store or recompute them) and emits the backward dataflow (`reverse`).
- `library` (verb `library_rule`), keyed by library-node class name: a node with an applicable rule is kept
  whole by `expand_library_nodes` and reversed at op level (the "library" reverse rule delegates to it);
  one without is expanded into maps first.
- `control` (verb `control_rule`), keyed by region kind ("loop", "conditional"): a `ControlRule` says what
  the forward sweep records for a region and how the backward sweep reverses it (`autodiff/control.py`).

The built-in tables are collected once from `rule_modules()`, the one explicit list of rule modules. Passes take
the tables as fields (`Reverse(reverse_rules=..., ...)`, `ExpandLibraryNodes(library_rules=...)`) and the
engine hands them to rules through the context; nothing reads a module-level registry while running.
"""

from __future__ import annotations

import functools
from typing import Protocol

from gradflow.core.rule_table import RuleTable, collect, rule_verb

REVERSE, LIBRARY, CONTROL = "reverse", "library", "control"

#: `@reverse_rule(kind, ...)` on a class: its instance reverses operations of that kind.
reverse_rule = rule_verb(REVERSE)
#: `@library_rule(node_class_name, ...)` on a class: op-level reverse of that library node.
library_rule = rule_verb(LIBRARY)
#: `@control_rule(region_kind, ...)` on a class: recording and reversal of that kind of region.
control_rule = rule_verb(CONTROL)


class ReverseRule(Protocol):
    def needs(self, site, ctx) -> frozenset[str]:
        """Arrays whose forward values (as the operation read them) the reverse code reads."""

    def reverse(self, site, ctx) -> None:
        """Append the backward states of the operation to `ctx`."""


def rule_modules() -> tuple:
    """The explicit list of modules whose marked rules form the built-in tables (module order is rule
    order). Imported here, not at the top, because the rule modules import this one for their verbs."""
    from gradflow.autodiff import checkpoint, control
    from gradflow.autodiff.rules import copies, elementwise, extremum, library, nested, product
    from gradflow.autodiff.rules.library import contraction, convolution, matmul, reduce, transpose

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


def library_rule_for(table: RuleTable, node):
    """The op-level rule `table` has for library node `node`, or None (then the node is expanded)."""
    rule = table.lookup(type(node).__name__, node)
    return None if rule is None else rule.fn
