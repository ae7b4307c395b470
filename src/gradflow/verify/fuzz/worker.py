"""A fuzz worker process: reads one program spec per line (JSON) on stdin, checks it, and answers one verdict
per line on the descriptor it was started with. Anything else the process prints (DaCe, the C++ compiler)
goes to stderr, so the answers cannot be garbled. The compile cache is the worker's own and is emptied
after each program (no build is reused across generated programs).

    python -m gradflow.verify.fuzz.worker
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path


#: the names of compile-cache entries (`<key>`, `.build-<key>-*`, `<key>.lock`)
_BUILD = re.compile(r"(build-)?[0-9a-f]{24}(-.*)?")


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of DaCe and the compiler go to stderr
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    from gradflow.verify.fuzz.check import check_program

    cache = Path(os.environ.get("GRADFLOW_CACHE") or tempfile.mkdtemp(prefix="gradflow-fuzz-cache-"))
    os.environ["GRADFLOW_CACHE"] = str(cache)
    scratch = Path(tempfile.mkdtemp(prefix="gradflow-fuzz-src-"))
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        verdict = check_program(spec, scratch)
        answers.write(json.dumps(verdict.as_json()) + "\n")
        for entry in cache.iterdir():  # the builds, not the shared files beside them (the BLAS shim header)
            if _BUILD.fullmatch(entry.name.split(".lock")[0].lstrip(".")):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
