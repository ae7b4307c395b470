"""Loading of the declarative tables in `rules/` into frozen, validated records.

A table file is TOML: one top-level table per entry. `load_entries` checks each entry's keys against the
record's declared fields and converts it with the record's `from_toml`; any problem becomes a
`RuleTableError` naming the file and the entry, raised at load time rather than at first use.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Callable, TypeVar

from gradflow.core.errors import GradflowError, RuleTableError

T = TypeVar("T")


def rules_dir() -> Path:
    """The folder holding the declarative tables: `gradflow/rules/`, shipped as package data (the
    repository's top-level `rules/` links to it); `GRADFLOW_RULES` overrides it."""
    env = os.environ.get("GRADFLOW_RULES")
    folder = Path(env) if env else Path(__file__).resolve().parent.parent / "rules"
    if not (folder / "elementwise.toml").is_file():
        raise RuleTableError(f"cannot find the rule tables: {folder / 'elementwise.toml'} does not exist",
                             "set GRADFLOW_RULES to the folder holding elementwise.toml, or reinstall gradflow")
    return folder


def load_entries(
    path: Path,
    required: frozenset[str],
    optional: frozenset[str],
    build: Callable[[str, dict[str, Any]], T],
) -> dict[str, T]:
    """Parse `path` and build one record per entry, validating key names first."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleTableError(f"{path}: cannot read table: {exc}") from None
    records: dict[str, T] = {}
    for name, body in raw.items():
        if not isinstance(body, dict):
            raise RuleTableError.build(str(path), name, "must be a table of fields")
        missing = required - body.keys()
        if missing:
            raise RuleTableError.build(str(path), name, f"missing field(s) {sorted(missing)}")
        unknown = body.keys() - required - optional
        if unknown:
            allowed = sorted(required | optional)
            raise RuleTableError.build(str(path), name, f"unknown field(s) {sorted(unknown)}; allowed: {allowed}")
        try:
            records[name] = build(name, body)
        except RuleTableError:
            raise
        except (GradflowError, ValueError, TypeError, SyntaxError) as exc:
            raise RuleTableError.build(str(path), name, str(exc)) from None
    return records
