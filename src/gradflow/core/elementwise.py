"""The elementwise function table (`rules/elementwise.toml`) as frozen records with SymPy formulas.

The same record drives tasklet differentiation (a call spelled `exp(...)` in a tasklet means `formula`),
the lowering of elementwise ONNX ops, and the property tests (values drawn from `domain`, kept away from
the `kinks` where the function is not differentiable).
"""

from __future__ import annotations

import ast
import functools
import keyword
from pathlib import Path
from typing import Any, Mapping

import attrs
import sympy
from sympy.codegen.cfunctions import expm1, log1p

from gradflow.core.errors import RuleTableError
from gradflow.core.steps import STEP_FUNCTIONS
from gradflow.core.tables import load_entries, rules_dir

#: The names a formula may use besides its arguments.
FORMULA_NAMESPACE: Mapping[str, Any] = {
    "exp": sympy.exp, "log": sympy.log, "sqrt": sympy.sqrt,
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh,
    "asin": sympy.asin, "acos": sympy.acos, "atan": sympy.atan, "atan2": sympy.atan2,
    "asinh": sympy.asinh, "acosh": sympy.acosh, "atanh": sympy.atanh,
    "Abs": sympy.Abs, "sign": sympy.sign, "Min": sympy.Min, "Max": sympy.Max,
    "erf": sympy.erf, "log1p": log1p, "expm1": expm1, "pi": sympy.pi, "E": sympy.E,
    "Piecewise": sympy.Piecewise, **STEP_FUNCTIONS,
}

DEFAULT_DOMAIN = (-3.0, 3.0)


_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant, ast.Load,
                  ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd, ast.Tuple, ast.Compare,
                  ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)


def _check_grammar(text: str, args: tuple[str, ...]) -> ast.Expression:
    """Formulas are arithmetic over the arguments and the namespace's functions, nothing else: checked on
    the syntax tree before anything evaluates it. Returns the tree."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"formula '{text}' does not parse: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"formula '{text}' uses {type(node).__name__}; formulas are arithmetic, comparisons "
                             f"and calls of {', '.join(sorted(FORMULA_NAMESPACE))}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise ValueError(f"formula '{text}' has the non-numeric constant {node.value!r}")
        if isinstance(node, ast.Name) and node.id not in args and node.id not in FORMULA_NAMESPACE:
            raise ValueError(f"formula '{text}' uses unknown name(s) ['{node.id}']; arguments are {list(args)}")
        if isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, ast.Name)):
            raise ValueError(f"formula '{text}': only plain calls like exp(x) are allowed")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in FORMULA_NAMESPACE:
            raise ValueError(f"formula '{text}' calls unknown function(s) ['{node.func.id}']")
    return tree


class _ExactNumbers(ast.NodeTransformer):
    """Numbers become SymPy numbers before evaluation (`1/2` is the rational one half, as in SymPy's
    parser, not the float 0.5)."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, bool):
            return node
        kind = "__integer" if isinstance(node.value, int) else "__float"
        return ast.copy_location(ast.Call(ast.Name(kind, ast.Load()), [ast.Constant(repr(node.value))], []), node)


def _parse_formula(text: str, args: tuple[str, ...]) -> sympy.Expr:
    """The formula as a SymPy expression. The checked tree is evaluated directly with SymPy's objects (what
    `sympy.parse_expr` would build, at a fraction of its cost: the table loads in every process)."""
    tree = ast.fix_missing_locations(_ExactNumbers().visit(_check_grammar(text, args)))
    names = {**FORMULA_NAMESPACE, **{a: sympy.Symbol(a, real=True) for a in args},
             "__integer": sympy.Integer, "__float": sympy.Float}
    try:
        expr = sympy.sympify(eval(compile(tree, "<formula>", "eval"), {"__builtins__": {}}, names))
    except (sympy.SympifyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        raise ValueError(f"formula '{text}' is not a SymPy expression: {type(exc).__name__}: {exc}") from None
    stray = {s.name for s in expr.free_symbols} - set(args)
    if stray:
        raise ValueError(f"formula '{text}' uses unknown name(s) {sorted(stray)}; arguments are {list(args)}")
    unknown_fns = {
        type(f).__name__ for f in expr.atoms(sympy.Function) if isinstance(f, sympy.core.function.AppliedUndef)
    }
    if unknown_fns:
        raise ValueError(f"formula '{text}' calls unknown function(s) {sorted(unknown_fns)}")
    return expr


@attrs.frozen
class ElementwiseEntry:
    name: str
    args: tuple[str, ...]
    formula: str
    expr: sympy.Expr = attrs.field(eq=False, repr=False)
    symbols: tuple[sympy.Symbol, ...] = attrs.field(eq=False, repr=False)
    domain: Mapping[str, tuple[float, float]] = attrs.field(repr=False)
    kinks: tuple[str, ...] = ()
    spellings: tuple[str, ...] = ()
    operator: str | None = None
    torch: str | None = None
    onnx: tuple[str, ...] = ()

    def apply(self, *operands: sympy.Expr) -> sympy.Expr:
        """The formula with its arguments replaced by `operands` (simultaneous substitution)."""
        if len(operands) != len(self.args):
            raise ValueError(f"'{self.name}' takes {len(self.args)} argument(s), got {len(operands)}")
        return self.expr.xreplace(dict(zip(self.symbols, operands)))

    def kink_exprs(self) -> tuple[sympy.Expr, ...]:
        return tuple(_parse_formula(k, self.args) for k in self.kinks)


def _build(name: str, body: dict[str, Any]) -> ElementwiseEntry:
    args = tuple(body["args"])
    if not args or not all(isinstance(a, str) and a.isidentifier() and not keyword.iskeyword(a) for a in args):
        raise ValueError(f"'args' must be a non-empty list of identifiers, got {body['args']!r}")
    expr = _parse_formula(str(body["formula"]), args)
    raw_domain = body.get("domain", {})
    unknown = set(raw_domain) - set(args)
    if unknown:
        raise ValueError(f"'domain' names non-argument(s) {sorted(unknown)}")
    domain = {}
    for a in args:
        lo, hi = raw_domain.get(a, DEFAULT_DOMAIN)
        if not float(lo) < float(hi):
            raise ValueError(f"domain of '{a}' must be [low, high] with low < high, got {[lo, hi]}")
        domain[a] = (float(lo), float(hi))
    kinks = tuple(body.get("kinks", ()))
    for k in kinks:
        _parse_formula(k, args)
    onnx = body.get("onnx", ())
    return ElementwiseEntry(
        name=name,
        args=args,
        formula=str(body["formula"]),
        expr=expr,
        symbols=tuple(sympy.Symbol(a, real=True) for a in args),
        domain=domain,
        kinks=kinks,
        spellings=tuple(body.get("spellings", ())),
        operator=body.get("operator"),
        torch=body.get("torch"),
        onnx=tuple([onnx] if isinstance(onnx, str) else onnx),
    )


REQUIRED = frozenset({"args", "formula"})
OPTIONAL = frozenset({"domain", "kinks", "spellings", "operator", "torch", "onnx"})


@attrs.frozen
class ElementwiseTable:
    entries: Mapping[str, ElementwiseEntry]
    by_spelling: Mapping[str, ElementwiseEntry]
    by_onnx: Mapping[str, ElementwiseEntry]

    def __getitem__(self, name: str) -> ElementwiseEntry:
        return self.entries[name]

    def __iter__(self):
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)


def load_elementwise(path: Path) -> ElementwiseTable:
    entries = load_entries(path, REQUIRED, OPTIONAL, _build)
    by_spelling: dict[str, ElementwiseEntry] = {}
    by_onnx: dict[str, ElementwiseEntry] = {}
    for entry in entries.values():
        for spelling in entry.spellings:
            if spelling in by_spelling:
                raise RuleTableError.build(
                    str(path), entry.name, f"spelling '{spelling}' already belongs to '{by_spelling[spelling].name}'"
                )
            by_spelling[spelling] = entry
        for op in entry.onnx:
            if op in by_onnx:
                raise RuleTableError.build(str(path), entry.name,
                                           f"ONNX op '{op}' already maps to '{by_onnx[op].name}'")
            by_onnx[op] = entry
    return ElementwiseTable(entries, by_spelling, by_onnx)


@functools.cache
def elementwise_table() -> ElementwiseTable:
    """The project's elementwise table, loaded and validated once per process."""
    return load_elementwise(rules_dir() / "elementwise.toml")
