"""Reverse mode of whole programs and of their sub-programs, with one set of tables.

The engine never imports normalization or itself: a rule that differentiates a sub-program (the nested
rule's vjp of a nested SDFG, a checkpointed step asking whether its vjp reads forward state) calls the
`Differentiate` function it is handed through its context, which is a `Subprograms` made here, above
both the engine and `normalize.py`.
"""

from __future__ import annotations

import attrs
import dace

from gradflow.autodiff.checkpoint_plan import plan_checkpoints
from gradflow.autodiff.engine import build_reverse
from gradflow.autodiff.normalize import normalize_pipeline
from gradflow.autodiff.spec import ADInterface, ADSpec, ADTables
from gradflow.core.graph import Graph
from gradflow.core.passes import unwrap_or_raise


@attrs.frozen
class Subprograms:
    """A `Differentiate`: normalize a private sub-program with the library table, then reverse it with
    the same tables (and, recursively, the same function for its own sub-programs)."""

    tables: ADTables

    def __call__(self, source: dace.SDFG, spec: ADSpec) -> tuple[dace.SDFG, ADInterface]:
        inner = unwrap_or_raise(normalize_pipeline(self.tables.library)(Graph.adopt(source))).sdfg
        return inner, build_reverse(inner, spec, self.tables, self)  # `inner` was built here: no one else holds it


def reverse_program(sdfg: dace.SDFG, spec: ADSpec, tables: ADTables) -> ADInterface:
    """Reverse mode of a whole (normalized) program, in place: checkpoint planning, then the engine."""
    differentiate = Subprograms(tables)
    return build_reverse(sdfg, plan_checkpoints(sdfg, spec, tables, differentiate), tables, differentiate)
