"""Issue 14's model zoo through the ONNX frontend: per model, the loss gradient w.r.t. every parameter
(and, for the embedding models, w.r.t. every parameter but the frozen embedding) against torch.autograd.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/onnx_zoo_grad.py [model ...]

Prints one row per model and case: `ok` with the worst relative error, or the stage that failed (export,
load, forward, grad) with the error's type and first line. The report is the point of this script, so it
records any exception a stage raises instead of stopping at the first model.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "frontend", "onnx"))

import onnx_zoo  # noqa: E402


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:220]


def run(name: str) -> list[tuple[str, str, str]]:
    import gradflow.onnx

    loss, x, target = onnx_zoo.build(name)
    stage = "export"
    rows = []
    try:
        model = onnx_zoo.export_with_loss(loss, x, target)
        stage = "load"
        prog = gradflow.onnx.load(model)
        stage = "forward"
        (value,) = prog(x.numpy(), target.numpy())
        want = loss(x, target).item()
        if not np.isclose(float(np.asarray(value).reshape(-1)[0]), want, rtol=1e-9):
            return [(name, "all", f"forward mismatch: {value} vs torch {want}")]
    except Exception as e:  # a report of what fails: record it, go on with the next model
        return [(name, "all", f"{stage}: {_first_line(e)}")]
    names = [n for n, _ in loss.named_parameters()]
    cases = {"all params": names}
    frozen = [n for n in names if "embed" not in n]
    if frozen != names:
        cases["embedding frozen"] = frozen
    for case, wrt in cases.items():
        try:
            t0 = time.perf_counter()
            got_value, got = onnx_zoo.gradflow_grads(prog, x, target, wrt)
            secs = time.perf_counter() - t0
            want_value, want = onnx_zoo.torch_grads(loss, x, target, wrt)
            worst = max(float(np.max(np.abs(got[n] - want[n]) / (np.abs(want[n]) + 1e-300))) for n in wrt)
            bad = [n for n in wrt if not np.allclose(got[n], want[n], rtol=1e-9, atol=1e-12)]
            status = "ok" if not bad and np.isclose(got_value, want_value, rtol=1e-9) else f"MISMATCH {bad}"
            rows.append((name, case, f"{status} (worst rel {worst:.1e}, {secs:.1f} s)"))
        except Exception as e:  # see above
            if os.environ.get("ZOO_TRACE"):
                traceback.print_exc()
            rows.append((name, case, f"grad: {_first_line(e)}"))
    return rows


def main(argv: list[str]) -> int:
    names = argv or list(onnx_zoo.MODELS)
    for name in names:
        for row in run(name):
            print(" | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
