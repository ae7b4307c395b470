"""Passes and pipelines.

A pass is a frozen attrs class whose fields are its options and whose `run` maps a `Graph` to
`Result[Graph, GradflowError]`. `__call__` wraps `run` so that an unexpected exception from deep inside
DaCe becomes a `PassError` value naming the pass, never a bare traceback. A `Pipeline` is a tuple of
passes and is itself a pass; `Pipeline.named("a", "b")` builds one from the registry.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs
from returns.result import Failure, Result, Success

from gradflow.core.errors import GradflowError, InvalidArgumentError, PassError
from gradflow.core.graph import Graph

PassResult = Result[Graph, GradflowError]

#: name -> pass class; filled by `@register_pass`.
PASS_REGISTRY: dict[str, type["Pass"]] = {}


class Pass:
    """Base class for passes: subclasses are `@attrs.frozen`, set `name`, and implement `run`."""

    name: ClassVar[str] = "pass"

    def run(self, graph: Graph) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, graph: Graph) -> PassResult:
        try:
            return self.run(graph)
        except GradflowError as err:
            return Failure(err)
        except Exception as exc:  # a DaCe internal error: report it as a value naming the pass
            return Failure(PassError(f"pass '{self.name}' failed: {type(exc).__name__}: {exc}"))


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available to `Pipeline.named` and the purity tests."""
    if cls.name in PASS_REGISTRY and PASS_REGISTRY[cls.name] is not cls:
        raise InvalidArgumentError(f"a pass named '{cls.name}' is already registered")
    PASS_REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[Pass]]:
    """All registered passes by name (importing gradflow registers the built-in ones)."""
    import gradflow  # noqa: F401  (registration happens on import)

    return dict(PASS_REGISTRY)


StepHook = Callable[[str, Graph], None]


@attrs.frozen
class Pipeline(Pass):
    """Straight-line composition of passes; stops at the first failure. Itself a pass.

    `hook`, when given, sees each step's name and output graph (for dumping, timing, debugging).
    """

    steps: tuple[Pass, ...] = attrs.field(converter=tuple)
    hook: StepHook | None = attrs.field(default=None, eq=False)
    name: ClassVar[str] = "pipeline"

    @classmethod
    def named(cls, *names: str, hook: StepHook | None = None) -> "Pipeline":
        registry = registered_passes()
        missing = [n for n in names if n not in registry]
        if missing:
            raise InvalidArgumentError(
                f"unknown pass name(s) {missing}; registered passes: {', '.join(sorted(registry))}"
            )
        return cls(tuple(registry[n]() for n in names), hook)

    def __add__(self, other: "Pipeline | Pass") -> "Pipeline":
        extra = other.steps if isinstance(other, Pipeline) else (other,)
        return Pipeline(self.steps + extra, self.hook)

    def with_hook(self, hook: StepHook | None) -> "Pipeline":
        return Pipeline(self.steps, hook)

    def run(self, graph: Graph) -> PassResult:
        result: PassResult = Success(graph)
        for step in self.steps:
            result = result.bind(step)
            if isinstance(result, Failure):
                return result
            if self.hook is not None:
                self.hook(step.name, result.unwrap())
        return result


def unwrap_or_raise(result: Result) -> object:
    """At the public edge: the success value, or raise the typed error."""
    if isinstance(result, Failure):
        raise result.failure()
    return result.unwrap()
