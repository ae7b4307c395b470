"""The immutable graph value that every pass consumes and produces.

A `Graph` owns a private `dace.SDFG`. Nobody outside gets that object to mutate: `Graph.of` copies what it is
given, `editable()` hands out a fresh deep copy, and `Graph.adopt` takes ownership of an SDFG its caller
built and promises not to touch again. The canonical fingerprint is a SHA-256 over the SDFG's JSON with the
volatile fields removed (memlet `guid`s are renewed by `copy.deepcopy`), so equal programs hash equal,
"unchanged" is checkable, and builds can be cached by content.
"""

from __future__ import annotations

import copy
import hashlib
import json
from types import MappingProxyType
from typing import Any, Mapping

import attrs
import dace

from gradflow.core.errors import InvalidArgumentError

#: JSON keys that vary between equal programs and are left out of the fingerprint.
VOLATILE_KEYS = frozenset({"guid"})


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _canonical(v) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    return obj


def fingerprint(sdfg: dace.SDFG) -> str:
    """Canonical content hash of an SDFG (stable under `copy.deepcopy`)."""
    text = json.dumps(_canonical(sdfg.to_json()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def as_sdfg(program: Any) -> dace.SDFG:
    """The SDFG of a `dace.SDFG` (itself) or of a `@dace.program` (parsed, simplified)."""
    if isinstance(program, dace.SDFG):
        return program
    if isinstance(program, Graph):
        return program.sdfg
    to_sdfg = getattr(program, "to_sdfg", None)
    if callable(to_sdfg):
        return to_sdfg(simplify=True)
    raise InvalidArgumentError(
        f"expected a dace.SDFG or a @dace.program, got {type(program).__name__}",
        "wrap a Python function with @dace.program, or build a dace.SDFG",
    )


@attrs.frozen(eq=False)
class Graph:
    """An SDFG treated as a value, plus frozen metadata that passes attach (e.g. the AD interface).

    `sdfg` is borrowed for reading only; passes that edit call `editable()` and wrap the result with
    `Graph.adopt`. The purity tests compare fingerprints before and after every registered pass.
    """

    sdfg: dace.SDFG
    meta: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)))
    _fingerprint: list = attrs.field(factory=list, init=False, repr=False)  # memo cell

    @classmethod
    def of(cls, program: Any) -> "Graph":
        """Wrap a copy of a `dace.SDFG` or `@dace.program`; the argument is never modified afterwards."""
        if isinstance(program, Graph):
            return program
        sdfg = as_sdfg(program)
        if sdfg is program:
            sdfg = copy.deepcopy(sdfg)
        return cls(sdfg)

    @classmethod
    def adopt(cls, sdfg: dace.SDFG, meta: Mapping[str, Any] | None = None) -> "Graph":
        """Take ownership of an SDFG the caller built (no copy); the caller must not touch it again."""
        return cls(sdfg, meta or {})

    @property
    def fingerprint(self) -> str:
        if not self._fingerprint:
            self._fingerprint.append(fingerprint(self.sdfg))
        return self._fingerprint[0]

    def changed_since_fingerprint(self) -> bool:
        """True when someone mutated the borrowed SDFG after its fingerprint was taken."""
        return bool(self._fingerprint) and fingerprint(self.sdfg) != self._fingerprint[0]

    def editable(self) -> dace.SDFG:
        """A private deep copy for a pass to edit."""
        return copy.deepcopy(self.sdfg)

    def to_sdfg(self) -> dace.SDFG:
        """A copy to hand to users: what they do with it cannot reach this value."""
        return copy.deepcopy(self.sdfg)

    def with_meta(self, **updates: Any) -> "Graph":
        """The same SDFG with more metadata (the SDFG is shared: both values are immutable)."""
        new = Graph(self.sdfg, {**self.meta, **updates})
        new._fingerprint.extend(self._fingerprint)
        return new
