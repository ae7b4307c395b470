"""Rule tables: one per decision kind (ONNX lowering, reverse rules, forwarding policy, ...).

A rule is a key (node kind / op type / function name), an applicability predicate, a priority and a pure
function. `lookup` returns the highest-priority applicable rule for a key; ties go to the rule registered
last, so a user can override a built-in rule by registering one with the same priority. Tables compose
with `+` (the right-hand table's rules win ties), and a table is immutable: `with_rule` returns a new one.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Hashable, Iterable, TypeVar

import attrs

F = TypeVar("F", bound=Callable[..., Any])


def _always(*_args: Any, **_kwargs: Any) -> bool:
    return True


@attrs.frozen
class Rule(Generic[F]):
    key: Hashable
    fn: F
    name: str
    priority: int = 0
    applies: Callable[..., bool] = _always
    doc: str = ""


@attrs.frozen
class RuleTable(Generic[F]):
    """An immutable, ordered collection of rules for one kind of decision."""

    name: str
    rules: tuple[Rule[F], ...] = ()

    def with_rule(self, rule: Rule[F]) -> "RuleTable[F]":
        return RuleTable(self.name, self.rules + (rule,))

    def __add__(self, other: "RuleTable[F]") -> "RuleTable[F]":
        return RuleTable(self.name, self.rules + other.rules)

    def candidates(self, key: Hashable) -> list[Rule[F]]:
        """Rules for `key`, best first (priority, then later registration)."""
        indexed = [(r.priority, i, r) for i, r in enumerate(self.rules) if r.key == key]
        return [r for _, _, r in sorted(indexed, key=lambda t: (-t[0], -t[1]))]

    def lookup(self, key: Hashable, *args: Any, **kwargs: Any) -> Rule[F] | None:
        for rule in self.candidates(key):
            if rule.applies(*args, **kwargs):
                return rule
        return None

    def keys(self) -> list[Hashable]:
        return list(dict.fromkeys(r.key for r in self.rules))

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterable[Rule[F]]:
        return iter(self.rules)


class MutableRuleRegistry(Generic[F]):
    """The process-wide default table for a decision kind, filled by decorators at import time.

    Callers never mutate a table they were given: they take `registry.table` (an immutable snapshot) and
    pass it explicitly; users build variants with `RuleTable.with_rule` / `+`.
    """

    def __init__(self, name: str) -> None:
        self._table: RuleTable[F] = RuleTable(name)

    @property
    def table(self) -> RuleTable[F]:
        return self._table

    def register(
        self,
        key: Hashable,
        *,
        priority: int = 0,
        applies: Callable[..., bool] = _always,
        name: str | None = None,
    ) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            doc = (fn.__doc__ or "").strip().split("\n")[0]
            rule = Rule(key, fn, name or fn.__name__, priority, applies, doc)
            self._table = self._table.with_rule(rule)
            return fn

        return deco
