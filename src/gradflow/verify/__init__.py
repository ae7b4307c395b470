"""Verification as part of the product: every rule of every table, checked against independent references.

`run(tables, quick=..., jobs=...)` runs the generated checks and returns one `Row` per rule:
- `elementwise`: each entry of `rules/elementwise.toml`, against torch.autograd and finite differences;
- `library`: each op-level library rule, two routes (the rule vs differentiating the expansion) and torch;
- `reverse`, `control`: each reverse and control-flow rule, by the gradient checks of the corpus programs
  that use it (dataflow and loop kernels vs torch.autograd; a program reports the rules it used);
- `onnx`: each op type of the lowering table, against ONNX's reference outputs;
- `tangent`: each rule of forward mode's two tables (`tangent`, `tangent_library`), by the tangents of the
  corpus programs and library cases that use it, against `torch.func.jvp`.
A rule no check exercises is reported `untested`, which fails like a wrong result: the tables and their
checks cannot drift apart. The test suite runs the same checks (tests/verify); `gradflow verify` prints
the rows. Checks are independent work items, run in a process pool when `jobs > 1`.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Iterable, Sequence

import attrs
import numpy as np

TABLES = ("elementwise", "library", "reverse", "control", "onnx", "tangent")
PASS, FAIL, UNTESTED = "pass", "FAIL", "untested"


@attrs.frozen
class Item:
    """One unit of checking work: `kind` names the check family, `name` the case, `samples` how often."""

    kind: str  # "elementwise" | "program" | "library" | "onnx"
    name: str
    samples: int = 1


@attrs.frozen
class Result:
    item: Item
    rules: tuple[tuple[str, str], ...]  # (table, rule name) the item verifies
    ok: bool
    worst: float | None
    detail: str = ""
    seconds: float = 0.0


@attrs.frozen
class Row:
    table: str
    rule: str
    status: str
    checks: int
    worst: float | None
    detail: str = ""


def items(tables: Sequence[str] = TABLES, quick: bool = False, rules: Sequence[str] | None = None) -> list[Item]:
    """The work items that verify `tables` (`quick`: one sample and one ONNX case per rule; `rules`: only
    the items that exercise these rules)."""
    from gradflow.verify import elementwise, library, onnx_ops, programs

    wanted = set(rules) if rules else None
    samples = 1 if quick else 3
    out: list[Item] = []
    if "elementwise" in tables:
        out += [Item("elementwise", n, samples) for n in elementwise.names() if wanted is None or n in wanted]
    if "library" in tables or "reverse" in tables:
        out += [Item("library", n, samples) for n in library.names()
                if wanted is None or wanted & set(library.rules_used(n))]
    if "reverse" in tables or "control" in tables:
        out += [Item("program", c.name, samples) for c in programs.cases()
                if wanted is None or wanted & set(programs.rules_used(c.name))]
    if "tangent" in tables:
        from gradflow.verify import tangents

        out += [Item("tangent", c.name, samples) for c in programs.cases() if c.name not in tangents.REFUSED
                and (wanted is None or wanted & set(tangents.rules_used(c)))]
        out += [Item("tangent_library", n, samples) for n in library.names()
                if wanted is None or wanted & set(tangents.library_rules_used(n))]
    if "onnx" in tables:
        limit = 1 if quick else 3
        out += [Item("onnx", n) for op in onnx_ops.ops() if wanted is None or op in wanted
                for n in onnx_ops.selection(op, limit)]
    return out


def run_item(item: Item) -> Result:
    """Run one item; any failure becomes a failed `Result` with its reason (never raised)."""
    start = time.perf_counter()
    rules: tuple[tuple[str, str], ...] = ()
    try:
        rules, worst = _run(item)
        return Result(item, rules, True, worst, seconds=time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - a verification report lists every failure with its reason
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        rules = rules or _declared_rules(item)
        return Result(item, rules, False, None, f"{type(exc).__name__}: {text}"[:300],
                      seconds=time.perf_counter() - start)


def _run(item: Item) -> tuple[tuple[tuple[str, str], ...], float]:
    from gradflow.verify import elementwise, library, onnx_ops, programs

    rng = np.random.default_rng(_stable_seed(item.name))
    if item.kind == "elementwise":
        entry = elementwise.elementwise_table()[item.name]
        worst = max(elementwise.check(item.name, *elementwise.random_points(entry, rng)) for _ in range(item.samples))
        return (("elementwise", item.name),), worst
    if item.kind == "library":
        library.kept_whole(item.name)
        worst = max(library.check(item.name, library.sizes_for(item.name, rng), int(rng.integers(2**31)))
                    for _ in range(item.samples))
        return _tagged(library.rules_used(item.name)), worst
    if item.kind == "program":
        worst = max(programs.check(item.name, seed) for seed in range(item.samples))
        return _tagged(programs.rules_used(item.name)), worst
    if item.kind == "onnx":
        return (("onnx", onnx_ops.op_of(item.name)),), onnx_ops.check(item.name)
    if item.kind == "tangent":
        from gradflow.verify import tangents

        case = programs.case_named(item.name)
        worst = max(tangents.check_jvp(case, seed) for seed in range(item.samples))
        return tuple(("tangent", r) for r in tangents.rules_used(case)), worst
    if item.kind == "tangent_library":
        from gradflow.verify import tangents

        worst = max(tangents.check_library_jvp(item.name, library.sizes_for(item.name, rng), int(rng.integers(2**31)))
                    for _ in range(item.samples))
        return tuple(("tangent", r) for r in tangents.library_rules_used(item.name)), worst
    raise ValueError(f"unknown check kind {item.kind!r}")


def _stable_seed(name: str) -> int:
    """A seed from the case name that is the same in every process (str hashes are salted)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def _declared_rules(item: Item) -> tuple[tuple[str, str], ...]:
    """Which rules a failed item was meant to verify, when it failed before it could report them."""
    if item.kind == "elementwise":
        return (("elementwise", item.name),)
    if item.kind == "onnx":
        from gradflow.verify import onnx_ops

        return (("onnx", onnx_ops.op_of(item.name)),)
    return ()


def _tagged(rule_names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(table, rule) pairs for rule names reported by `ADInterface.rules_used`."""
    from gradflow.autodiff.rules import default_control_rules, default_library_rules, default_reverse_rules

    owners = {}
    for table in (default_reverse_rules(), default_library_rules(), default_control_rules()):
        for rule in table:
            owners[rule.name] = table.name
    return tuple((owners[n], n) for n in rule_names if n in owners)


def rule_names(table: str) -> list[str]:
    """The rows a table has: its rules (entries, op types) in table order."""
    from gradflow.autodiff import rules
    from gradflow.verify import elementwise, onnx_ops

    if table == "elementwise":
        return list(elementwise.names())
    if table == "onnx":
        return list(onnx_ops.ops())
    if table == "tangent":
        from gradflow.autodiff.tangent.tables import default_tangent_library_rules, default_tangent_rules

        return [r.name for t in (default_tangent_rules(), default_tangent_library_rules()) for r in t]
    built = {"reverse": rules.default_reverse_rules, "library": rules.default_library_rules,
             "control": rules.default_control_rules}[table]()
    return [r.name for r in built]


def rows(results: Sequence[Result], tables: Sequence[str] = TABLES, rules: Sequence[str] | None = None) -> list[Row]:
    """One row per rule of `tables` (or per rule of `rules` among them): pass when every check that
    exercised it passed (at least one did)."""
    out = []
    for table in tables:
        for rule in rule_names(table):
            if rules and rule not in rules:
                continue
            mine = [r for r in results if (table, rule) in r.rules]
            failed = [r for r in mine if not r.ok]
            worsts = [r.worst for r in mine if r.worst is not None]
            if not mine:
                out.append(Row(table, rule, UNTESTED, 0, None, "no check exercises this rule"))
            else:
                status = FAIL if failed else PASS
                detail = f"{failed[0].item.name}: {failed[0].detail}" if failed else ""
                out.append(Row(table, rule, status, len(mine), max(worsts) if worsts else None, detail))
    return out


def run(tables: Sequence[str] = TABLES, *, quick: bool = False, jobs: int = 1, rules: Sequence[str] | None = None,
        progress: Callable[[int, int, Result], None] | None = None) -> list[Row]:
    """Run the checks of `tables` (only those exercising `rules`, when given) and return their rows."""
    work = items(tables, quick, rules)
    results: list[Result] = []
    if jobs <= 1:
        for k, item in enumerate(work, start=1):
            results.append(run_item(item))
            if progress:
                progress(k, len(work), results[-1])
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(run_item, item) for item in work]
            for k, future in enumerate(as_completed(futures), start=1):
                results.append(future.result())
                if progress:
                    progress(k, len(work), results[-1])
    return rows(results, tables, rules)


def format_rows(table_rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, with a summary line."""
    header = ("table", "rule", "status", "checks", "worst rel err", "detail")
    body = [(r.table, r.rule, r.status, str(r.checks), "-" if r.worst is None else f"{r.worst:.1e}", r.detail)
            for r in table_rows]
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(5)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header[:5], widths)) + "  " + header[5]]
    for row in body:
        lines.append(("  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5]).rstrip())
    passed = sum(r.status == PASS for r in table_rows)
    lines.append(f"{passed} of {len(table_rows)} rules verified"
                 + ("" if passed == len(table_rows) else f"; {len(table_rows) - passed} not"))
    return "\n".join(lines)
