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

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from gradflow.autodiff.structure import Seq
from gradflow.core.rule_table import RuleTable, rule_verb

if TYPE_CHECKING:  # annotations only: the engine sits above the rules
    import dace
    from dace.sdfg.state import LoopRegion

    from gradflow.autodiff.context import OpSite, ReverseContext
    from gradflow.autodiff.spec import ADSpec, Differentiate
    from gradflow.autodiff.tape import Tape

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


class ControlContext(Protocol):
    """What a control rule may use of the build while it prices, records and reverses a region (the
    engine's `Reversal` is one; a rule sees nothing else of it): the program, the tape, fresh names,
    capacities of per-iteration storage, and what the rest of the build knows about symbols and sites."""

    @property
    def sdfg(self) -> dace.SDFG: ...

    @property
    def spec(self) -> ADSpec: ...

    @property
    def tape(self) -> Tape: ...

    @property
    def used_symbols(self) -> frozenset[str]:
        """Symbols the backward sweep reads."""

    @property
    def assigned(self) -> frozenset[str]:
        """Symbols assigned on interstate edges of the program."""

    @property
    def sites(self) -> Sequence[OpSite]:
        """The program's operations, in forward order."""

    @property
    def differentiate(self) -> Differentiate:
        """Reverse mode of a sub-program (with the build's tables)."""

    def fresh(self, stem: str) -> str: ...

    def capacity(self, loops: Sequence[LoopRegion], register: bool = True): ...

    def priced_capacity(self, loops: Sequence[LoopRegion]): ...

    def user_bound(self, loop: LoopRegion) -> int | None: ...

    def overflow_number(self, loop: LoopRegion) -> int: ...

    def plan_trips(self, loop: LoopRegion, trips: int) -> int:
        """Register `loop` as run for `trips` trips only (a checkpoint schedule); its `overflow_number`."""

    def keep_final(self, symbol: str, dtype) -> None: ...

    def note_store(self, array: str, what: str) -> None:
        """Record that tape array `array` holds `what` (shown in the build's report of stored values)."""


class ControlRule(Protocol):
    """A `control` table rule (the methods are described in `autodiff/control.py`'s module docstring).
    `tape_free`: the operations inside the region record nothing on the tape (the rule's own record,
    e.g. a checkpointed loop's snapshots, stands in for their stacks)."""

    tape_free: bool

    def restores(self, item) -> frozenset[str]: ...

    def tape_bytes(self, item, rev: ControlContext, loops: tuple): ...

    def record(self, item, rev: ControlContext, loops: tuple) -> object: ...

    def reverse(self, item, recorded: object, rev: ControlContext, ctx: ReverseContext, body: Body) -> None: ...


def library_rule_for(table: RuleTable, node):
    """The op-level rule `table` has for library node `node`, or None (then the node is expanded)."""
    rule = table.lookup(type(node).__name__, node)
    return None if rule is None else rule.fn
