"""The three rule tables of reverse mode: their keys, registration verbs, and the protocols their rules
implement. Rule modules import their verb from here; the built-in tables are collected above them, in
`autodiff/rules/__init__.py`, so no rule module imports the table it is collected into.

- `reverse` (verb `reverse_rule`), keyed by operation kind ("map", "tasklet", "copy", "library",
  "nested"): a `ReverseRule` says which forward values its reverse reads (`needs`, so the engine can
  store or recompute them) and emits the backward dataflow (`reverse`).
- `library` (verb `library_rule`), keyed by library-node class name: a node with an applicable rule is kept
  whole by `expand_library_nodes` and reversed at op level (the "library" reverse rule delegates to it);
  one without is expanded into maps first.
- `control` (verb `control_rule`), keyed by region kind ("loop", "conditional", "assignment"): a
  `ControlRule` says what the forward sweep records for a region and how the backward sweep reverses it
  (`autodiff/control.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from gradflow.autodiff.structure import Seq
from gradflow.core.rule_table import RuleTable, rule_verb

if TYPE_CHECKING:  # annotations only: the engine sits above the rules
    from gradflow.autodiff.context import OpSite, ReverseContext

REVERSE, LIBRARY, CONTROL = "reverse", "library", "control"

#: `@reverse_rule(kind, ...)` on a class: its instance reverses operations of that kind.
reverse_rule = rule_verb(REVERSE)
#: `@library_rule(node_class_name, ...)` on a class: op-level reverse of that library node.
library_rule = rule_verb(LIBRARY)
#: `@control_rule(region_kind, ...)` on a class: recording and reversal of that kind of region.
control_rule = rule_verb(CONTROL)


class ReverseRule(Protocol):
    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        """Arrays whose forward values (as the operation read them) the reverse code reads."""

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        """Append the backward states of the operation to `ctx`."""


#: What a control rule calls to reverse a child sequence of its region, inside the region it built.
Body = Callable[[Seq], None]


class ControlRule(Protocol):
    """A `control` table rule (the methods are described in `autodiff/control.py`'s module docstring).
    `tape_free`: the operations inside the region record nothing on the tape (the rule's own record,
    e.g. a checkpointed loop's snapshots, stands in for their stacks)."""

    tape_free: bool

    def restores(self, item) -> frozenset[str]: ...

    def tape_bytes(self, item, rev, loops: tuple): ...

    def record(self, item, rev, loops: tuple) -> object: ...

    def reverse(self, item, recorded: object, rev, ctx: ReverseContext, body: Body) -> None: ...


def library_rule_for(table: RuleTable, node):
    """The op-level rule `table` has for library node `node`, or None (then the node is expanded)."""
    rule = table.lookup(type(node).__name__, node)
    return None if rule is None else rule.fn
