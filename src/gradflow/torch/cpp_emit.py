"""A tiny indentation-aware emitter of C-like source text, for the generated C++ dispatcher (`cpp.py`).

The generator writes each line without leading blanks: the emitter indents it by the depth of the
enclosing `block`s, so a section of the generated file can be emitted at any nesting level and its braces
always close where they opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Emitter:
    """Lines of source text; `line` and `text` indent by the current depth, `block` nests."""

    def __init__(self, indent: str = "  ") -> None:
        self.indent = indent
        self.depth = 0
        self.lines: list[str] = []

    def line(self, *texts: str) -> None:
        """One line per text at the current depth; an empty text is an empty line (no trailing blanks)."""
        for text in texts:
            self.lines.append(self.indent * self.depth + text if text else "")

    def text(self, template: str) -> None:
        """A fixed multi-line part of the file, each of its lines at the current depth."""
        self.line(*template.splitlines())

    @contextmanager
    def block(self, head: str, close: str = "}", indent: bool = True) -> Iterator[None]:
        """`head {` (a bare `{` for an empty head), the body one level deeper, then `close` (`};` after a
        struct). `indent=False` keeps the body at this depth (a C++ namespace)."""
        self.line(f"{head} {{" if head else "{")
        step = 1 if indent else 0
        self.depth += step
        try:
            yield
        finally:
            self.depth -= step
        self.line(close)

    def branch(self, text: str) -> None:
        """A line one level out inside a block, such as `} else {`: the chain stays one block."""
        self.depth -= 1
        self.line(text)
        self.depth += 1

    def source(self) -> str:
        """The text, every line ending in a newline."""
        return "\n".join(self.lines) + "\n"
