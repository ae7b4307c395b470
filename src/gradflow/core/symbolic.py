"""The bridge between tasklet code and SymPy.

`read_tasklet` runs the Python code of a DaCe tasklet symbolically: one SymPy expression per output
connector (branches become `Piecewise`), plus the elements it reads and writes through indices, resolving
function calls through the elementwise table (so `exp`, `math.exp` and `np.exp` all mean the table's `exp`
formula); `parse_tasklet` is its plain form (outputs only). `print_code` writes a SymPy expression back as
Python tasklet code that DaCe's code generator accepts. All are pure functions of their inputs.
"""

from __future__ import annotations

import ast
import math
from typing import Callable, Iterable, Mapping, Sequence

import attrs
import sympy
from sympy.codegen.cfunctions import expm1, log1p

from gradflow.core.elementwise import ElementwiseTable, elementwise_table
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.steps import STEP_FUNCTIONS, FloorDiv, Step
from gradflow.core.stop_gradient import SPELLING as STOP_SPELLING
from gradflow.core.stop_gradient import StopGradient

#: Calls that only change the numeric type; differentiation sees through them.
CASTS = frozenset(
    {"float", "dace.float64", "dace.float32", "dace.float16", "np.float64", "np.float32", "numpy.float64",
     "numpy.float32", "double", "dace.float64_t"}
)

#: Calls that convert to an integer type (truncating toward zero, as C does): no derivative flows through them.
INTEGER_CASTS = frozenset(
    {"int", "dace.int64", "dace.int32", "dace.int16", "dace.int8", "dace.uint64", "dace.uint32", "dace.uint16",
     "dace.uint8", "np.int64", "np.int32", "np.int16", "np.int8", "numpy.int64", "numpy.int32", "np.intc",
     "np.uint64", "np.uint32", "np.uint8", "dace.int64_t"}
)


class Truncate(Step):
    """A number converted to an integer type: truncation toward zero, derivative zero almost everywhere (as in
    torch). Printed as a conversion to int64."""

    on_floats = staticmethod(math.trunc)  # as a C conversion does


def stored_as(value: sympy.Expr, dtype) -> sympy.Expr:
    """`value` as it is after being stored in a location of DaCe type `dtype`: truncated for integers."""
    import numpy as np

    if np.dtype(dtype.type).kind in "iu":
        return Truncate(number_of(value))
    return value


class UnsupportedCode(NotDifferentiableError):
    """Tasklet code outside the differentiable subset (named in the message)."""


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _first_line(node: ast.AST) -> str:
    lines = ast.unparse(node).splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "")


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
    # Python's floor division and remainder (the divisor's sign), whose quotient is a step: d(a % b)/da = 1
    ast.FloorDiv: lambda a, b: FloorDiv(a, b),
    ast.Mod: lambda a, b: a - b * FloorDiv(a, b),
}
_CMPOPS = {
    ast.Lt: sympy.Lt, ast.LtE: sympy.Le, ast.Gt: sympy.Gt, ast.GtE: sympy.Ge, ast.Eq: sympy.Eq, ast.NotEq: sympy.Ne,
}


def verbatim(source: str, args: Sequence[sympy.Expr]) -> sympy.Expr:
    """A call of one of DaCe's integer helpers (`SYMBOLIC_HELPERS`, outside the elementwise table) whose
    arguments are SDFG symbols and numbers only, kept as written: `ceiling((N / 2))`, which DaCe's frontend
    writes for the length of a strided slice in the divisor of `np.mean`. It is constant in the code's
    inputs (derivative 0), its symbols are `args`, and `print_code` writes `source` back unchanged, so the
    differentiated program computes it as the forward does (printing it from SymPy could change its C++
    meaning: `N / 2` between integers, a `ceiling` with an integer overload only)."""
    return sympy.Function(VERBATIM + source)(*args)


#: the name prefix of `verbatim` calls
VERBATIM = "__verbatim__"
#: the pure integer helpers of DaCe's runtime (`dace/math.h`) its symbolic expressions print as: a call of
#: another unknown function, even on symbols only, could have another value each time it runs
SYMBOLIC_HELPERS = frozenset({"ceiling", "int_ceil", "int_floor", "py_floor", "py_mod"})


class _ExprReader:
    def __init__(self, env: Mapping[str, sympy.Expr], table: ElementwiseTable, where: str,
                 types: Mapping[str, object] | None = None, constants: Iterable[str] = ()) -> None:
        self.env = env
        self.table = table
        self.where = where
        self.types = types or {}  # connector -> DaCe type, where the caller knows it (`decltype(conn)(v)`)
        self.constants = frozenset(constants)  # the SDFG symbols and map parameters the code may read
        # reads `conn[index]`; set by the statement interpreter
        self.element: Callable[[ast.Subscript], sympy.Symbol] | None = None
        self.statement: ast.stmt | None = None  # the statement being read (named in errors)

    def fail(self, node: ast.AST, why: str, hint: str | None = None) -> UnsupportedCode:
        what = f"'{_first_line(node)}'"
        if self.statement is not None and self.statement is not node:
            what += f" in the statement '{_first_line(self.statement)}'"
        return UnsupportedCode(
            f"{self.where}: cannot differentiate {what}: {why}",
            hint or "rewrite the tasklet with arithmetic and functions of rules/elementwise.toml, or add the "
                    "function there",
        )

    def read(self, node: ast.AST) -> sympy.Expr:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                return sympy.true if node.value else sympy.false
            if isinstance(node.value, (int, float)):
                return sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(node.value, 17)
            raise self.fail(node, "non-numeric constant")
        if isinstance(node, ast.Name):
            if node.id in self.env:
                value = self.env[node.id]
                if _has_unassigned(value):
                    raise self.fail(node, f"'{node.id}' is read on a path where it is not assigned")
                return value
            if node.id in ("True", "False"):
                return sympy.true if node.id == "True" else sympy.false
            raise self.fail(node, f"unknown name '{node.id}'")
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name in ("math.pi", "np.pi", "numpy.pi", "dace.math.pi"):
                return sympy.pi
            if name in ("math.e", "np.e", "numpy.e"):
                return sympy.E
            raise self.fail(node, f"unknown attribute '{name}'")
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise self.fail(node, f"operator {type(node.op).__name__} is not differentiable")
            # a truth value in arithmetic is the number 1 or 0, as in Python (`(x == m) * g`)
            return op(number_of(self.read(node.left)), number_of(self.read(node.right)))
        if isinstance(node, ast.UnaryOp):
            operand = self.read(node.operand)
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return operand
            if isinstance(node.op, ast.Not):
                return sympy.Not(operand)
            raise self.fail(node, "unsupported unary operator")
        if isinstance(node, ast.Compare):
            parts = []
            left = self.read(node.left)
            for cmpop, comp in zip(node.ops, node.comparators):
                right = self.read(comp)
                if type(cmpop) not in _CMPOPS:
                    raise self.fail(node, "unsupported comparison")
                parts.append(_CMPOPS[type(cmpop)](left, right))
                left = right
            return sympy.And(*parts) if len(parts) > 1 else parts[0]
        if isinstance(node, ast.BoolOp):
            values = [self.read(v) for v in node.values]
            return sympy.And(*values) if isinstance(node.op, ast.And) else sympy.Or(*values)
        if isinstance(node, ast.IfExp):
            return _select(_truth(self.read(node.test)), self.read(node.body), self.read(node.orelse))
        if isinstance(node, ast.Subscript) and self.element is not None:
            return self.element(node)
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            args = [self.read(a) for a in node.args]
            if node.keywords:
                raise self.fail(node, "keyword arguments")
            if isinstance(node.func, ast.Call) and len(args) == 1:
                return self._conversion(node, args[0])
            if name in CASTS and len(args) == 1:
                return args[0]
            if name in INTEGER_CASTS and len(args) == 1:
                return Truncate(number_of(args[0]))
            if name == STOP_SPELLING and len(args) == 1:
                return StopGradient(args[0])
            entry = self.table.by_spelling.get(name or "")
            if entry is None and self._of_symbols_only(node):
                return verbatim(ast.unparse(node), sorted(set().union(*(a.free_symbols for a in args)), key=str))
            if entry is None:
                raise self.fail(node, f"function '{name}' is not in rules/elementwise.toml")
            if name in ("min", "max", "np.minimum", "np.maximum") and len(args) > 2:
                fn = sympy.Min if "min" in name else sympy.Max
                return fn(*args)
            if len(args) != len(entry.args):
                raise self.fail(node, f"'{name}' takes {len(entry.args)} argument(s)")
            return entry.apply(*args)
        raise self.fail(node, f"unsupported syntax {type(node).__name__}")

    def _of_symbols_only(self, node: ast.Call) -> bool:
        """Whether the call is one of DaCe's integer helpers and every name in its arguments is an SDFG
        symbol (or map parameter) the code has not reassigned: it is then constant in the code's inputs."""
        names = [n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)]
        return bool(node.args) and isinstance(node.func, ast.Name) and node.func.id in SYMBOLIC_HELPERS and all(
            n in self.constants and self.env.get(n) == sympy.Symbol(n) for n in names)

    def _conversion(self, node: ast.Call, value: sympy.Expr) -> sympy.Expr:
        """`decltype(conn)(value)`, C++'s conversion to a connector's type, which DaCe's frontend writes (in
        `np.arange`'s tasklet, for one): the value itself for a floating-point connector, truncated for an
        integer one; a constant needs no type."""
        func = node.func
        assert isinstance(func, ast.Call)
        if not (_dotted(func.func) == "decltype" and len(func.args) == 1 and isinstance(func.args[0], ast.Name)):
            raise self.fail(node, "a call of a call's result")
        conn = func.args[0].id
        dtype = self.types.get(conn)
        kind = _number_kind(dtype)
        if kind in ("f", "i", "u"):
            return stored_as(value, dtype)
        if kind is None and isinstance(value, sympy.Number):
            return value
        raise self.fail(node, f"a conversion to the type of '{conn}', which is not known to be a number")


def _number_kind(dtype) -> str | None:
    """numpy's kind letter of a DaCe connector type ('f', 'i', 'u', ...); None where it has none (untyped,
    a pointer)."""
    import numpy as np

    try:
        return np.dtype(dtype.type).kind
    except (AttributeError, TypeError):
        return None


#: Prefix of the symbol that stands for "not assigned here" (see `unassigned`).
UNASSIGNED = "__unassigned_"


def unassigned(name: str) -> sympy.Symbol:
    """The value of `name` on paths of the code that do not assign it. In an output's expression it means:
    the memory the output connector writes keeps what it held (a dynamic memlet), or receives nothing (a
    write-conflict sum); any other use of it is an error the reader reports."""
    return sympy.Symbol(UNASSIGNED + name, real=True)


def _has_unassigned(expr: sympy.Basic) -> bool:
    return any(s.name.startswith(UNASSIGNED) for s in expr.free_symbols)


@attrs.frozen
class Element:
    """An element of an array connector that the code indexes, `conn[index]` (index in the connector's
    coordinates, over connector symbols and constants)."""

    conn: str
    index: tuple[sympy.Expr, ...]


@attrs.frozen
class IndexedWrite:
    """`conn[index] = value`, executed when `condition` holds (`sympy.true` outside any `if`)."""

    element: Element
    value: sympy.Expr
    condition: sympy.Basic


@attrs.frozen
class TaskletMeaning:
    """What a tasklet computes, as SymPy over one real symbol per input connector.

    `outputs`: the value of every output connector the code assigns as a whole; where some path leaves it
    unassigned the value holds `unassigned(conn)` (as a branch of a `Piecewise`). `reads`: the symbol
    standing for each element read through an index (`x = arr[j]`), deduplicated. `writes`: the writes
    through an index (`arr[j] = v`), in program order.
    """

    outputs: dict[str, sympy.Expr]
    reads: dict[sympy.Symbol, Element]
    writes: tuple[IndexedWrite, ...]


def _is_truth(value: sympy.Basic) -> bool:
    """Whether `value` is a truth value (a comparison, a logical formula, true/false); a Symbol is not, though
    SymPy counts it as Boolean too."""
    return isinstance(value, (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanFunction,
                              sympy.logic.boolalg.BooleanAtom))


def number_of(value: sympy.Basic) -> sympy.Expr:
    """A truth value as the number 1 or 0 (what `int(x > 0)` reads); other values as they are."""
    return sympy.Piecewise((1, value), (0, True)) if _is_truth(value) else value


def _truth(value: sympy.Basic) -> sympy.Basic:
    """Python's truth value of `value` (`if x:` means `x != 0` for a number)."""
    if _is_truth(value):
        return value
    return sympy.Ne(value, 0)


def _select(test: sympy.Basic, a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    """`a if test else b`: a Boolean when both are truth values (a flag set in a branch, `ok = False`, can
    then be tested again, which SymPy refuses for a Piecewise), else a Piecewise."""
    if _is_truth(a) and _is_truth(b):
        return sympy.ITE(test, a, b)
    return sympy.Piecewise((a, test), (b, True))


#: annotations of a local's declaration without a value that leave later assignments exact
_FLOAT_TYPES = frozenset({"float", "float16", "float32", "float64", "double"})


class _Interpreter:
    """Runs tasklet statements symbolically: an environment of SymPy values, branches merged as Piecewise."""

    def __init__(self, reader: "_ExprReader", inputs: set[str], outputs: set[str]) -> None:
        self.reader = reader
        self.inputs = inputs
        self.outputs = outputs
        self.reads: dict[sympy.Symbol, Element] = {}
        self.writes: list[IndexedWrite] = []
        reader.element = self._element

    def fail(self, node: ast.AST, why: str, hint: str | None = None) -> UnsupportedCode:
        return self.reader.fail(node, why, hint)

    def _element(self, node: ast.Subscript) -> sympy.Symbol:
        """The symbol of an element read through an index, `conn[index]`."""
        if not (isinstance(node.value, ast.Name) and node.value.id in self.inputs):
            raise self.fail(node, "only input connectors can be indexed")
        element = Element(node.value.id, self._index(node))
        for symbol, known in self.reads.items():
            if known == element:
                return symbol
        symbol = sympy.Symbol(f"__elem{len(self.reads)}_{node.value.id}", real=True)
        self.reads[symbol] = element
        return symbol

    def _index(self, node: ast.Subscript) -> tuple[sympy.Expr, ...]:
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if any(isinstance(p, ast.Slice) for p in parts):
            raise self.fail(node, "a slice inside a tasklet")
        return tuple(self.reader.read(p) for p in parts)

    def run(self, body: list[ast.stmt], env: dict[str, sympy.Expr], condition: sympy.Basic) -> dict:
        for stmt in body:
            env = self.statement(stmt, env, condition)
        return env

    def statement(self, stmt: ast.stmt, env: dict, condition: sympy.Basic) -> dict:
        self.reader.env = env
        self.reader.statement = stmt
        if isinstance(stmt, ast.Pass):
            return env
        if isinstance(stmt, ast.Expr):
            self.bare(stmt)
            return env
        if isinstance(stmt, ast.If):
            return self.branch(stmt, env, condition)
        if isinstance(stmt, ast.AugAssign):
            if not isinstance(stmt.target, ast.Name):
                raise self.fail(stmt, "augmented assignment through an index (write `a[j] = a[j] + v`, or use a "
                                      "write-conflict sum)")
            value = ast.BinOp(ast.Name(stmt.target.id, ast.Load()), stmt.op, stmt.value)
            return self.assign([stmt.target], value, env, condition, stmt)
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            return self.assign([stmt.target], stmt.value, env, condition, stmt)
        if isinstance(stmt, ast.AnnAssign) and (_dotted(stmt.annotation) or "").split(".")[-1] in _FLOAT_TYPES:
            return env  # `x: dace.float64` declares a floating-point local: nothing is assigned
        if isinstance(stmt, ast.Assign):
            return self.assign(stmt.targets, stmt.value, env, condition, stmt)
        raise self.fail(stmt, f"{type(stmt).__name__} statements are not supported in a tasklet")

    def bare(self, stmt: ast.Expr) -> None:
        """A bare expression: dead code when it only computes (its value is discarded)."""
        if isinstance(stmt.value, ast.Constant):
            return  # docstring / comment literal
        for call in (n for n in ast.walk(stmt.value) if isinstance(n, ast.Call)):
            name = _dotted(call.func) or ""
            if name not in CASTS | INTEGER_CASTS and name not in self.reader.table.by_spelling:
                raise self.fail(stmt, f"the statement calls '{name}' for its effect, which gradflow cannot see into "
                                      "(DaCe turns numpy functions it has no native version of into Python callbacks)",
                                "use a numpy function DaCe implements natively (for a product: np.prod or "
                                "np.multiply.reduce once gradflow is imported), or compute the value in the program")
        self.reader.read(stmt.value)  # checks that it is well formed; the value is dead

    def branch(self, stmt: ast.If, env: dict, condition: sympy.Basic) -> dict:
        test = _truth(self.reader.read(stmt.test))
        taken = self.run(stmt.body, dict(env), sympy.And(condition, test))
        other = self.run(stmt.orelse, dict(env), sympy.And(condition, sympy.Not(test)))
        merged = {}
        for name in {**taken, **other}:
            a, b = taken.get(name), other.get(name)
            if a is not None and b is not None and (a is b or a == b):
                merged[name] = a
                continue
            a = unassigned(name) if a is None else a
            b = unassigned(name) if b is None else b
            merged[name] = _select(test, a, b)
        return merged

    def assign(self, targets: list[ast.expr], value_node: ast.expr, env: dict, condition: sympy.Basic,
               stmt: ast.stmt) -> dict:
        if len(targets) != 1:
            raise self.fail(stmt, "chained assignment (DaCe's code generator does not compile it either)")
        target, value = targets[0], self.reader.read(value_node)
        if isinstance(target, ast.Name):
            if target.id in self.inputs:
                raise self.fail(stmt, f"assigns the input connector '{target.id}'")
            env[target.id] = value
            return env
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in self.outputs:
            self.writes.append(IndexedWrite(Element(target.value.id, self._index(target)), value, condition))
            return env
        raise self.fail(stmt, "only assignments to names and to indexed output connectors are supported")


def read_tasklet(
    code: str,
    inputs: Iterable[str],
    outputs: Iterable[str],
    where: str = "tasklet",
    table: ElementwiseTable | None = None,
    constants: Iterable[str] = (),
) -> TaskletMeaning:
    """The meaning of tasklet code (see `TaskletMeaning`); `UnsupportedCode` names the statement it cannot read.

    Statements: assignments (plain, augmented, annotated), `if`/`elif`/`else` (values merged as `Piecewise`;
    Python's truth value for a non-boolean test), ternaries, `pass`,
    bare expressions (dead code, unless they call something other than an elementwise function), reads
    `conn[j]` of an indexed input connector and writes `conn[j] = v` of an output connector; conversions
    `int(v)`, `float(v)`, `decltype(conn)(v)` (by the connector's type, where `inputs`/`outputs` map connectors
    to types, as a node's connector dictionaries do). A name may be
    assigned many times; reading a name on a path where it is not assigned is an error. `constants` are names
    the code may read that are not connectors (SDFG symbols, map parameters): they become symbols too, but no
    gradient flows to them.
    """
    table = table or elementwise_table()
    ins, outs = set(inputs), set(outputs)
    types = {**(dict(inputs) if isinstance(inputs, Mapping) else {}),
             **(dict(outputs) if isinstance(outputs, Mapping) else {})}
    env: dict[str, sympy.Expr] = {name: sympy.Symbol(name) for name in constants}
    env.update({name: sympy.Symbol(name, real=True) for name in ins})
    try:
        tree = ast.parse(code.strip())
    except SyntaxError as exc:
        raise UnsupportedCode(f"{where}: tasklet code does not parse as Python: {exc}") from None
    reader = _ExprReader(env, table, where, types, constants)
    interpreter = _Interpreter(reader, ins, outs)
    env = interpreter.run(tree.body, env, sympy.true)
    result = {name: value for name, value in env.items() if name in outs}
    return TaskletMeaning(result, dict(interpreter.reads), tuple(interpreter.writes))


def parse_tasklet(
    code: str,
    inputs: Iterable[str],
    outputs: Iterable[str],
    where: str = "tasklet",
    table: ElementwiseTable | None = None,
    constants: Iterable[str] = (),
) -> dict[str, sympy.Expr]:
    """One SymPy expression (over real symbols named like the input connectors) per assigned output, for
    code that neither indexes connectors nor leaves an output unassigned on some path (`read_tasklet`
    handles those)."""
    meaning = read_tasklet(code, inputs, outputs, where, table, constants)
    if meaning.reads or meaning.writes:
        raise UnsupportedCode(f"{where}: the code indexes array connectors")
    for name, value in meaning.outputs.items():
        if _has_unassigned(value):
            raise UnsupportedCode(f"{where}: output '{name}' is not assigned on every path of the code")
    return meaning.outputs


class _SplitTies:
    """A min or max of three or more values whose derivative splits equally among the arguments equal to
    the result: 1/k to each of k ties. SymPy's own, `Heaviside(x - Max(others))`, gives 1/2 to every tie
    whatever k, so a three-way tie passed on 3/2 of the gradient; `np.minimum(a, np.minimum(a, b))` fused
    into one tasklet is `Min(a, a', b)` (two reads of one element), whose ties with `b` are the rule there,
    not the exception, wherever `b` holds a copy of `a` (fuzz seed 16567, program 88). Any split that sums
    to 1 is the derivative wherever the min is differentiable (tied arguments then have equal gradients);
    two arguments keep SymPy's Heaviside form (1/2 each at a tie, torch's convention)."""

    plain: type
    args: tuple

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        result = self.plain(*self.args)
        mine = self.args[argindex - 1]
        # the ties counted as 1 + the other arguments equal to the result: never 0, even where SymPy folds the
        # sum into pieces under conditions that cannot hold together (a 1/0 there is `zoo`, no tasklet code)
        others = [sympy.Piecewise((1, sympy.Eq(a, result)), (0, True)) for k, a in enumerate(self.args)
                  if k != argindex - 1]
        return sympy.Piecewise((1 / (1 + sympy.Add(*others)), sympy.Eq(mine, result)), (0, True))


class _SplitMin(_SplitTies, sympy.Function):
    plain = sympy.Min


class _SplitMax(_SplitTies, sympy.Function):
    plain = sympy.Max


class _RealAbs(sympy.Function):
    """`Abs` of a value the program computes in real arithmetic: its derivative is `sign(u) du`. SymPy gives
    `Abs(u)` of an argument it cannot prove real (`acos(0.855 tanh(x))`, complex beyond [-1, 1]) a derivative
    through `re`, `im` and `atan2`, which no tasklet prints; the tasklet computes a real `u` (or NaN)."""

    plain = sympy.Abs

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return _RealSign(self.args[0])


class _RealSign(sympy.Function):
    """`sign` of a real value: a step, derivative 0 (almost everywhere), whatever SymPy can prove."""

    plain = sympy.sign

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return sympy.Integer(0)


def _as_real(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with `Abs` and `sign` of arguments SymPy does not know to be real as `_RealAbs` / `_RealSign`."""
    def unproven(e: sympy.Basic) -> bool:
        return isinstance(e, (sympy.Abs, sympy.sign)) and e.args[0].is_extended_real is not True
    return expr.replace(unproven, lambda e: (_RealAbs if isinstance(e, sympy.Abs) else _RealSign)(*e.args))


def _plain(expr: sympy.Expr) -> sympy.Expr:
    """The inverse of `_as_real` and `_with_split_ties`: SymPy's own functions again."""
    return expr.replace(lambda e: isinstance(e, (_RealAbs, _RealSign, _SplitMin, _SplitMax)),
                        lambda e: e.plain(*e.args))


def _with_split_ties(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with every min and max of three or more arguments as `_SplitMin` / `_SplitMax`."""
    return expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)) and len(e.args) > 2,
                        lambda e: (_SplitMin if isinstance(e, sympy.Min) else _SplitMax)(*e.args))


def derivative(expr: sympy.Expr, wrt: sympy.Symbol) -> sympy.Expr:
    """d expr / d wrt, with distributions (DiracDelta) replaced by their almost-everywhere value 0; a truth
    value (`a == b` stored as a number, as gradients of `max` are) is a step, whose derivative is 0; a min or
    max of three or more values splits its derivative among ties (`_SplitTies`); `abs` and `sign` are of
    real values (`_RealAbs`)."""
    expr = number_of(expr)
    rewritten = expr
    if expr.has(sympy.Min, sympy.Max):
        rewritten = _with_split_ties(rewritten)
    if expr.has(sympy.Abs, sympy.sign):
        rewritten = _as_real(rewritten)
    if rewritten != expr:
        return _finished(_plain(sympy.diff(rewritten, wrt)), expr, wrt)
    return _finished(sympy.diff(expr, wrt), expr, wrt)


def _finished(d: sympy.Expr, expr: sympy.Expr, wrt: sympy.Symbol) -> sympy.Expr:
    if d.has(sympy.DiracDelta):
        d = d.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.Integer(0))
    if d.has(sympy.Derivative):
        raise NotDifferentiableError(f"SymPy cannot differentiate {expr} with respect to {wrt}")
    return sympy.powsimp(d)


class _Printer:
    """SymPy -> Python source that DaCe's tasklet code generator accepts.

    With `single`, every non-integer literal is written as a float32 value (`dace.float32(0.5)`) and
    elementary functions as DaCe's float32 overloads (`math.exp(dace.float32(x))`): a bare `0.5` or
    `1.0` is a C++ double and an unqualified `exp` is C's double function, which make a float32
    program's element arithmetic double precision (twice as slow, unvectorizable). Integers stay
    integers.
    """

    def __init__(self, single: bool = False) -> None:
        self.single = single

    def _float(self, value: float) -> str:
        text = repr(float(value))
        return f"dace.float32({text})" if self.single else text

    FUNCS = {
        sympy.exp: "exp", sympy.log: "log", sympy.sin: "sin", sympy.cos: "cos", sympy.tan: "tan",
        sympy.sinh: "sinh", sympy.cosh: "cosh", sympy.tanh: "tanh", sympy.asin: "asin", sympy.acos: "acos",
        sympy.atan: "atan", sympy.atan2: "atan2", sympy.asinh: "asinh", sympy.acosh: "acosh", sympy.atanh: "atanh",
        sympy.Abs: "abs", sympy.sign: "sign", sympy.erf: "erf", log1p: "log1p",
        expm1: "expm1", **{f: f.c_name for f in STEP_FUNCTIONS.values()}, StopGradient: STOP_SPELLING,
    }
    #: functions DaCe's `math.` spelling compiles to its type-generic overloads (`dace::math::exp`)
    MATH = frozenset({"exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "erf",
                      "log1p", "expm1"})

    def __call__(self, e: sympy.Basic) -> str:
        if isinstance(e, sympy.Symbol):
            return e.name
        if e is sympy.true:
            return "True"
        if e is sympy.false:
            return "False"
        if isinstance(e, sympy.Integer):
            return f"{int(e)}"
        if isinstance(e, (sympy.Rational, sympy.Float)) or e.is_number and e.is_real:
            return self._float(float(e))
        if isinstance(e, sympy.Add):
            terms = [self(a) for a in e.as_ordered_terms()]
            return "(" + " + ".join(terms) + ")"
        if isinstance(e, sympy.Mul):
            num: list[sympy.Basic] = []
            den: list[sympy.Basic] = []
            for f in e.as_ordered_factors():
                if isinstance(f, sympy.Pow) and f.exp.is_number and f.exp < 0:
                    den.append(sympy.Pow(f.base, -f.exp))
                elif f == -1:
                    num.insert(0, sympy.Integer(-1))
                else:
                    num.append(f)
            top = " * ".join(self(f) for f in num) if num else self._float(1.0)
            if den:
                return f"({top} / ({' * '.join(self(f) for f in den)}))"
            return f"({top})"
        if isinstance(e, sympy.Pow):
            base, exp = e.base, e.exp
            root = f"math.sqrt(dace.float32({self(base)}))" if self.single else f"sqrt({self(base)})"
            if exp == sympy.Rational(1, 2):
                return root
            if exp == -1:
                return f"({self._float(1.0)} / {self(base)})"
            if exp == sympy.Rational(-1, 2):
                return f"({self._float(1.0)} / {root})"
            if exp == 2:
                b = self(base)
                return f"({b} * {b})"
            return f"({self(base)} ** {self(exp)})"
        if isinstance(e, sympy.Min) or isinstance(e, sympy.Max):
            fn = "min" if isinstance(e, sympy.Min) else "max"
            args = [self(a) for a in e.args]
            out = args[0]
            for a in args[1:]:
                out = f"{fn}({out}, {a})"
            return out
        if isinstance(e, sympy.Heaviside):
            x = self(e.args[0])
            half = e.args[1] if len(e.args) > 1 else sympy.Rational(1, 2)
            return f"({self._float(1.0)} if {x} > 0 else ({self(half)} if {x} == 0 else {self._float(0.0)}))"
        if isinstance(e, sympy.Piecewise):
            code: str | None = None
            for value, cond in reversed(e.args):
                if code is None or cond is sympy.true:
                    code = self(value)
                else:
                    code = f"({self(value)} if {self(cond)} else {code})"
            assert code is not None  # SymPy makes no Piecewise without a piece
            return code
        if isinstance(e, sympy.core.relational.Relational):
            return f"({self(e.lhs)} {e.rel_op} {self(e.rhs)})"
        if isinstance(e, sympy.And):
            return "(" + " and ".join(self(a) for a in e.args) + ")"
        if isinstance(e, sympy.Or):
            return "(" + " or ".join(self(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(not {self(e.args[0])})"
        if isinstance(e, Truncate):
            return f"dace.int64({self(e.args[0])})"
        if isinstance(e, sympy.core.function.AppliedUndef) and type(e).__name__.startswith(VERBATIM):
            return type(e).__name__[len(VERBATIM):]
        if isinstance(e, sympy.ITE):  # SymPy's own form of some merged truth values (see `_select`)
            test, a, b = (self(v) for v in e.args)
            return f"({a} if {test} else {b})"
        func = self.FUNCS.get(type(e))
        if func is not None:
            if self.single and func in self.MATH:
                # unqualified `exp` is C's double function; `math.exp` is DaCe's overload by argument type
                return f"math.{func}({', '.join(f'dace.float32({self(a)})' for a in e.args)})"
            return f"{func}({', '.join(self(a) for a in e.args)})"
        raise NotDifferentiableError(f"cannot print {e} ({type(e).__name__}) as tasklet code")


print_code = _Printer()
#: `print_code` for float32 programs: literals as float32 values
print_code_single = _Printer(single=True)


def assignments_code(assignments: Sequence[tuple[str, sympy.Expr]], cse: bool = True, single: bool = False,
                     reserved: Iterable[str] = ()) -> str:
    """Tasklet code assigning each expression to its name, sharing common subexpressions (`single`: for a
    float32 tasklet, see `_Printer`). The subexpressions' names avoid `reserved` (the names of code the
    lines will share a tasklet with: DaCe declares a name's C++ type at its first assignment, so a `__cse1`
    first a truth value and then a number would keep the number as a bool)."""
    printer = print_code_single if single else print_code
    names = [n for n, _ in assignments]
    exprs = [e for _, e in assignments]
    lines = []
    if cse and exprs:
        taken = set(names) | set(reserved)
        symbols = (sympy.Symbol(f"__cse{i}", real=True) for i in range(10**6))
        replacements, reduced = sympy.cse(exprs, symbols=(s for s in symbols if s.name not in taken))
        for sym, value in replacements:
            lines.append(f"{sym.name} = {printer(value)}")
        exprs = reduced
    for name, expr in zip(names, exprs):
        lines.append(f"{name} = {printer(expr)}")
    return "\n".join(lines)
