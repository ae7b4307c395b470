"""The reverse-rule tables.

`REVERSE_RULES` is keyed by operation kind ("map", "tasklet", "copy", "library", "nested"); a rule is a
`ReverseRule`: which forward values it needs (so the engine can store or recompute them) and how it emits
the backward dataflow. `LIBRARY_RULES` is keyed by library node class name: a library node with a rule
there is kept whole and reversed at op level; one without is expanded into maps before reverse mode.
"""

from __future__ import annotations

from typing import Callable, Protocol

from dace.sdfg import nodes as nd

from gradflow.core.rule_table import MutableRuleRegistry


class ReverseRule(Protocol):
    def needs(self, site, ctx) -> frozenset[str]:
        """Arrays whose forward values (as the operation read them) the reverse code reads."""

    def reverse(self, site, ctx) -> None:
        """Append the backward states of the operation to `ctx`."""


REVERSE_RULES: MutableRuleRegistry[ReverseRule] = MutableRuleRegistry("reverse")
LIBRARY_RULES: MutableRuleRegistry[ReverseRule] = MutableRuleRegistry("library")


def library_rule_for(node: nd.LibraryNode):
    load_builtin_rules()  # expand_library_nodes asks before the engine has loaded the rules
    rule = LIBRARY_RULES.table.lookup(type(node).__name__, node)
    return None if rule is None else rule.fn


def register_reverse(kind: str, *, priority: int = 0, applies: Callable[..., bool] | None = None):
    """Class decorator: register an instance of the class as the reverse rule for `kind`."""

    def deco(cls):
        kwargs = {"priority": priority, "name": cls.__name__}
        if applies is not None:
            kwargs["applies"] = applies
        REVERSE_RULES.register(kind, **kwargs)(cls())
        return cls

    return deco


def load_builtin_rules() -> None:
    """Import the modules whose decorators fill the tables."""
    from gradflow.autodiff.rules import copies, elementwise, extremum, library, nested  # noqa: F401

    library.load()
