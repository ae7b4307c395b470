"""What one tangent build is asked (`TangentSpec`), what it answers (`TangentInterface`), the tables it uses
(`TangentTables`) and the context its rules talk to (`TangentContext`). They sit below the rules and the
engine: a rule that makes a sub-program's tangent (the nested rule) calls the `differentiate` function it
is handed here, never the engine."""

from __future__ import annotations

from typing import Callable, Mapping

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.autodiff.tangent.mirror import StateMirror
from gradflow.core.rule_table import RuleTable, rule_verb

TANGENT, TANGENT_LIBRARY = "tangent", "tangent_library"
#: `@tangent_rule(kind, ...)` on a class with `tangent(site, ctx)`: the tangent of operations of that kind
#: ("map", "tasklet", "copy", "library", "nested").
tangent_rule = rule_verb(TANGENT)
#: `@tangent_library_rule(node_class_name, ...)` on a class with `tangent(site, node, ctx)`: a library node
#: with such a rule stays whole (the others are expanded into maps first).
tangent_library_rule = rule_verb(TANGENT_LIBRARY)


@attrs.frozen
class TangentSpec:
    """`wrt`: arrays whose tangents the caller gives; `of`: arrays whose tangents the program returns.
    Their tangent arguments are named `prefix + name`. `outermost`: False for a nested SDFG's program,
    whose other arguments' tangents belong to the outer program."""

    wrt: tuple[str, ...]
    of: tuple[str, ...]
    prefix: str = "tan_"
    outermost: bool = True


@attrs.frozen
class TangentInterface:
    spec: TangentSpec
    tangents: Mapping[str, str]  # every array with a tangent -> its tangent array
    rules_used: tuple[str, ...] = ()

    def arguments(self) -> dict[str, str]:
        """The tangent arguments: `wrt` and `of` arrays -> the names of their tangents."""
        return {a: self.tangents[a] for a in (*self.spec.wrt, *self.spec.of) if a in self.tangents}


@attrs.frozen
class TangentTables:
    tangent: RuleTable
    library: RuleTable


#: the tangent program of a nested SDFG: (its SDFG, spec) -> (the new SDFG, its interface)
Differentiate = Callable[[dace.SDFG, TangentSpec], tuple[dace.SDFG, TangentInterface]]


@attrs.define
class TangentContext:
    sdfg: dace.SDFG
    tangents: Mapping[str, str]
    tables: TangentTables
    differentiate: Differentiate
    rules_used: dict[str, None] = attrs.field(factory=dict)
    _mirrors: dict[int, StateMirror] = attrs.field(factory=dict)

    def note_rule(self, name: str) -> None:
        self.rules_used.setdefault(name, None)

    def mirror(self, state: SDFGState, connectors: Mapping[tuple[int, str], str] | None = None) -> StateMirror:
        """The tangent dataflow of `state` (one per state, so access nodes are mirrored once)."""
        if id(state) not in self._mirrors:
            self._mirrors[id(state)] = StateMirror(state, self.tangents)
        mirror = self._mirrors[id(state)]
        mirror.connectors.update(connectors or {})
        return mirror

    def constants(self, state: SDFGState, node: nd.Node) -> set[str]:
        """Names tasklet code may read besides its connectors: symbols and the parameters of the maps around
        `node`."""
        names = set(map(str, state.free_symbols)) | set(self.sdfg.symbols) | set(self.sdfg.constants)
        scope = state.scope_dict()
        entry = scope[node]
        while entry is not None:
            names |= set(entry.map.params)
            entry = scope[entry]
        return names
