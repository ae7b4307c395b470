"""Passes and pipelines.

A pass is a frozen attrs class whose fields are its options and whose `run` maps a `Graph` to
`Result[Graph, GradflowError]`. `__call__` wraps `run` so that an unexpected exception from deep inside
DaCe becomes a `PassError` value naming the pass (with the exception chained as its cause), never a bare
traceback, and checks the graph `run` returns (`core/validation.py`: a malformed graph is a `PassError`
naming the pass, not a crash in DaCe's code generator later). A pass declares the passes that must have
run before it (`requires`), and the rule tables it uses as fields tagged with `table_field`, so a pipeline
can swap a table for all of its steps.

A `Pipeline` is a tuple of passes and is itself a pass. It is a value users edit: by step name
(`replace`, `insert_before`, `insert_after`, `without`), by table (`with_rules`), and built from the
registry with options (`Pipeline.named("reverse", options={"reverse": {...}})`). Prerequisites are checked
when a pipeline is built: a step whose prerequisite does not come earlier is an error naming both (a
pipeline that starts from an already-normalized graph says so with `assumes=`).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, TypeVar

import attrs
import dace
from returns.result import Failure, Result, Success

from gradflow.core.errors import GradflowError, InvalidArgumentError, PassError
from gradflow.core.exact_subsets import exact_subsets
from gradflow.core.graph import Graph
from gradflow.core.validation import check_graph

PassResult = Result[Graph, GradflowError]

#: name -> pass class; filled by `@register_pass`.
PASS_REGISTRY: dict[str, type["Pass"]] = {}

#: attrs field metadata key naming the rule table a pass field holds.
TABLE = "gradflow_table"


def table_field(table: str, factory: Callable[[], Any]) -> Any:
    """An attrs field holding the rule table `table` (default: `factory()`, the built-in table)."""
    return attrs.field(factory=factory, metadata={TABLE: table})


def table_fields(step: "Pass") -> dict[str, str]:
    """field name -> table name, for the table fields of a pass."""
    cls = type(step)
    if not attrs.has(cls):
        return {}
    return {f.name: f.metadata[TABLE] for f in attrs.fields(cls) if TABLE in f.metadata}


class Pass:
    """Base class for passes: subclasses are `@attrs.frozen`, set `name`, and implement `run`.

    `requires`: names of passes that must run before this one in a pipeline.
    """

    name: ClassVar[str] = "pass"
    requires: ClassVar[tuple[str, ...]] = ()
    #: Whether `__call__` checks the graph `run` returns (`core/validation.py`); a pipeline's steps do.
    checks_output: ClassVar[bool] = True

    def run(self, graph: Graph) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, graph: Graph) -> PassResult:
        was_lent = bool(graph._lender)
        try:
            # DaCe's source-line info would inspect the Python stack at every node a pass adds (a third of
            # some pipelines' time) to record gradflow's own files, which nobody reads. DaCe's propagation
            # and the transformations' checks inside a pass reason about subsets without taking symbols
            # as positive (`exact_subsets`: a union DaCe makes unsound is a wrong gradient here).
            with dace.config.set_temporary("compiler", "lineinfo", value="none"), exact_subsets():
                result = self.run(graph)
        except GradflowError as err:
            return Failure(err)
        except Exception as exc:  # a DaCe internal error: report it as a value naming the pass, cause kept
            return Failure(PassError.wrap(self.name, exc))
        # The pass changed something when it returns another SDFG, or took the lent one to edit in place.
        edited = isinstance(result, Success) and (result.unwrap().sdfg is not graph.sdfg
                                                  or (was_lent and not graph._lender))
        if self.checks_output and edited:
            error = check_graph(result.unwrap().sdfg, self.name)
            if error is not None:
                return Failure(error)
        return result

    def provides(self) -> tuple[str, ...]:
        """The step names this pass counts as, for prerequisites (a pipeline: all of its steps')."""
        return (self.name,)


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available to `Pipeline.named` and the purity tests."""
    if cls.name in PASS_REGISTRY and PASS_REGISTRY[cls.name] is not cls:
        raise InvalidArgumentError(f"a pass named '{cls.name}' is already registered")
    PASS_REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[Pass]]:
    """The passes registered so far, by name. The built-in ones register when their modules load, which
    importing `gradflow` does (and any import of this module imports `gradflow` first); code that runs
    while `gradflow` itself is still loading sees only the passes loaded before it."""
    return dict(PASS_REGISTRY)


StepHook = Callable[[str, Graph], None]


def _check_prerequisites(steps: tuple[Pass, ...], assumes: tuple[str, ...]) -> None:
    done = set(assumes)
    for step in steps:
        missing = [r for r in step.requires if r not in done]
        if missing:
            raise InvalidArgumentError(
                f"pipeline step '{step.name}' requires '{missing[0]}' to run before it, and no earlier step is "
                f"'{missing[0]}' (steps: {', '.join(s.name for s in steps)})",
                f"insert the '{missing[0]}' pass before '{step.name}', or build the pipeline with "
                f"assumes=('{missing[0]}',) if its input graph already went through it",
            )
        done.update(step.provides())


def _steps(value: Any) -> tuple[Pass, ...]:
    steps = tuple(value)
    bad = [s for s in steps if not isinstance(s, Pass)]
    if bad:
        raise InvalidArgumentError(f"a pipeline is made of passes; got {type(bad[0]).__name__} {bad[0]!r}",
                                   "use Pipeline.named('<pass name>', ...) to build one from names")
    return steps


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class Pipeline(Pass):
    """Straight-line composition of passes; stops at the first failure. Itself a pass.

    `hook`, when given, sees each step's name and output graph (for dumping, timing, debugging).
    `assumes` names passes its input has already been through (for prerequisite checks).
    """

    steps: tuple[Pass, ...] = attrs.field(converter=_steps)
    hook: StepHook | None = attrs.field(default=None, eq=False)
    assumes: tuple[str, ...] = attrs.field(default=(), converter=_names)
    name: ClassVar[str] = "pipeline"
    checks_output: ClassVar[bool] = False  # each step checks its own output

    def __attrs_post_init__(self) -> None:
        _check_prerequisites(self.steps, self.assumes)

    # ---- building ------------------------------------------------------------------------------------

    @classmethod
    def named(cls, *names: str, hook: StepHook | None = None,
              options: Mapping[str, Mapping[str, Any]] | None = None, assumes: tuple[str, ...] = ()) -> "Pipeline":
        """A pipeline of registered passes by name; `options[name]` gives that pass's fields."""
        registry = registered_passes()
        missing = [n for n in names if n not in registry]
        if missing:
            raise InvalidArgumentError(
                f"unknown pass name(s) {missing}; registered passes: {', '.join(sorted(registry))}"
            )
        options = dict(options or {})
        stray = sorted(set(options) - set(names))
        if stray:
            raise InvalidArgumentError(f"options given for pass(es) {stray} that are not in the pipeline {list(names)}")
        return cls(tuple(_instantiate(registry[n], options.get(n, {})) for n in names), hook, assumes)

    def __add__(self, other: "Pipeline | Pass") -> "Pipeline":
        extra = other.steps if isinstance(other, Pipeline) else (other,)
        return Pipeline(self.steps + extra, self.hook, self.assumes)

    def with_hook(self, hook: StepHook | None) -> "Pipeline":
        return Pipeline(self.steps, hook, self.assumes)

    # ---- editing by name -----------------------------------------------------------------------------

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def index(self, name: str) -> int:
        found = [k for k, s in enumerate(self.steps) if s.name == name]
        if not found:
            raise InvalidArgumentError(f"the pipeline has no step '{name}'; its steps: {', '.join(self.names())}")
        if len(found) > 1:
            raise InvalidArgumentError(f"the pipeline has {len(found)} steps named '{name}'; edit it by position")
        return found[0]

    def step(self, name: str) -> Pass:
        return self.steps[self.index(name)]

    def _edited(self, steps: tuple[Pass, ...]) -> "Pipeline":
        return Pipeline(steps, self.hook, self.assumes)

    def replace(self, name: str, new: Pass) -> "Pipeline":
        k = self.index(name)
        return self._edited(self.steps[:k] + (new,) + self.steps[k + 1:])

    def insert_before(self, name: str, new: Pass) -> "Pipeline":
        k = self.index(name)
        return self._edited(self.steps[:k] + (new,) + self.steps[k:])

    def insert_after(self, name: str, new: Pass) -> "Pipeline":
        k = self.index(name)
        return self._edited(self.steps[:k + 1] + (new,) + self.steps[k + 1:])

    def without(self, name: str) -> "Pipeline":
        k = self.index(name)
        return self._edited(self.steps[:k] + self.steps[k + 1:])

    def with_rules(self, **tables: Any) -> "Pipeline":
        """The same pipeline with these rule tables (by table name, e.g. `reverse=`, `library=`) in every
        step that uses them, nested pipelines included. Naming a table no step uses is an error."""
        used: set[str] = set()

        def swap(step: Pass) -> Pass:
            if isinstance(step, Pipeline):
                return step._edited(tuple(swap(s) for s in step.steps))
            changes = {f: tables[t] for f, t in table_fields(step).items() if t in tables}
            used.update(table_fields(step)[f] for f in changes)
            # `changes` names fields of `step` (`table_fields`), so it is an attrs class; typed as the base `Pass`
            return attrs.evolve(step, **changes) if changes else step  # type: ignore[misc]

        new = self._edited(tuple(swap(s) for s in self.steps))
        unused = sorted(set(tables) - used)
        if unused:
            raise InvalidArgumentError(f"no step of the pipeline uses rule table(s) {', '.join(unused)}",
                                       f"tables its steps use: {', '.join(sorted(self.tables())) or 'none'}")
        return new

    def tables(self) -> set[str]:
        """Names of the rule tables the steps use."""
        out: set[str] = set()
        for step in self.walk():
            out.update(table_fields(step).values())
        return out

    def walk(self) -> Iterator[Pass]:
        """Every step, nested pipelines flattened."""
        for step in self.steps:
            if isinstance(step, Pipeline):
                yield from step.walk()
            else:
                yield step

    def provides(self) -> tuple[str, ...]:
        return tuple(n for s in self.steps for n in s.provides())

    # ---- running -------------------------------------------------------------------------------------

    def run(self, graph: Graph) -> PassResult:
        run = object()  # this run's token for the intermediates it lends (Graph._lend)
        seen = {id(graph.sdfg)}
        current = graph
        for k, step in enumerate(self.steps):
            previous, was_lent = current, bool(current._lender)
            result = step(current)
            if isinstance(result, Failure):
                return result
            current = result.unwrap()
            # The step built the SDFG it returns, or took over the one lent to it: no one else holds it,
            # so the next step may edit it in place.
            taken = was_lent and not previous._lender and current.sdfg is previous.sdfg
            if self.hook is not None:
                self.hook(step.name, current)
            elif (id(current.sdfg) not in seen or taken) and k + 1 < len(self.steps):
                current._lend(run)
            seen.add(id(current.sdfg))
        current._reclaim(run)
        return Success(current)


def _instantiate(cls: type[Pass], options: Mapping[str, Any]) -> Pass:
    if options and not attrs.has(cls):
        raise InvalidArgumentError(f"pass '{cls.name}' takes no options, got {sorted(options)}")
    allowed = {f.name for f in attrs.fields(cls)} if attrs.has(cls) else set()
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidArgumentError(f"pass '{cls.name}' has no option(s) {unknown}; its options: {sorted(allowed)}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"bad options for pass '{cls.name}': {exc}") from exc


_Value = TypeVar("_Value")


def unwrap_or_raise(result: Result[_Value, BaseException]) -> _Value:
    """At the public edge: the success value, or raise the typed error (its cause chained)."""
    if isinstance(result, Failure):
        error = result.failure()
        raise error from getattr(error, "cause", None)
    return result.unwrap()
