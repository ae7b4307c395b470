"""Op-level reverse rules for DaCe library nodes, one module per node family.

`LibraryReverse` is the reverse rule for operations of kind "library": it looks the node's class name up
in the context's `library` table and delegates to that rule. A node with an applicable library rule is
kept whole by `expand_library_nodes` (the same table decides), so the backward of e.g. a matrix product is
made of matrix products (BLAS calls once compiled, see `gradflow.runtime.blas`).

Covered and uncovered nodes: `docs/library_nodes.md`.
"""

from __future__ import annotations

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.protocols import library_rule_for, reverse_rule
from gradflow.core.errors import NoRuleError


def _rule(site: OpSite, ctx: ReverseContext):
    node = site.members()[0]
    rule = library_rule_for(ctx.tables.library, node)
    if rule is None:
        raise NoRuleError.build(
            "library", f"{type(node).__name__} '{node}'", f"state '{site.state.label}'",
            "run expand_library_nodes with the same library table first (it expands nodes without a rule)",
        )
    entry = ctx.tables.library.lookup(type(node).__name__, node)
    assert entry is not None  # the same lookup found `rule` just above
    ctx.note_rule(entry.name)
    return rule


@reverse_rule("library")
class LibraryReverse:
    """Dispatch to the `library` table's rule for the node's class."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        return _rule(site, ctx).needs(site, ctx)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        _rule(site, ctx).reverse(site, ctx)
