"""gradflow's ht Jacobian against central differences of its own objective (which the relay validates
against the PyTorch tool at every workload), at workloads where the PyTorch tool's Jacobian takes hours.

    python benchmarks/gradbench/ht_fd_check.py --gradbench ../gradbench 5 11
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hands", nargs="+", type=int, help="data file numbers (hand<k>_...)")
    parser.add_argument("--gradbench", type=Path, required=True)
    args = parser.parse_args()
    sys.path[:0] = [str(args.gradbench / "python" / "gradbench"), str(Path(__file__).resolve().parent)]
    from gradbench.evals.ht import io
    from programs import ht

    data = args.gradbench / "evals" / "ht" / "data" / "complicated_big"
    for k in args.hands:
        given = io.read_hand_instance(data / "model", next(data.glob(f"hand{k}_*.txt")), True).to_dict()
        given = json.loads(json.dumps(given, default=lambda o: o.tolist()))
        jacobian = ht.FUNCTIONS["jacobian"].prepare(given)[0]()

        def errors(theta, us, given=given):
            call, _ = ht.FUNCTIONS["objective"].prepare(given | {"theta": list(theta), "us": us.tolist()})
            return call().reshape(-1).copy()

        theta, us = np.array(given["theta"]), np.array(given["us"]).reshape(-1, 2)
        columns = []
        for c in range(2):  # us's two columns: every point's us[:, c] at once (its errors depend on its own)
            step = np.zeros_like(us)
            step[:, c] = 1e-6
            columns.append((errors(theta, us + step) - errors(theta, us - step)) / 2e-6)
        for h in np.eye(theta.size) * 1e-6:
            columns.append((errors(theta + h, us) - errors(theta - h, us)) / 2e-6)
        gap = np.abs(jacobian - np.stack(columns, axis=1)).max()
        print(f"hand{k}: Jacobian {jacobian.shape}, largest |gradflow - central differences| {gap:.1e} "
              f"(largest entry {np.abs(jacobian).max():.2g})")


if __name__ == "__main__":
    main()
