"""Where gradflow keeps the files it generates: builds (`runtime.compile`) and the BLAS shim header
(`runtime.blas`).

A module of its own because both use it and `compile` imports `blas` (which expansion a build gets):
`blas` reading the root from `compile` closed a circle between them.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The configured root: `GRADFLOW_CACHE`, else `$XDG_CACHE_HOME/gradflow`, else `~/.cache/gradflow`."""
    env = os.environ.get("GRADFLOW_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradflow"
