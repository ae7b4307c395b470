"""Bytes forwarded from the forward to the backward sweep, per loop kernel and forwarding strategy.

For every kernel of the loop corpus (`gradflow/verify/corpus/loops.py`, NPBench/PolyBench-style), differentiate
with `STORE_ALL` and `RECOMPUTE_ALL` (while loops bounded at 64 iterations) and report what the forward
keeps for the backward beyond the program's own arguments: transients the backward reads plus the tape
(per-iteration stores, recorded trip counts and branches), evaluated at the kernel's test sizes. Also
lists what `RECOMPUTE_ALL` recomputes. No compilation: this is a property of the generated SDFGs.

    OMP_NUM_THREADS=1 python benchmarks/forwarding.py [--csv out.csv]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gradflow  # noqa: E402
from gradflow.autodiff.passes import Reverse, ad_pipeline, forwarded_bytes  # noqa: E402
from gradflow.core.graph import Graph  # noqa: E402
from gradflow.verify.corpus import loops  # noqa: E402

BOUNDS = {"*": 64}


def measure(case, policy: gradflow.Forwarding) -> tuple[int, tuple[str, ...]]:
    pipeline = ad_pipeline(Reverse(case.wrt, (case.of,), forwarding=policy.with_loop_bounds(**BOUNDS)))
    graph = pipeline(Graph.of(case.to_sdfg())).unwrap()
    return forwarded_bytes(graph, dict(case.symbols)), graph.meta["ad"].recomputed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=pathlib.Path, help="also write the table as CSV")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    print(f"{'kernel':28s} {'sizes':22s} {'store_all B':>12s} {'recompute_all B':>16s} {'ratio':>6s}  recomputed")
    for case in loops.CASES:
        stored, _ = measure(case, gradflow.STORE_ALL)
        recomputed, names = measure(case, gradflow.RECOMPUTE_ALL)
        ratio = f"{recomputed / stored:.2f}" if stored else "-"
        sizes = ",".join(f"{k}={v}" for k, v in sorted(case.symbols.items()))
        print(f"{case.name:28s} {sizes:22s} {stored:12d} {recomputed:16d} {ratio:>6s}  {', '.join(names) or '-'}")
        rows.append((case.name, sizes, stored, recomputed, ";".join(names)))
    total_s, total_r = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"{'total':28s} {'':22s} {total_s:12d} {total_r:16d} {total_r / total_s:6.2f}")
    if args.csv:
        args.csv.write_text("kernel,sizes,store_all_bytes,recompute_all_bytes,recomputed\n"
                            + "".join(f"{a},\"{b}\",{c},{d},{e}\n" for a, b, c, d, e in rows))


if __name__ == "__main__":
    main()
