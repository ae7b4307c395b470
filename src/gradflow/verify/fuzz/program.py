"""The fuzzer's program model: one tree of frozen records that renders both as a `@dace.program` and as its
plain numpy twin (the same body text; only the signatures differ), so the two cannot drift apart.

Sizes are symbols (`N`, `M`) in the DaCe program and integers in the twin. Every index stays inside its
array by construction (the grammar tracks the range of each loop variable); every function argument is
squashed into the function's domain from `rules/elementwise.toml` (`lo + (hi - lo) * (1 + tanh(e)) / 2`,
shrunk slightly), so no program divides by zero or takes the log of a negative number.
"""

from __future__ import annotations

import re
from typing import Union

import attrs

Dim = Union[str, int]  # a size symbol ("N", "M") or a literal extent


# ---- expressions ------------------------------------------------------------------------------------------

@attrs.frozen
class At:
    """One index: `base + offset` (`base` a size symbol, a loop variable, or None for a constant)."""

    base: str | None
    offset: int

    def render(self) -> str:
        if self.base is None:
            return str(self.offset)
        if self.offset == 0:
            return self.base
        return f"{self.base} {'+' if self.offset > 0 else '-'} {abs(self.offset)}"


@attrs.frozen
class Span:
    """A slice `lo : dim - hi : step` of a dimension (`lo`, `hi` >= 0; the dimension's extent is `dim`)."""

    lo: int
    hi: int
    step: int
    dim: Dim

    def render(self) -> str:
        stop = "" if self.hi == 0 else (f"{self.dim} - {self.hi}" if isinstance(self.dim, str)
                                         else str(self.dim - self.hi))
        lo = "" if self.lo == 0 else str(self.lo)
        step = "" if self.step == 1 else f":{self.step}"
        return f"{lo}:{stop}{step}"

    @property
    def key(self) -> tuple:
        """Slices with equal keys have equal lengths, whatever the sizes."""
        return (self.dim, self.step, self.lo + self.hi)


@attrs.frozen
class Via:
    """An index read from an integer array: `idx[k]` (k a loop variable) or, with `var` None, the whole
    index array (a gather `x[idx]`)."""

    index_array: str
    var: str | None

    def render(self) -> str:
        return self.index_array if self.var is None else f"{self.index_array}[{self.var}]"


Index = Union[At, Span, Via]


@attrs.frozen
class Num:
    value: float

    def render(self) -> str:
        # a negative literal in parentheses: `(-1.25) ** 2`, not `-1.25 ** 2` (= -1.5625, which made a
        # `while` counter's increment negative and the loop endless)
        return repr(self.value) if self.value >= 0 else f"({self.value!r})"


@attrs.frozen
class Arange:
    """`np.arange(length) * scale`: weights by position (DaCe writes the conversion in arange's tasklet in
    C++, `decltype(__out)(...)`, which reverse mode refused until 2026-12-05)."""

    length: At
    scale: float

    def render(self) -> str:
        return f"(np.arange({self.length.render()}) * {self.scale!r})"


@attrs.frozen
class Read:
    """An array (or temporary) read whole (`index` None) or through an index per dimension."""

    array: str
    index: tuple[Index, ...] | None = None

    def render(self) -> str:
        if self.index is None:
            return self.array
        return f"{self.array}[{', '.join(i.render() for i in self.index)}]"


@attrs.frozen
class Call:
    """A function of the elementwise table, its argument squashed into the function's domain
    (`center + radius * tanh(arg)`), or passed as it is when the domain is everything."""

    spelling: str  # numpy spelling, e.g. "np.log"
    arg: "Expr"
    center: float | None = None
    radius: float | None = None

    def render(self) -> str:
        inner = self.arg.render()
        if self.center is not None:
            inner = f"{self.center!r} + {self.radius!r} * np.tanh({inner})"
        return f"{self.spelling}({inner})"


@attrs.frozen
class Op:
    """`left op right`; a divisor is squashed into [0.5, 3] and a power's base into [0.2, 3]."""

    op: str  # "+", "-", "*", "/", "**", "max", "min"
    left: "Expr"
    right: "Expr"

    def render(self) -> str:
        left, right = self.left.render(), self.right.render()
        if self.op == "/":
            return f"({left} / (1.75 + 1.2 * np.tanh({right})))"
        if self.op == "**":
            return f"((1.6 + 1.3 * np.tanh({left})) ** {right})"
        if self.op in ("max", "min"):
            return f"np.{self.op}imum({left}, {right})"
        return f"({left} {self.op} {right})"


@attrs.frozen
class Reduce:
    """`np.sum`, `np.max`, `np.min`, `np.prod` or `np.mean` of an expression (whole, or along `axis`)."""

    kind: str
    arg: "Expr"
    axis: int | None = None

    def render(self) -> str:
        axis = "" if self.axis is None else f", axis={self.axis}"
        return f"np.{self.kind}({self.arg.render()}{axis})"


@attrs.frozen
class Stop:
    """`stop_gradient(arg)`: gradflow's stop of the gradient in the DaCe program; in the twin, a value that
    central differences hold at its unperturbed value (`fuzz.frozen`), so they differentiate as a stop does."""

    arg: "Expr"

    def render(self) -> str:
        return f"stop_gradient({self.arg.render()})"


@attrs.frozen
class MatMul:
    left: "Expr"
    right: "Expr"

    def render(self) -> str:
        return f"({self.left.render()} @ {self.right.render()})"


@attrs.frozen
class Transpose:
    arg: "Expr"

    def render(self) -> str:
        return f"np.transpose({self.arg.render()})"


Expr = Union[Num, Arange, Read, Call, Op, Reduce, MatMul, Transpose]


# ---- statements -------------------------------------------------------------------------------------------

@attrs.frozen
class Assign:
    """`target op= value` (op "=", "+=", "-=", "*=")."""

    target: Read
    op: str
    value: Expr

    def lines(self) -> list[str]:
        return [f"{self.target.render()} {self.op} {self.value.render()}"]


@attrs.frozen
class Define:
    """A new temporary: `name = value`, or zeros of a shape and type (`np.zeros((N,), dtype=np.int64)`), or
    an integer conversion `(value).astype(np.int64)`."""

    name: str
    value: Expr | None = None
    zeros: tuple[Dim, ...] | None = None
    dtype: str = "float64"

    def lines(self) -> list[str]:
        if self.zeros is not None:
            shape = ", ".join(str(d) for d in self.zeros) + ("," if len(self.zeros) == 1 else "")
            return [f"{self.name} = np.zeros(({shape}), dtype=np.{self.dtype})"]
        if self.dtype != "float64":
            return [f"{self.name} = ({self.value.render()}).astype(np.{self.dtype})"]
        return [f"{self.name} = {self.value.render()}"]


@attrs.frozen
class Cond:
    """`left cmp value`: a scalar expression against a constant, or `var % 2 == 0` for a loop variable."""

    left: Expr
    cmp: str
    value: float

    def render(self) -> str:
        return f"{self.left.render()} {self.cmp} {self.value!r}"


@attrs.frozen
class For:
    var: str
    start: At
    stop: At | str  # an At, or the name of a trip count given as an argument or read from data
    step: int
    body: tuple["Stmt", ...]

    def lines(self) -> list[str]:
        stop = self.stop if isinstance(self.stop, str) else self.stop.render()
        step = "" if self.step == 1 else f", {self.step}"
        head = f"for {self.var} in range({self.start.render()}, {stop}{step}):"
        return [head, *_indent(self.body)]


@attrs.frozen
class If:
    cond: Cond
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()

    def lines(self) -> list[str]:
        out = [f"if {self.cond.render()}:", *_indent(self.then)]
        if self.orelse:
            out += ["else:", *_indent(self.orelse)]
        return out


@attrs.frozen
class Break:
    cond: Cond

    def lines(self) -> list[str]:
        return [f"if {self.cond.render()}:", "    break"]


@attrs.frozen
class While:
    """`while counter[0] < limit:` with a body and then a positive increment of the counter (a one-element
    float temporary), so the loop always ends; its trip count depends on the data."""

    counter: str
    limit: float
    increment: Expr  # added as `0.5 + increment ** 2`
    body: tuple["Stmt", ...]

    def lines(self) -> list[str]:
        tail = f"{self.counter}[0] += 0.5 + {self.increment.render()} ** 2"
        return [f"while {self.counter}[0] < {self.limit!r}:", *_indent(self.body), "    " + tail]


@attrs.frozen
class Map:
    """`for var in dace.map[0:dim]:` over element assignments: independent iterations (the grammar has each
    write only its own elements of a fresh temporary the body does not read). The twin runs it as a `range`
    loop (`plain_maps`)."""

    var: str
    dim: Dim
    body: tuple["Stmt", ...]

    def lines(self) -> list[str]:
        return [f"for {self.var} in dace.map[0:{self.dim}]:", *_indent(self.body)]


_MAP_HEAD = re.compile(r"for (\w+) in dace\.map\[([^:\]]+):([^\]]+)\]:")


def plain_maps(source: str) -> str:
    """`source` with every `for v in dace.map[a:b]:` a `for v in range(a, b):` (the twin's loops)."""
    return _MAP_HEAD.sub(r"for \1 in range(\2, \3):", source)


@attrs.frozen
class CallHelper:
    name: str
    args: tuple[str, ...]

    def lines(self) -> list[str]:
        return [f"{self.name}({', '.join(self.args)})"]


Stmt = Union[Assign, Define, For, If, Break, While, Map, CallHelper]


def _indent(body: tuple) -> list[str]:
    lines = [line for stmt in body for line in stmt.lines()] or ["pass"]
    return ["    " + line for line in lines]


# ---- programs ---------------------------------------------------------------------------------------------

@attrs.frozen
class Argument:
    """An argument: a float array (`role` "input", read and perhaps updated, or "weight", the loss's fixed
    coefficients), an integer array ("index": gather/scatter indices, "count": a trip count read from
    data), an integer scalar ("trips": a trip count argument), or the scalar output `S`."""

    name: str
    dims: tuple[Dim, ...]
    role: str
    values: tuple[int, ...] = ()  # the fixed contents of integer arguments

    @property
    def dtype(self) -> str:
        return "int64" if self.role in ("index", "count", "trips") else "float64"

    def annotation(self) -> str:
        if self.role == "trips":
            return "dace.int64"
        return f"dace.{self.dtype}[{', '.join(str(d) for d in self.dims)}]"


@attrs.frozen
class Helper:
    """A nested program: called from the main one on whole arrays (`params` name its own arguments, bound
    to arrays of the same dimensions)."""

    name: str
    params: tuple[Argument, ...]
    body: tuple[Stmt, ...]


@attrs.frozen
class Program:
    sizes: tuple[tuple[str, int], ...]  # symbol -> value
    arguments: tuple[Argument, ...]  # the last one is `S`
    body: tuple[Stmt, ...]
    loss: tuple[tuple[str, str], ...]  # (array, weight array): S[0] += np.sum(array * weight)
    helpers: tuple[Helper, ...] = ()

    @property
    def wrt(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arguments if a.role == "input")

    def symbols(self) -> dict[str, int]:
        values = dict(self.sizes)
        values.update({a.name: a.values[0] for a in self.arguments if a.role == "trips"})
        return values

    def stops(self) -> bool:
        """Whether the program stops a gradient anywhere (then second order is not checked: `fuzz.frozen`)."""
        lines = [line for helper in self.helpers for stmt in helper.body for line in stmt.lines()]
        return any("stop_gradient(" in line for line in lines + self.body_lines())

    def body_lines(self) -> list[str]:
        lines = [line for stmt in self.body for line in stmt.lines()]
        terms = " + ".join(f"np.sum({a} * {w})" for a, w in self.loss)
        if terms:
            lines.append(f"S[0] += {terms}")
        return lines

    def render(self, dace_module: bool) -> str:
        """The source of a module defining `program` (and its helpers): a DaCe program, or its numpy twin."""
        out = ["import numpy as np"]
        if self.stops():
            out.append("from gradflow import stop_gradient" if dace_module
                       else "from gradflow.verify.fuzz.frozen import stop_gradient")
        if dace_module:
            out += ["import dace", ""]
            out += [f"{name} = dace.symbol({name!r})" for name, _ in self.sizes]
        else:
            out += [""] + [f"{name} = {value}" for name, value in self.sizes]
        for helper in self.helpers:
            out += ["", ""] + _function(helper.name, helper.params, [line for s in helper.body for line in s.lines()],
                                        dace_module)
        out += ["", ""] + _function("program", self.arguments, self.body_lines(), dace_module)
        text = "\n".join(out) + "\n"
        return text if dace_module else plain_maps(text)


def _function(name: str, arguments, body: list[str], dace_module: bool) -> list[str]:
    if dace_module:
        params = ", ".join(f"{a.name}: {a.annotation()}" for a in arguments)
        head = ["@dace.program", f"def {name}({params}):"]
    else:
        head = [f"def {name}({', '.join(a.name for a in arguments)}):"]
    return head + ["    " + line for line in (body or ["pass"])]
