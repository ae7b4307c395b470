"""The results as Markdown: the per-kernel table, the summary against the performance targets, the
headline kernels, failures and warnings.

Ratios `gf/peer` are gradflow's forward+backward time over the peer's forward+backward time: below 1,
gradflow is faster. Geometric means are over the kernels where both sides have a time; kernels gradflow
cannot differentiate are listed with their error and left out of every mean and count.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable

PEERS = (("torch", "eager torch"), ("torch_compile", "torch.compile"), ("jax", "JAX jit"))
SIDES = (("gradflow", "gradflow"),) + PEERS
STAR = "★"


def _t(rec: dict, side: str, part: str) -> float | None:
    """The median time of one side's forward or forward+backward, on the record's clock ("cpu" or "wall")."""
    s = rec.get("times", {}).get(f"{side}_{part}")
    return None if s is None else s[rec.get("clock", "cpu")]["median"]


def fwd(rec, side):
    return _t(rec, side, "fwd")


def both(rec, side):
    return _t(rec, side, "fwdbwd")


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def geomean(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _ms(x: float | None) -> str:
    if x is None:
        return "n/a"
    ms = x * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _r(x: float | None, bold_below: float | None = None) -> str:
    if x is None:
        return "n/a"
    text = f"{x:.2f}" if x < 100 else f"{x:.0f}"
    return f"**{text}**" if bold_below is not None and x < bold_below else text


def _size(rec: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in rec["symbols"].items()) or "fixed"


def gradflow_ok(rec: dict) -> bool:
    return both(rec, "gradflow") is not None and fwd(rec, "gradflow") is not None


def is_main(rec: dict) -> bool:
    return rec["role"] in ("main", "both")


def is_headline(rec: dict) -> bool:
    return rec["role"] in ("headline", "both")


def table(records: list[dict]) -> str:
    head = ["kernel", "size"]
    for side, label in SIDES:
        head += [f"{label} fwd ms", f"{label} f+b ms", f"{label} f+b/fwd"]
    head += [f"gf/{label}" for _, label in PEERS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for rec in records:
        mark = f" {STAR}" if is_headline(rec) else ""
        row = [f"{rec['kernel']}{mark}", _size(rec)]
        for side, _ in SIDES:
            row += [_ms(fwd(rec, side)), _ms(both(rec, side)), _r(ratio(both(rec, side), fwd(rec, side)))]
        row += [_r(ratio(both(rec, "gradflow"), both(rec, p)), bold_below=1.0) for p, _ in PEERS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def summary(records: list[dict]) -> str:
    main = [r for r in records if is_main(r)]
    ok = [r for r in main if gradflow_ok(r)]
    excluded = [r for r in main if not gradflow_ok(r)]
    out = [f"- kernels: {len(main)} (loop corpus {sum(r['kernel'].startswith('lp_') for r in main)}, NPBench "
           f"{sum(r['kernel'].startswith('nb_') for r in main)}, MLP {sum(r['kernel'] == 'mlp' for r in main)}); "
           f"timed for gradflow: {len(ok)}; excluded (gradflow fails or is wrong): {len(excluded)}"
           + (f" ({', '.join(r['kernel'] for r in excluded)})" if excluded else "")]
    slow_fwd = [r["kernel"] for r in ok if fwd(r, "gradflow") < 1e-3]
    if slow_fwd:
        out.append(f"- gradflow forward below 1 ms at the benchmark size: {', '.join(slow_fwd)} "
                   "(rerun `--calibrate` to grow them)")
    ratios = [ratio(both(r, "gradflow"), fwd(r, "gradflow")) for r in ok]
    if ratios:
        worst = max(zip(ratios, (r["kernel"] for r in ok)))
        out.append(f"- gradflow fwd+bwd / fwd: median {statistics.median(ratios):.2f} (target <= 3), max "
                   f"{worst[0]:.2f} ({worst[1]}; target <= 6 on every kernel), over 6 on "
                   f"{sum(x > 6 for x in ratios)} of {len(ratios)}")
    for peer, label in PEERS:
        pairs = [(ratio(both(r, "gradflow"), both(r, peer)), ratio(fwd(r, "gradflow"), fwd(r, peer)), r["kernel"])
                 for r in ok if both(r, peer) is not None]
        if not pairs:
            out.append(f"- vs {label}: no kernel timed")
            continue
        wins = [k for x, _, k in pairs if x < 1.0]
        losses = sorted(((x, k) for x, _, k in pairs if x >= 1.0), reverse=True)
        out.append(f"- vs {label} ({len(pairs)} kernels): geometric mean of gradflow / {label} fwd+bwd time "
                   f"{geomean(x for x, _, _ in pairs):.3g} (forward alone {geomean(y for _, y, _ in pairs):.3g}); "
                   f"gradflow faster on {len(wins)} of {len(pairs)} ({100 * len(wins) / len(pairs):.0f}%)"
                   + (f"; slower on: {', '.join(f'{k} ({x:.2f})' for x, k in losses)}" if losses else ""))
    return "\n".join(out) + "\n"


def targets(records: list[dict]) -> str:
    """The issue's acceptance criteria, each with the measured value and whether it holds."""
    main = [r for r in records if is_main(r)]
    ok = [r for r in main if gradflow_ok(r)]
    rows = []

    def add(what: str, measured: str, holds: bool | None) -> None:
        rows.append(f"| {what} | {measured} | {'yes' if holds else 'no' if holds is not None else 'n/a'} |")

    ratios = [ratio(both(r, "gradflow"), fwd(r, "gradflow")) for r in ok]
    if ratios:
        med, mx = statistics.median(ratios), max(ratios)
        add("fwd+bwd / fwd <= 3 on the median kernel", f"{med:.2f}", med <= 3)
        add("fwd+bwd / fwd <= 6 on every kernel", f"max {mx:.2f}", mx <= 6)
    jax = [ratio(both(r, "gradflow"), both(r, "jax")) for r in ok if both(r, "jax") is not None]
    if jax:
        g = geomean(jax)
        add("faster than JAX jit on the geometric mean", f"{g:.3g}", g < 1)
        share = sum(x < 1 for x in jax) / len(jax)
        add("faster than JAX jit on at least 80% of kernels", f"{100 * share:.0f}% of {len(jax)}", share >= 0.8)
    eager = [ratio(both(r, "gradflow"), both(r, "torch")) for r in ok if both(r, "torch") is not None]
    if eager:
        add("faster than eager torch on every kernel", f"{sum(x < 1 for x in eager)} of {len(eager)}",
            all(x < 1 for x in eager))
    add(f"all {len(main)} kernels differentiated and timed", f"{len(ok)} of {len(main)}", len(ok) == len(main))
    for rec in records:
        if not is_headline(rec):
            continue
        g, j = both(rec, "gradflow"), both(rec, "jax")
        x = ratio(g, j)
        add(f"{STAR} {rec['kernel']} ({_size(rec)}) at least as fast as JAX", _r(x), None if x is None else x <= 1)
        if rec["kernel"] == "lp_triangular":
            y = ratio(g, fwd(rec, "gradflow"))
            add(f"{STAR} lp_triangular ({_size(rec)}) fwd+bwd <= 10x its forward", _r(y), None if y is None else y <= 10)
    return "| target | measured | holds |\n|---|---:|---|\n" + "\n".join(rows) + "\n"


def problems(records: list[dict]) -> str:
    out = []
    for rec in records:
        for side, msg in rec.get("errors", {}).items():
            out.append(f"- {rec['key']}: {side}: {msg}")
        for msg in rec.get("warnings", []):
            out.append(f"- {rec['key']}: warning: {msg}")
    return "\n".join(out) + "\n" if out else "none\n"


def checks(records: list[dict]) -> str:
    """Worst relative error of each side against eager torch at the benchmark size (JAX also at test size)."""
    cols = ("gradflow_fwd", "gradflow_fwdbwd", "jax_test_size", "jax_fwdbwd", "torch_compile_fwdbwd")
    lines = ["| kernel | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for rec in records:
        cells = []
        for c in cols:
            v = rec.get("checks", {}).get(c)
            cells.append("-" if v is None else f"{v[0]:.1e}")
        lines.append(f"| {rec['key']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
