#!/usr/bin/env python3
"""Do two versions of gradflow build the same programs? Canonical fingerprints of every benchmark kernel's
forward (`optimized`) and forward+backward (`grad_graph`) SDFG, at this checkout and at a baseline.

    python benchmarks/same_programs.py --baseline /tmp/old [--only nb_gemm,lp_go_fast] [--out FILE]

A change that claims to leave generated programs alone (a refactoring) is checked here exactly: equal
fingerprints mean equal SDFGs (`core/graph.fingerprint`), hence the same generated code and the same
times, which `benchmarks/ab.py` would otherwise have to measure with noise. A kernel whose fingerprints
differ is listed; time it with `ab.py`. Each version runs in its own process with its `src` first on the
path; both build from this checkout's specs (`benchmarks/kernelbench/specs.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(keys: list[str], out: pathlib.Path) -> None:
    """Fingerprints of each kernel's two programs with whichever gradflow is first on the path."""
    import warnings

    warnings.simplefilter("ignore")
    from benchmarks.kernelbench import sides, specs
    from gradflow.core.graph import fingerprint

    found = {}
    for key in keys:
        bench = specs.by_key()[key]
        sdfg = bench.case.to_sdfg()
        try:
            forward = fingerprint(sides.gradflow_forward(sdfg).sdfg)
            both = fingerprint(sides.gradflow_fwdbwd(sdfg, tuple(bench.case.wrt), bench.case.of).sdfg)
            found[key] = {"fwd": forward, "fwdbwd": both}
        except Exception as exc:  # a version that cannot build a kernel: reported, not fatal
            found[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    out.write_text(json.dumps(found))


def run_side(src: pathlib.Path, keys: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="same_") as tmp:
        out = pathlib.Path(tmp) / "fingerprints.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]), "PYTHONWARNINGS": "ignore",
               "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", str(out), *keys]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise SystemExit(f"the version at {src} failed:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=pathlib.Path, help="a checkout of the earlier version")
    parser.add_argument("--only", help="comma-separated benchmark keys (default: all)")
    parser.add_argument("--out", type=pathlib.Path, help="write the markdown table here")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[1:], pathlib.Path(args.worker[0]))
        return
    if args.baseline is None:
        parser.error("--baseline is required")
    from benchmarks.kernelbench import specs

    keys = sorted(specs.by_key()) if not args.only else [k.strip() for k in args.only.split(",")]
    before = run_side(args.baseline.resolve() / "src", keys, args.timeout)
    after = run_side(ROOT / "src", keys, args.timeout)
    rows, differ = [], []
    for key in keys:
        a, b = before.get(key, {}), after.get(key, {})
        same = {part: a.get(part) is not None and a.get(part) == b.get(part) for part in ("fwd", "fwdbwd")}
        if not all(same.values()):
            differ.append(key)
        note = a.get("error") or b.get("error") or ""
        rows.append(f"| {key} | {'same' if same['fwd'] else 'differs'} | {'same' if same['fwdbwd'] else 'differs'} "
                    f"| {note} |")
    table = "\n".join(["| kernel | forward | forward+backward | note |", "|---|---|---|---|", *rows])
    summary = (f"{len(keys) - len(differ)} of {len(keys)} kernels build identical programs at both versions"
               + (f"; differing: {', '.join(differ)}" if differ else ""))
    text = f"{summary}\n\n{table}\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
