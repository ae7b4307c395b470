"""Op-level reverse rules for DaCe library nodes, one module per node family.

`LibraryReverse` is the `REVERSE_RULES` entry for operations of kind "library": it finds the
`LIBRARY_RULES` entry for the node's class name and delegates to it. A node class that has an entry here is
kept whole by `expand_library_nodes` (its `applies` predicate decides per node), so the backward of e.g. a
matrix product is made of matrix products (BLAS calls once compiled, see `gradflow.runtime.blas`).

Covered and uncovered nodes: `docs/library_nodes.md`.
"""

from __future__ import annotations

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.rules import library_rule_for, register_reverse
from gradflow.core.errors import NoRuleError


def _node(site: OpSite):
    return site.members()[0]


def _rule(site: OpSite):
    node = _node(site)
    rule = library_rule_for(node)
    if rule is None:
        raise NoRuleError.build(
            "library", f"{type(node).__name__} '{node}'", f"state '{site.state.label}'",
            "run expand_library_nodes first (it expands nodes without an op-level rule)",
        )
    return rule


@register_reverse("library")
class LibraryReverse:
    """Dispatch to the `LIBRARY_RULES` entry of the node's class."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        return _rule(site).needs(site, ctx)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        _rule(site).reverse(site, ctx)


def load() -> None:
    """Import the node-family modules (their decorators fill `LIBRARY_RULES`)."""
    from gradflow.autodiff.rules.library import matmul, reduce, transpose  # noqa: F401
