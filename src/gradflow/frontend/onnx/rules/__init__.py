"""The built-in lowering rules: `MODULES` is the one list the built-in table is collected from, and
`default_table()` collects it here, where the rule modules are known (`table.py`, which they import,
cannot import them back)."""

from __future__ import annotations

import functools

from gradflow.core.rule_table import RuleTable, collect
from gradflow.frontend.onnx.rules import elementwise, linalg, nn, recurrent, reduce, resize, sequence, tensor
from gradflow.frontend.onnx.table import TABLE

#: Modules whose `@onnx_rule` functions form the built-in lowering table, in this order.
MODULES = (elementwise, linalg, nn, recurrent, reduce, resize, sequence, tensor)


@functools.cache
def default_table() -> RuleTable:
    """The built-in lowering rules, collected from `MODULES` (one value per process)."""
    return collect(TABLE, MODULES)
