"""Elementwise ops. Ops listed under `onnx` in rules/elementwise.toml get their code from that table's
SymPy formula (printed with `print_code`); the few parametrised ones (LeakyRelu's alpha, Clip's bounds,
tanh-Gelu) build a SymPy formula from their attributes here and print it the same way.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np
import sympy

from gradflow.core.elementwise import ElementwiseEntry, elementwise_table
from gradflow.core.stop_gradient import SPELLING as STOP_SPELLING
from gradflow.core.stop_gradient import StopGradient, with_definition
from gradflow.core.symbolic import print_code, print_code_single
from gradflow.frontend.onnx.builder import (
    Lowering, RuleUnsupported, Tensor, bcast_index, broadcast_shapes, params, storage_dtype,
)
from gradflow.frontend.onnx.dtypes import elem_dtype
from gradflow.frontend.onnx.table import GRADFLOW_DOMAIN, LATEST_OPSET, Node, onnx_rule

X, Y = sympy.Symbol("x", real=True), sympy.Symbol("y", real=True)


def apply_formula(lw: Lowering, node: Node, expr: sympy.Expr, ins: dict[str, Tensor], out: str, dtype=None) -> Tensor:
    """Lower `res = expr` over numpy-broadcast inputs (connectors named like the free symbols)."""
    dtype = dtype if dtype is not None else next(iter(ins.values())).dtype
    return lw.elementwise(node.label, f"res = {printer(dtype)(expr)}", ins, out, dtype)


def printer(dtype) -> Callable[[sympy.Expr], str]:
    """The code printer for values of `dtype`: float32 literals in float32 programs (a double literal would
    make the element's arithmetic double precision)."""
    return print_code_single if np.dtype(dtype) == np.float32 else print_code


def typed(code: str, dtype) -> str:
    """Tasklet code written once for every dtype (`o = exp(a - m) / s`, a Python expression over connectors,
    optionally assigned) in the spelling of `dtype`: in a float32 program, float32 literals and DaCe's type
    generic functions. A bare `exp` there compiles to C's `double exp(double)`: the float32 softmax of a
    2-layer GPT spent a tenth of its time in double precision `exp`."""
    if np.dtype(dtype) != np.float32:
        return code
    target, sep, expr = code.partition("=") if "=" in code.split("(")[0] else ("", "", code)
    names = {n: sympy.Symbol(n, real=True) for n in re.findall(r"\b[a-zA-Z_]\w*\b", expr)
             if n not in _FUNCTIONS}
    value = sympy.sympify(expr, locals={**names, **_FUNCTIONS})
    return f"{target}{sep} {printer(dtype)(value)}" if sep else printer(dtype)(value)


_FUNCTIONS = {"exp": sympy.exp, "log": sympy.log, "sqrt": sympy.sqrt, "abs": sympy.Abs, STOP_SPELLING: StopGradient}


def _fold(lw: Lowering, node: Node, entry: ElementwiseEntry) -> None:
    """Lower `node` with `entry`'s formula: unary, binary, or folded left over variadic inputs (Max, Sum)."""
    args = entry.args
    names = [n for n in node.inputs if n]
    code = f"res = {printer(lw.get(names[0]).dtype if names else np.float64)(entry.expr)}"
    if len(args) == 1:
        x = lw.get(names[0])
        lw.elementwise(node.label, code, {args[0]: x}, node.outputs[0], x.dtype)
        return
    if len(names) == 1:
        x = lw.get(names[0])
        lw.elementwise(node.label, "res = x", {"x": x}, node.outputs[0], x.dtype)
        return
    acc = lw.get(names[0])
    for name in names[1:-1]:
        y = lw.get(name)
        tmp = lw.temp(broadcast_shapes(acc.shape, y.shape), acc.dtype)
        _ew_into(lw, node.label, code, {args[0]: acc, args[1]: y}, tmp)
        acc = tmp
    lw.elementwise(node.label, code, {args[0]: acc, args[1]: lw.get(names[-1])}, node.outputs[0], acc.dtype)


def _ew_into(lw: Lowering, label: str, code: str, ins: dict[str, Tensor], out: Tensor) -> None:
    """Like `lw.elementwise`, into an existing (temporary) tensor."""
    p = params("p", out.rank)
    lw.map(label, list(zip(p, out.shape)), {c: (t, bcast_index(t.shape, out.shape, p)) for c, t in ins.items()},
           code, {"res": (out, p, None)})


#: Binary ops whose opsets before 7 broadcast by `broadcast` / `axis` attributes, not numpy's rules.
LEGACY_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And", "Or", "Xor"})


@onnx_rule(*(op for op in elementwise_table().by_onnx if op not in LEGACY_BROADCAST))
@onnx_rule(*(op for op in elementwise_table().by_onnx if op in LEGACY_BROADCAST), opsets=(7, LATEST_OPSET))
def table_formula(lw: Lowering, node: Node) -> None:
    """An ONNX op lowered from its entry of rules/elementwise.toml (the entry whose `onnx` lists the op)."""
    _fold(lw, node, elementwise_table().by_onnx[node.op_type])


@onnx_rule("Mod")
def mod(lw: Lowering, node: Node) -> None:
    """C's fmod (fmod=1), or the remainder with the divisor's sign (fmod=0, Python's and NumPy's `%`): for
    floats, C's fmod moved by the divisor where the signs differ, which keeps NumPy's values at infinite
    divisors (`x - y * floor(x / y)` would be NaN there); for integers DaCe's `PyMod`, exact. Both spellings
    are entries of the elementwise table, so the AD differentiates them as written."""
    x, y = (lw.get(n) for n in node.inputs[:2])
    if node.attr("fmod", 0):
        code = "res = CMod(x, y)"
    elif np.dtype(x.dtype).kind == "f":
        code = "r = CMod(x, y)\nres = (r + y) if ((r != 0) and ((r < 0) != (y < 0))) else r"
    else:
        code = "res = PyMod(x, y)"
    lw.elementwise(node.label, code, {"x": x, "y": y}, node.outputs[0], x.dtype)


@onnx_rule("Sum")
def sum_(lw: Lowering, node: Node) -> None:
    """Variadic sum: the table's `add` folded over the inputs."""
    _fold(lw, node, elementwise_table().by_onnx["Add"])


@onnx_rule("Mean")
def mean(lw: Lowering, node: Node) -> None:
    """Variadic mean: the table's `add` folded over the inputs, then divided by their count."""
    import attrs

    names = [n for n in node.inputs if n]
    inner = node.outputs[0] + "\x00sum"  # an internal value name no ONNX graph can hold
    _fold(lw, attrs.evolve(node, outputs=(inner,)), elementwise_table().by_onnx["Add"])
    apply_formula(lw, node, X / len(names), {"x": lw.get(inner)}, node.outputs[0])


def _f(node: Node, name: str, default: float) -> sympy.Float:
    return sympy.Float(float(node.attr(name, default)))


@onnx_rule("LeakyRelu")
def leaky_relu(lw: Lowering, node: Node) -> None:
    alpha = _f(node, "alpha", 0.01)
    apply_formula(lw, node, sympy.Piecewise((X, X >= 0), (alpha * X, True)), {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("Elu")
def elu(lw: Lowering, node: Node) -> None:
    alpha = _f(node, "alpha", 1.0)
    expr = sympy.Piecewise((X, X >= 0), (alpha * (sympy.exp(X) - 1), True))
    apply_formula(lw, node, expr, {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("Selu")
def selu(lw: Lowering, node: Node) -> None:
    # without attributes, SELU's own constants: ONNX's defaults are their float32 roundings, which a float32
    # program gets from these as well, and a float64 one (torch's `selu`, exported without attributes) would
    # be off by 5e-8
    alpha, gamma = _f(node, "alpha", 1.6732632423543772848), _f(node, "gamma", 1.0507009873554804934)
    expr = gamma * sympy.Piecewise((X, X > 0), (alpha * (sympy.exp(X) - 1), True))
    apply_formula(lw, node, expr, {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("Celu")
def celu(lw: Lowering, node: Node) -> None:
    alpha = _f(node, "alpha", 1.0)
    expr = sympy.Max(0, X) + sympy.Min(0, alpha * (sympy.exp(X / alpha) - 1))
    apply_formula(lw, node, expr, {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("HardSigmoid")
def hard_sigmoid(lw: Lowering, node: Node) -> None:
    alpha, beta = _f(node, "alpha", 0.2), _f(node, "beta", 0.5)
    expr = sympy.Max(0, sympy.Min(1, alpha * X + beta))
    apply_formula(lw, node, expr, {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("HardSwish")
def hard_swish(lw: Lowering, node: Node) -> None:
    expr = X * sympy.Max(0, sympy.Min(1, X / 6 + sympy.Rational(1, 2)))
    apply_formula(lw, node, expr, {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("Softsign")
def softsign(lw: Lowering, node: Node) -> None:
    apply_formula(lw, node, X / (1 + sympy.Abs(X)), {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("ThresholdedRelu")
def thresholded_relu(lw: Lowering, node: Node) -> None:
    alpha = _f(node, "alpha", 1.0)
    apply_formula(lw, node, sympy.Piecewise((X, X > alpha), (0, True)), {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("Gelu", priority=1, applies=lambda n: n.attr("approximate", "none") == "tanh")
def gelu_tanh(lw: Lowering, node: Node) -> None:
    """Gelu(approximate='tanh'); the exact Gelu comes from the elementwise table."""
    c = sympy.sqrt(2 / sympy.pi)
    expr = X / 2 * (1 + sympy.tanh(c * (X + sympy.Float(0.044715) * X**3)))
    apply_formula(lw, node, expr, {"x": lw.get(node.inputs[0])}, node.outputs[0])


@onnx_rule("Clip")
def clip(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    expr: sympy.Expr = X
    ins = {"x": x}
    if node.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")
        if lo is not None:
            expr = sympy.Max(expr, sympy.Float(lo))
        if hi is not None:
            expr = sympy.Min(expr, sympy.Float(hi))
    else:
        for k, (conn, fn) in enumerate((("lo", sympy.Max), ("hi", sympy.Min)), start=1):
            if node.input(k):
                ins[conn] = lw.get(node.input(k))
                expr = fn(expr, sympy.Symbol(conn, real=True))
    apply_formula(lw, node, expr, ins, node.outputs[0], x.dtype)


_CMP = {"Equal": "(x == y)", "Less": "(x < y)", "LessOrEqual": "(x <= y)", "Greater": "(x > y)",
        "GreaterOrEqual": "(x >= y)"}
_LOGIC = {"And": "(x and y)", "Or": "(x or y)", "Xor": "(x != y)"}


@onnx_rule(*_CMP, *_LOGIC, opsets=(7, LATEST_OPSET))  # see LEGACY_BROADCAST
def predicate(lw: Lowering, node: Node) -> None:
    """Comparisons and logic: a boolean result of two broadcast inputs."""
    code = {**_CMP, **_LOGIC}[node.op_type]
    lw.elementwise(node.label, f"res = {code}", {"x": lw.get(node.inputs[0]), "y": lw.get(node.inputs[1])},
                   node.outputs[0], np.bool_)


@onnx_rule("Not")
def not_(lw: Lowering, node: Node) -> None:
    lw.elementwise(node.label, "res = not x", {"x": lw.get(node.inputs[0])}, node.outputs[0], np.bool_)


@onnx_rule("StopGradient", applies=lambda node: node.domain == GRADFLOW_DOMAIN, domain=GRADFLOW_DOMAIN)
def stop_gradient(lw: Lowering, node: Node) -> None:
    """gradflow's `StopGradient`: the value, through which differentiation passes nothing
    (`core.stop_gradient`). A known value stays known: a constant has no gradient to stop."""
    x = lw.info(node.inputs[0])
    if x.value is not None:
        lw.set_value(node.outputs[0], x.value, x.dtype)
        return
    lw.sdfg.global_code = {**lw.sdfg.global_code, "frame": with_definition(lw.sdfg.global_code.get("frame"))}
    lw.elementwise(node.label, f"res = {STOP_SPELLING}(x)", {"x": lw.get(node.inputs[0])}, node.outputs[0], x.dtype)


@onnx_rule("Where")
def where(lw: Lowering, node: Node) -> None:
    x, y = lw.get(node.inputs[1]), lw.get(node.inputs[2])
    lw.elementwise(node.label, "res = (x if c else y)", {"c": lw.get(node.inputs[0]), "x": x, "y": y},
                   node.outputs[0], x.dtype)


_CASTABLE = frozenset("biuf")


@onnx_rule("Cast", opsets=(6, LATEST_OPSET))  # Cast-1 named its target type by a string
def cast(lw: Lowering, node: Node) -> None:
    x = lw.get(node.inputs[0])
    to = elem_dtype(int(node.attr("to")), "the Cast target")
    # bfloat16 is stored as float32: a cast to it rounds only where it leaves the graph (docs/onnx.md)
    if storage_dtype(to).kind not in _CASTABLE or storage_dtype(x.dtype).kind not in _CASTABLE:
        raise RuleUnsupported(f"cast from {x.dtype} to {to}")
    code = "res = (x != 0)" if to == np.bool_ else "res = x"
    lw.elementwise(node.label, code, {"x": x}, node.outputs[0], to)


@onnx_rule("CastLike")
def cast_like(lw: Lowering, node: Node) -> None:
    import attrs
    from onnx import helper

    to = lw.info(node.inputs[1]).dtype
    cast(lw, attrs.evolve(node, attrs={"to": helper.np_dtype_to_tensor_dtype(to)}))
