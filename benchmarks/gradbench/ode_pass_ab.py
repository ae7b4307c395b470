"""Paired A/B of one `OPTIMIZE` pass on GradBench's ode (kept for the commands in the results; the script
is `pass_ab.py`, which has other evals too):

    OMP_NUM_THREADS=1 python benchmarks/gradbench/ode_pass_ab.py --without write_in_place
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pass_ab import main  # noqa: E402

if __name__ == "__main__":
    main(["ode", *sys.argv[1:]])
