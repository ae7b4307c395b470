"""gradflow's own library nodes: operations kept whole through differentiation and compiled to hand-written
C++ on BLAS (`convolution`: a 2-D convolution and its two gradients).

Their expansions are Python code of this package, which a compiled program's fingerprint (taken before
expansion) does not see: `tag()` is part of the compile-cache key instead, so a changed expansion is a
new build."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.cache
def tag() -> str:
    """Content hash of this package's modules."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
