"""The `tangent` pass and the forward-mode pipeline (NORMALIZE with the tangent library table, then
`tangent`), and the `Differentiate` of nested SDFGs (normalize, then the engine, with the same tables)."""

from __future__ import annotations

from typing import ClassVar

import attrs
import dace
from returns.result import Failure, Success

from gradflow.analysis.activity import is_float
from gradflow.analysis.writes import written
from gradflow.autodiff.normalize import normalize_pipeline
from gradflow.autodiff.passes import default_wrt, optional_names
from gradflow.autodiff.tangent.context import TANGENT, TANGENT_LIBRARY, TangentInterface, TangentSpec, TangentTables
from gradflow.autodiff.tangent.engine import tangent_program
from gradflow.autodiff.tangent.tables import default_tangent_library_rules, default_tangent_rules
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, Pipeline, register_pass, table_field, unwrap_or_raise
from gradflow.core.rule_table import RuleTable
from gradflow.core.validation import check_graph


def written_arguments(sdfg: dace.SDFG) -> tuple[str, ...]:
    """The float arguments a program writes (forward mode's default `of`)."""
    return tuple(sorted(n for n in written(sdfg) if not sdfg.arrays[n].transient and is_float(sdfg.arrays[n])))


@attrs.frozen
class TangentSubprograms:
    """Forward mode of a nested SDFG: normalized privately with the library table, then made a tangent
    program with the same tables (and, recursively, this function for its own nested SDFGs)."""

    tables: TangentTables

    def __call__(self, source: dace.SDFG, spec: TangentSpec) -> tuple[dace.SDFG, TangentInterface]:
        inner = unwrap_or_raise(normalize_pipeline(self.tables.library)(Graph.adopt(source))).sdfg
        return inner, tangent_program(inner, spec, self.tables, self)


@register_pass
@attrs.frozen
class Tangent(Pass):
    """Make the program compute, next to its values, the tangents of `of` (`prefix + name` arguments; default:
    the float arguments it writes) along the tangents of `wrt` (given as `prefix + name` arguments; default:
    the other float arguments). Its tables are fields, as `reverse`'s."""

    wrt: tuple[str, ...] | None = attrs.field(default=None, converter=optional_names)
    of: tuple[str, ...] | None = attrs.field(default=None, converter=optional_names)
    prefix: str = "tan_"
    tangent_rules: RuleTable = table_field(TANGENT, default_tangent_rules)
    library_rules: RuleTable = table_field(TANGENT_LIBRARY, default_tangent_library_rules)
    name: ClassVar[str] = "tangent"
    requires: ClassVar[tuple[str, ...]] = ("split_operations",)

    @property
    def tables(self) -> TangentTables:
        return TangentTables(self.tangent_rules, self.library_rules)

    def run(self, graph: Graph) -> PassResult:
        sdfg = graph.editable()
        of = self.of if self.of is not None else written_arguments(sdfg)
        wrt = self.wrt if self.wrt is not None else default_wrt(sdfg, of)
        spec = TangentSpec(tuple(wrt), tuple(of), self.prefix)
        interface = tangent_program(sdfg, spec, self.tables, TangentSubprograms(self.tables))  # see Pass.__call__
        error = check_graph(sdfg, self.name, thorough=True)
        if error is not None:
            return Failure(error)
        return Success(Graph.adopt(sdfg, {**graph.meta, "tangent": interface}))


def jvp_pipeline(tangent: Tangent) -> Pipeline:
    """`set_aside_internal_names` (for a program gradflow made), NORMALIZE (keeping whole the library nodes
    `tangent` has rules for), then `tangent`."""
    from gradflow.transforms.internal_names import SetAsideInternalNames

    normalize = normalize_pipeline(tangent.library_rules)
    return Pipeline((SetAsideInternalNames(),) + normalize.steps, normalize.hook, normalize.assumes) + tangent
