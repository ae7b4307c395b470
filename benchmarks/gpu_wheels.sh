#!/usr/bin/env bash
# The wheels `benchmarks/gpu.py` needs on the device machine (Python 3.12, no network, no DaCe), fetched
# here into .whl/ (ignored by git: .git/info/exclude). The device's image already has numpy, sympy,
# networkx, torch, onnx, onnxscript, attrs, scipy, pyyaml, packaging, click, cmake, ninja, ml-dtypes.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
python3 -m pip wheel -q --no-deps dace==2.0.0b1 -w .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl astunparse fparser ordered-set ply dill returns scikit-build scipy-openblas32
du -sh .whl && ls .whl
