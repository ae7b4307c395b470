"""Typed errors: values inside pipelines, exceptions at the public edge.

Every error is a frozen attrs record whose fields name what is at fault (node, state, array, file, op).
`render` is the one place that turns a record into the message a user reads, so wording stays uniform.
Each record is also an `Exception` subclass, so the public API can raise it unchanged.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import attrs


@attrs.frozen(eq=False)
class GradflowError(Exception):
    """Base of every error gradflow reports. `hint` says what the user can do about it."""

    message: str
    hint: str = ""

    def render(self) -> str:
        text = self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def __str__(self) -> str:  # Exception protocol
        return self.render()


@attrs.frozen(eq=False)
class InvalidArgumentError(GradflowError, ValueError):
    """A public API argument is malformed (wrong kind, missing name, clashing name)."""


@attrs.frozen(eq=False)
class UnknownArrayError(InvalidArgumentError, KeyError):
    """A name given by the user is not an array of the SDFG."""

    @classmethod
    def build(cls, what: str, name: str, available: Sequence[str]) -> "UnknownArrayError":
        listed = ", ".join(sorted(available)) or "(none)"
        return cls(f"{what} names '{name}', which is not an array of the SDFG; arrays there: {listed}")


@attrs.frozen(eq=False)
class NotDifferentiableError(GradflowError):
    """Something in the program cannot be differentiated (integer data, an unsupported construct)."""


@attrs.frozen(eq=False)
class NoRuleError(NotDifferentiableError):
    """No rule of a table applies to a node; names the node and where it is."""

    @classmethod
    def build(cls, table: str, node: str, where: str, hint: str = "") -> "NoRuleError":
        return cls(f"no rule of table '{table}' applies to {node} in {where}", hint)


@attrs.frozen(eq=False)
class RuleTableError(GradflowError):
    """A declarative table in rules/ is malformed; names the file and the entry."""

    @classmethod
    def build(cls, path: str, entry: str, problem: str) -> "RuleTableError":
        return cls(f"{path}: entry '{entry}': {problem}")


@attrs.frozen(eq=False)
class PassError(GradflowError):
    """A pass failed; names the pass and the reason. When an unexpected exception caused it, that exception
    (with its traceback) is `cause` and is chained as `__cause__`, so the bug can be found."""

    cause: BaseException | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.cause is not None:
            self.__cause__ = self.cause

    @classmethod
    def wrap(cls, pass_name: str, exc: BaseException) -> "PassError":
        return cls(f"pass '{pass_name}' failed: {type(exc).__name__}: {exc}",
                   "this is likely a bug in gradflow or DaCe; the original exception is chained as the cause",
                   cause=exc)


@attrs.frozen(eq=False)
class PurityError(PassError):
    """A pass modified its input graph."""


@attrs.frozen(eq=False)
class CompilationError(GradflowError):
    """The C++ build of an SDFG failed."""


@attrs.frozen(eq=False)
class ArgumentError(GradflowError, TypeError):
    """A runtime argument (array, tensor, scalar) does not match what the compiled program expects."""


@attrs.frozen(eq=False)
class LoopBoundError(GradflowError, RuntimeError):
    """A while loop ran past the trip-count bound its forwarding policy gave; the gradients are invalid."""


class CacheWarning(UserWarning):
    """The compile cache could not be used as it was: an entry failed its integrity check and is rebuilt,
    or the cache root is unusable and a private temporary cache is used instead. Results are unaffected."""


def describe(value: object) -> str:
    """A short description of a user's value for a message: numbers, None and short strings as they are,
    arrays by type and shape, anything else by type (never the repr of a big or hostile object)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) or (shape is not None and type(shape).__name__ == "Size"):
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return f"a {type(value).__name__}"
@attrs.frozen(eq=False)
class IndexOutOfRangeError(GradflowError, IndexError):
    """An index computed from data while a program ran was out of range (see `gradflow.core.checks`)."""


@attrs.frozen(eq=False)
class ResourceLimitError(GradflowError):
    """A program would allocate more than a limit the user can raise (e.g. one tensor over
    `GRADFLOW_MAX_TENSOR_BYTES`); raised before anything is allocated."""


def render(error: GradflowError) -> str:
    """The one place that turns an error value into text."""
    return f"{type(error).__name__}: {error.render()}"


#: The `Graph.meta` key of a graph's origins: generated label -> what it was generated for (e.g.
#: "ONNX node 'fc1' (Gemm)"), so an error about generated code can name the source the user wrote.
ORIGINS = "origins"


def with_origins(error: GradflowError, origins: Mapping[str, str]) -> GradflowError:
    """`error` with the sources of the generated labels its message mentions appended (itself if none)."""
    found = [where for label, where in origins.items()
             if re.search(rf"(?<![A-Za-z0-9]){re.escape(label)}(?![A-Za-z0-9])", error.message)]
    if not found:
        return error
    sources = ", ".join(dict.fromkeys(found))
    return attrs.evolve(error, message=f"{error.message} (in the code generated for {sources})")
