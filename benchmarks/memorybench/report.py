"""The memory benchmark's tables: a summary per kernel, then one table per kernel with a row per policy."""

from __future__ import annotations

from benchmarks.memorybench import policies

#: a budget's median time above RECOMPUTE_ALL's by more than this fraction counts as worse (timing noise on a
#: shared machine is a few percent between interleaved peers)
SLOWER = 0.05


def size(n) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def median(row: dict, clock: str) -> float | None:
    t = row.get("time", {}).get(clock)
    return t["median"] if t else None


def ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3g}"


def budget_rows(rec: dict) -> list[tuple[str, dict]]:
    return [(p.name, rec["rows"].get(p.name, {})) for p in policies.POLICIES if p.limit is not None]


def within(row: dict) -> str:
    if "rejected" in row:
        return f"rejected: least {size(row['rejected']['minimum'])}"
    if "respected" not in row:
        return "-"
    return "yes" if row["respected"] else f"**NO** ({size(row['forwarded'])} > {size(row['limit'])})"


def _fits_baseline(rec: dict, row: dict) -> bool:
    """Whether RECOMPUTE_ALL's own plan fits the budget of `row` (else the budget's plan, the MILP's or a
    checkpointed one, trades memory for time: not comparable with RECOMPUTE_ALL)."""
    kept = rec["rows"].get(policies.BASELINE, {}).get("forwarded")
    return kept is None or row.get("limit") is None or row["limit"] >= kept


def slower_than_baseline(rec: dict, clock: str) -> list[tuple[str, float]]:
    """(policy, time ratio) of every budget plan slower than RECOMPUTE_ALL by more than `SLOWER`, among the
    budgets RECOMPUTE_ALL's plan fits."""
    return [(n, x) for n, x in _ratios(rec, clock, below=False) if x > 1 + SLOWER]


def below_baseline(rec: dict, clock: str) -> list[tuple[str, float]]:
    """(policy, time ratio to RECOMPUTE_ALL) of the budgets below what RECOMPUTE_ALL keeps that were met."""
    return _ratios(rec, clock, below=True)


def _ratios(rec: dict, clock: str, below: bool) -> list[tuple[str, float]]:
    base = median(rec["rows"].get(policies.BASELINE, {}), clock)
    if base is None:
        return []
    found = []
    for name, row in budget_rows(rec):
        t = median(row, clock)
        if t is not None and _fits_baseline(rec, row) != below:
            found.append((name, t / base))
    return found


def problems(rec: dict) -> list[str]:
    out = [f"{k}: {v}" for k, v in rec.get("errors", {}).items()]
    for name, row in rec.get("rows", {}).items():
        if "error" in row:
            out.append(f"{name}: {row['error']}")
        if row.get("respected") is False:
            out.append(f"{name}: forwards {row['forwarded']} bytes, over its budget of {row['limit']}")
        if "error" in row.get("rss", {}):
            out.append(f"{name}: peak RSS not measured: {row['rss']['error']}")
    if rec.get("stage") != "done":
        out.append(f"unfinished (stopped during: {rec.get('stage')})")
    return out


def summary(records: list[dict], clock: str) -> str:
    lines = ["| kernel | sizes | store_all fwd | recompute_all fwd | budgets within / rejected / over | "
             "time no worse than recompute_all at any budget it fits | gradients = store_all |",
             "|---|---|---:|---:|:-:|---|:-:|"]
    for rec in records:
        rows = rec.get("rows", {})
        b = budget_rows(rec)
        ok = sum(r.get("respected") is True for _, r in b)
        rej = sum("rejected" in r for _, r in b)
        over = sum(r.get("respected") is False for _, r in b)
        built = [r for _, r in b if median(r, clock) is not None and _fits_baseline(rec, r)]
        slow = slower_than_baseline(rec, clock)
        if median(rows.get(policies.BASELINE, {}), clock) is None or not built:
            verdict = "n/a"
        elif slow:
            verdict = "**no**: " + ", ".join(f"{n} x{x:.2f}" for n, x in slow)
        else:
            verdict = "yes"
        checked = [r for r in rows.values() if "vs_store_all" in r]
        mismatch = [n for n, r in rows.items() if "MISMATCH" in r.get("error", "")]
        same = "**MISMATCH**: " + ", ".join(mismatch) if mismatch else (f"yes ({len(checked)})" if checked else "n/a")
        sizes = ", ".join(f"{k}={v}" for k, v in rec.get("symbols", {}).items())
        lines.append(f"| {rec['key']} | {sizes} | {size(rows.get(policies.REFERENCE, {}).get('forwarded'))} | "
                     f"{size(rows.get(policies.BASELINE, {}).get('forwarded'))} | {ok} / {rej} / {over} | {verdict} "
                     f"| {same} |")
    return "\n".join(lines) + "\n"


def kernel_table(rec: dict, clock: str) -> str:
    base = median(rec["rows"].get(policies.BASELINE, {}), clock)
    fwd_rss = rec.get("forward_rss", {}).get("total")
    head = (f"### {rec['key']} ({', '.join(f'{k}={v}' for k, v in rec.get('symbols', {}).items())})\n\n"
            f"Forward alone: {size(rec.get('forward_allocated', {}).get('total'))} of temporaries, peak RSS "
            f"+{size(fwd_rss)}." + (" Inputs restored before every timed call." if rec.get("refill") else "")
            + "\n\n| policy | budget | forwarded | within | recomputed | rerun work | allocated (tape) | peak RSS "
            "+ | f+b ms | / recompute_all |\n|---|---:|---:|---|---|---:|---:|---:|---:|---:|\n")
    lines = []
    for p in policies.POLICIES:
        row = rec["rows"].get(p.name)
        if row is None:
            continue
        t = median(row, clock)
        alloc = row.get("allocated", {})
        note = f" (= {row['same_program_as']})" if "same_program_as" in row else ""
        if "error" in row:
            note += f" error: {row['error'][:120]}"
        rec_names = row.get("recomputed")
        lines.append(
            f"| {p.name}{note} | {size(row.get('limit'))} | {size(row.get('forwarded'))} | {within(row)} | "
            f"{len(rec_names) if rec_names is not None else '-'} | {row.get('rerun_work', '-')} | "
            f"{size(alloc.get('total'))} ({size(alloc.get('by_category', {}).get('tape'))}) | "
            f"{size(row.get('rss', {}).get('total'))} | {ms(t)} | "
            f"{'-' if t is None or base is None else f'{t / base:.2f}'} |")
    return head + "\n".join(lines) + "\n"
