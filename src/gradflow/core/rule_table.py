"""Rule tables: one per decision kind (ONNX lowering, reverse rules, library nodes, control flow, ...).

A rule is a key (node kind / op type / region kind), an applicability predicate, a priority and a pure
function (or an object with the methods its table asks for). `lookup` returns the highest-priority
applicable rule for a key; ties go to the rule that comes later, so `builtin + mine` lets `mine` win a tie.
A table is an immutable value: `with_rule`, `without` and `+` return new tables.

Tables are never filled by side effect. Each table has one registration *verb* (`rule_verb(table)`),
a decorator that only marks the function or class it decorates (a class is instantiated once, and that
instance is the rule); `collect(table, modules)` then builds the built-in table from an explicit list of
modules, in module order and definition order. Passes hold the tables they use as fields, so two equal
passes give equal graphs and a user can swap one rule for one pipeline without touching shared state.
"""

from __future__ import annotations

from types import MappingProxyType, ModuleType
from typing import Any, Callable, Generic, Hashable, Iterable, Iterator, Mapping, Sequence, TypeVar

import attrs

F = TypeVar("F")

#: The attribute a registration verb sets on what it decorates: a tuple of `Rule`s.
MARK = "__gradflow_rules__"


def _always(*_args: Any, **_kwargs: Any) -> bool:
    return True


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Rule(Generic[F]):
    """One entry of a table. `meta` holds table-specific facts (e.g. the opsets an ONNX rule covers)."""

    key: Hashable
    fn: F
    name: str
    priority: int = 0
    applies: Callable[..., bool] = _always
    doc: str = ""
    table: str = ""
    meta: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_mapping, eq=False, hash=False)


@attrs.frozen
class RuleTable(Generic[F]):
    """An immutable, ordered collection of rules for one kind of decision."""

    name: str
    rules: tuple[Rule[F], ...] = ()

    def with_rule(self, rule: Rule[F]) -> "RuleTable[F]":
        return RuleTable(self.name, self.rules + (rule,))

    def without(self, *names: str) -> "RuleTable[F]":
        """The table without the rules of these names (an unknown name is an error, not a no-op)."""
        from gradflow.core.errors import InvalidArgumentError

        unknown = sorted(set(names) - {r.name for r in self.rules})
        if unknown:
            raise InvalidArgumentError(f"table '{self.name}' has no rule named {', '.join(unknown)}",
                                       f"its rules: {', '.join(r.name for r in self.rules)}")
        return RuleTable(self.name, tuple(r for r in self.rules if r.name not in names))

    def __add__(self, other: "RuleTable[F] | Rule[F] | Iterable[Rule[F]]") -> "RuleTable[F]":
        if isinstance(other, Rule):
            return self.with_rule(other)
        extra = other.rules if isinstance(other, RuleTable) else tuple(other)
        return RuleTable(self.name, self.rules + tuple(extra))

    def candidates(self, key: Hashable) -> list[Rule[F]]:
        """Rules for `key`, best first (priority, then later position)."""
        indexed = [(r.priority, i, r) for i, r in enumerate(self.rules) if r.key == key]
        return [r for _, _, r in sorted(indexed, key=lambda t: (-t[0], -t[1]))]

    def lookup(self, key: Hashable, *args: Any, **kwargs: Any) -> Rule[F] | None:
        for rule in self.candidates(key):
            if rule.applies(*args, **kwargs):
                return rule
        return None

    def keys(self) -> list[Hashable]:
        return list(dict.fromkeys(r.key for r in self.rules))

    def named(self, name: str) -> Rule[F]:
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(name)

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[Rule[F]]:
        return iter(self.rules)


def rule_verb(table: str) -> Callable[..., Callable[[Any], Any]]:
    """The registration verb of `table`: `@verb(*keys, priority=0, applies=..., name=..., **meta)`.

    It marks the decorated function, or a class (whose one instance, made here, is the rule), as a rule of
    `table` for each key, and returns it unchanged otherwise. Rule names default to the object's name, with
    `[key]` appended when one object serves several keys.
    """

    def verb(*keys: Hashable, priority: int = 0, applies: Callable[..., bool] | None = None,
             name: str | None = None, **meta: Any) -> Callable[[Any], Any]:
        if not keys:
            raise TypeError(f"a rule of table '{table}' needs at least one key")

        def deco(obj: Any) -> Any:
            fn = obj() if isinstance(obj, type) else obj
            stem = name if name else getattr(obj, "__name__", type(obj).__name__)
            doc = (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            new = tuple(
                Rule(key, fn, stem if len(keys) == 1 else f"{stem}[{key}]", priority, applies or _always, doc,
                     table, meta)
                for key in keys
            )
            own = vars(obj).get(MARK, ()) if hasattr(obj, "__dict__") else ()
            setattr(obj, MARK, own + new)
            return obj

        return deco

    return verb


def marked_rules(obj: Any, table: str) -> tuple[Rule, ...]:
    """The rules of `table` that a verb marked on `obj` (its own mark, not one inherited by a subclass)."""
    try:
        own = vars(obj).get(MARK, ())
    except TypeError:  # no __dict__
        return ()
    return tuple(r for r in own if isinstance(r, Rule) and r.table == table)


def collect(table: str, modules: Sequence[ModuleType]) -> RuleTable:
    """Build table `table` from the rules marked in `modules` (module order, then definition order).

    An object imported into several of the modules counts once."""
    rules: list[Rule] = []
    seen: set[int] = set()
    for module in modules:
        for value in list(vars(module).values()):
            for rule in marked_rules(value, table):
                if id(rule) not in seen:
                    seen.add(id(rule))
                    rules.append(rule)
    return RuleTable(table, tuple(rules))
