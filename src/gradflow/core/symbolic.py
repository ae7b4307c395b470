"""The bridge between tasklet code and SymPy.

`parse_tasklet` reads the Python code of a DaCe tasklet into one SymPy expression per output connector,
resolving function calls through the elementwise table (so `exp`, `math.exp` and `np.exp` all mean the
table's `exp` formula). `print_code` writes a SymPy expression back as Python tasklet code that DaCe's
code generator accepts. Both are pure functions of their inputs.
"""

from __future__ import annotations

import ast
from typing import Iterable, Mapping, Sequence

import sympy
from sympy.codegen.cfunctions import expm1, log1p

from gradflow.core.elementwise import ElementwiseTable, elementwise_table
from gradflow.core.errors import NotDifferentiableError

#: Calls that only change the numeric type; differentiation sees through them.
CASTS = frozenset(
    {"float", "dace.float64", "dace.float32", "dace.float16", "np.float64", "np.float32", "numpy.float64",
     "numpy.float32", "double", "dace.float64_t"}
)


class UnsupportedCode(NotDifferentiableError):
    """Tasklet code outside the differentiable subset (named in the message)."""


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_CMPOPS = {
    ast.Lt: sympy.Lt, ast.LtE: sympy.Le, ast.Gt: sympy.Gt, ast.GtE: sympy.Ge, ast.Eq: sympy.Eq, ast.NotEq: sympy.Ne,
}


class _ExprReader:
    def __init__(self, env: Mapping[str, sympy.Expr], table: ElementwiseTable, where: str) -> None:
        self.env = env
        self.table = table
        self.where = where

    def fail(self, node: ast.AST, why: str) -> UnsupportedCode:
        return UnsupportedCode(
            f"{self.where}: cannot differentiate '{ast.unparse(node)}': {why}",
            "rewrite the tasklet with arithmetic and functions of rules/elementwise.toml, or add the function there",
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
                return self.env[node.id]
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
            return op(self.read(node.left), self.read(node.right))
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
            for op, comp in zip(node.ops, node.comparators):
                right = self.read(comp)
                if type(op) not in _CMPOPS:
                    raise self.fail(node, "unsupported comparison")
                parts.append(_CMPOPS[type(op)](left, right))
                left = right
            return sympy.And(*parts) if len(parts) > 1 else parts[0]
        if isinstance(node, ast.BoolOp):
            values = [self.read(v) for v in node.values]
            return sympy.And(*values) if isinstance(node.op, ast.And) else sympy.Or(*values)
        if isinstance(node, ast.IfExp):
            return sympy.Piecewise((self.read(node.body), self.read(node.test)), (self.read(node.orelse), True))
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            args = [self.read(a) for a in node.args]
            if node.keywords:
                raise self.fail(node, "keyword arguments")
            if name in CASTS and len(args) == 1:
                return args[0]
            entry = self.table.by_spelling.get(name or "")
            if entry is None:
                raise self.fail(node, f"function '{name}' is not in rules/elementwise.toml")
            if name in ("min", "max", "np.minimum", "np.maximum") and len(args) > 2:
                fn = sympy.Min if "min" in name else sympy.Max
                return fn(*args)
            if len(args) != len(entry.args):
                raise self.fail(node, f"'{name}' takes {len(entry.args)} argument(s)")
            return entry.apply(*args)
        raise self.fail(node, f"unsupported syntax {type(node).__name__}")


def parse_tasklet(
    code: str,
    inputs: Iterable[str],
    outputs: Iterable[str],
    where: str = "tasklet",
    table: ElementwiseTable | None = None,
    constants: Iterable[str] = (),
) -> dict[str, sympy.Expr]:
    """One SymPy expression (over real symbols named like the input connectors) per assigned output.

    `constants` are names the code may read that are not connectors (SDFG symbols, map parameters): they
    become symbols too, but no gradient flows to them.
    """
    table = table or elementwise_table()
    env: dict[str, sympy.Expr] = {name: sympy.Symbol(name) for name in constants}
    env.update({name: sympy.Symbol(name, real=True) for name in inputs})
    outs = set(outputs)
    try:
        tree = ast.parse(code.strip())
    except SyntaxError as exc:
        raise UnsupportedCode(f"{where}: tasklet code does not parse as Python: {exc}") from None
    reader = _ExprReader(env, table, where)
    result: dict[str, sympy.Expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring / comment literal
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            stmt = ast.Assign(targets=[ast.Name(stmt.target.id)], value=ast.BinOp(ast.Name(stmt.target.id), stmt.op, stmt.value))
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            raise reader.fail(stmt, "only assignments to names are supported")
        value = reader.read(stmt.value)
        target = stmt.targets[0].id
        env[target] = value
        if target in outs:
            result[target] = value
    return result


def derivative(expr: sympy.Expr, wrt: sympy.Symbol) -> sympy.Expr:
    """d expr / d wrt, with distributions (DiracDelta) replaced by their almost-everywhere value 0."""
    d = sympy.diff(expr, wrt)
    if d.has(sympy.DiracDelta):
        d = d.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.Integer(0))
    if d.has(sympy.Derivative):
        raise NotDifferentiableError(f"SymPy cannot differentiate {expr} with respect to {wrt}")
    return sympy.powsimp(d)


class _Printer:
    """SymPy -> Python source that DaCe's tasklet code generator accepts."""

    FUNCS = {
        sympy.exp: "exp", sympy.log: "log", sympy.sin: "sin", sympy.cos: "cos", sympy.tan: "tan",
        sympy.sinh: "sinh", sympy.cosh: "cosh", sympy.tanh: "tanh", sympy.asin: "asin", sympy.acos: "acos",
        sympy.atan: "atan", sympy.Abs: "abs", sympy.sign: "sign", sympy.erf: "erf", log1p: "log1p",
        expm1: "expm1",
    }

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
            return repr(float(e))
        if isinstance(e, sympy.Add):
            terms = [self(a) for a in e.as_ordered_terms()]
            return "(" + " + ".join(terms) + ")"
        if isinstance(e, sympy.Mul):
            num, den = [], []
            for f in e.as_ordered_factors():
                if isinstance(f, sympy.Pow) and f.exp.is_number and f.exp < 0:
                    den.append(sympy.Pow(f.base, -f.exp))
                elif f == -1:
                    num.insert(0, sympy.Integer(-1))
                else:
                    num.append(f)
            top = " * ".join(self(f) for f in num) if num else "1.0"
            if den:
                return f"({top} / ({' * '.join(self(f) for f in den)}))"
            return f"({top})"
        if isinstance(e, sympy.Pow):
            base, exp = e.base, e.exp
            if exp == sympy.Rational(1, 2):
                return f"sqrt({self(base)})"
            if exp == -1:
                return f"(1.0 / {self(base)})"
            if exp == sympy.Rational(-1, 2):
                return f"(1.0 / sqrt({self(base)}))"
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
            return f"(1.0 if {x} > 0 else ({self(half)} if {x} == 0 else 0.0))"
        if isinstance(e, sympy.Piecewise):
            out = None
            for value, cond in reversed(e.args):
                if out is None or cond is sympy.true:
                    out = self(value)
                else:
                    out = f"({self(value)} if {self(cond)} else {out})"
            return out
        if isinstance(e, sympy.core.relational.Relational):
            return f"({self(e.lhs)} {e.rel_op} {self(e.rhs)})"
        if isinstance(e, sympy.And):
            return "(" + " and ".join(self(a) for a in e.args) + ")"
        if isinstance(e, sympy.Or):
            return "(" + " or ".join(self(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(not {self(e.args[0])})"
        fn = self.FUNCS.get(type(e))
        if fn is not None:
            return f"{fn}({', '.join(self(a) for a in e.args)})"
        raise NotDifferentiableError(f"cannot print {e} ({type(e).__name__}) as tasklet code")


print_code = _Printer()


def assignments_code(assignments: Sequence[tuple[str, sympy.Expr]], cse: bool = True) -> str:
    """Tasklet code assigning each expression to its name, sharing common subexpressions."""
    names = [n for n, _ in assignments]
    exprs = [e for _, e in assignments]
    lines = []
    if cse and exprs:
        taken = set(names)
        symbols = (sympy.Symbol(f"__cse{i}", real=True) for i in range(10**6))
        replacements, reduced = sympy.cse(exprs, symbols=(s for s in symbols if s.name not in taken))
        for sym, value in replacements:
            lines.append(f"{sym.name} = {print_code(value)}")
        exprs = reduced
    for name, expr in zip(names, exprs):
        lines.append(f"{name} = {print_code(expr)}")
    return "\n".join(lines)
