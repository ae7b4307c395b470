"""Safe identifiers for everything that reaches generated code.

ONNX names are arbitrary strings (`a"; system("x`, `1:0`, unicode). None of them is ever emitted: every
tensor, node, symbol and graph gets a generated name `<prefix><counter>_<hint>`, where the hint keeps only
ASCII letters and digits of the original (for readable SDFGs) and the counter makes it unique. The prefix
+ counter form can neither collide with C++ keywords nor with DaCe's internal `__`-names.
"""

from __future__ import annotations

import itertools
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9]+")


def hint(name: str, limit: int = 16) -> str:
    """The letters and digits of `name`, joined by `_`, cut to `limit` characters."""
    return _UNSAFE.sub("_", name).strip("_")[:limit]


class Namer:
    """Hands out unique safe identifiers (one namer per lowering)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def __call__(self, prefix: str, original: str = "") -> str:
        assert re.fullmatch(r"[A-Za-z]+", prefix)
        return f"{prefix}{next(self._counter)}_{hint(original)}"
