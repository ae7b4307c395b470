"""Dual tasklets: a tasklet that also computes the tangents of the outputs it writes into varied arrays.

The code is read symbolically once (`core.symbolic.read_tasklet`, the reading reverse mode uses, so every
function of `rules/elementwise.toml` and the same subset of Python are understood). The tangent of an
output is `sum_i d out / d in_i * tan(in_i)` over the inputs whose arrays carry a tangent; it is printed as
assignments *before* the original code, which is kept verbatim: inputs cannot be assigned by tasklet code,
so the tangent lines read the same values the original code reads, and an update in place (`A[i] =
f(A[i])`) needs no care. Elements the code reads or writes through an index (`A[idx[i]]`) have tangents
read or written at the same index of the tangent connector; a conditional indexed write is guarded by the
same condition. An output stored through an integer connector has tangent 0 (truncation), and an input
read through one carries none.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import sympy
from dace import dtypes
from dace.sdfg import nodes as nd
from dace.sdfg.state import SDFGState

from gradflow.autodiff.elementfn import foreign_code_hint
from gradflow.autodiff.tangent.mirror import TAN, StateMirror
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import (
    UNASSIGNED,
    assignments_code,
    derivative,
    number_of,
    print_code,
    read_tasklet,
    stored_as,
)
from gradflow.core.wcr import reduction_type


def _integer(dtype) -> bool:
    return (isinstance(dtype, dtypes.typeclass) and not isinstance(dtype, (dtypes.pointer, dtypes.vector))
            and dtype.type is not None and np.dtype(dtype.type).kind in "iub")


def _indexed(name: str, index) -> str:
    return f"{name}[{', '.join(print_code(i) for i in index)}]"


def selected(term: sympy.Expr) -> sympy.Expr:
    """A tangent term whose derivative is piecewise (a step: `max`, `abs`, a branch) as a choice: a product
    with a piecewise factor is 0 where that factor is 0, even when the other factors are not finite (the
    tangent of `relu(a) / (a + 1)` at a = -1), as torch's `where`-based rules give. Each product is guarded
    by its own factors' zero conditions, so the code grows with the term; folding all the term's pieces
    into one choice (`piecewise_fold`) multiplies their counts: a second-order term of sixteen products of
    one `min` derivative ran for minutes."""
    if term.has(sympy.Heaviside):
        term = term.replace(lambda e: isinstance(e, sympy.Heaviside),
                            lambda e: sympy.Piecewise((0, e.args[0] < 0), (e.args[1] if len(e.args) > 1 else
                                                      sympy.Rational(1, 2), sympy.Eq(e.args[0], 0)), (1, True)))
    return _guarded(term) if term.has(sympy.Piecewise) else term


@functools.lru_cache(maxsize=256)
def _zero_where(choice: sympy.Piecewise) -> sympy.Basic:
    """Where a (nested) Piecewise takes a piece that is literally 0: its conditions in order (remembered:
    a term's products mostly share their steps)."""
    flat = sympy.piecewise_fold(choice)
    pieces = flat.args if isinstance(flat, sympy.Piecewise) else ((flat, sympy.true),)
    where: list[sympy.Basic] = []
    earlier: list[sympy.Basic] = []
    for value, cond in pieces:
        if value == 0:
            where.append(sympy.And(cond, *[sympy.Not(c) for c in earlier]))
        earlier.append(cond)
    return sympy.Or(*where)


def _guarded(e: sympy.Expr) -> sympy.Expr:
    """`e` with every product that has piecewise factors made 0 where one of them is (see `selected`)."""
    if not e.has(sympy.Piecewise) or isinstance(e, sympy.Piecewise):
        return e
    if isinstance(e, sympy.Add):
        return sympy.Add(*[_guarded(a) for a in e.args])
    if isinstance(e, sympy.Mul):
        choices: list[sympy.Expr] = []
        steps: list[sympy.Piecewise] = []  # the choices themselves, or the bases of their positive powers
        rest: list[sympy.Expr] = []
        for f in e.args:
            base = f.base if isinstance(f, sympy.Pow) and f.exp.is_Integer and f.exp > 0 else f
            if isinstance(base, sympy.Piecewise):
                choices.append(f)
                steps.append(base)
            else:
                rest.append(f)
        product = sympy.Mul(*[_guarded(f) for f in rest], *choices)
        zero = sympy.Or(*[_zero_where(step) for step in steps])
        return product if zero is sympy.false else sympy.Piecewise((0, zero), (product, True))
    # a choice inside a function or a power: its pieces as one choice of values (a small subexpression)
    return sympy.piecewise_fold(e)


def _check_wcr(where: str, edge) -> None:
    if edge.data.wcr is not None and reduction_type(edge.data.wcr) != dtypes.ReductionType.Sum:
        raise NotDifferentiableError(
            f"{where}: output '{edge.src_conn}' is written with the write-conflict resolution {edge.data.wcr}; "
            "forward mode differentiates write-conflict sums and products only",
            "compute a maximum or minimum with np.max / np.min (a Reduce node)")


def _settled(where: str, edge, value: sympy.Expr) -> sympy.Expr:
    """An output left unassigned on some path adds nothing through a dynamic write-conflict sum (its
    tangent adds 0 there too); any other such output is refused, as in reverse mode."""
    marks = [s for s in value.free_symbols if s.name.startswith(UNASSIGNED)]
    if not marks:
        return value
    if edge.data.dynamic and edge.data.wcr is not None:
        return value.xreplace({m: sympy.Integer(0) for m in marks})
    raise NotDifferentiableError(
        f"{where}: output '{edge.src_conn}' is not assigned on every path of the code",
        "assign it on every path (NORMALIZE's complete_conditional_writes reads the old value explicitly)")


def dual_tasklet(state: SDFGState, node: nd.Tasklet, mirror: StateMirror, constants: set[str],
                 elsewhere: frozenset = frozenset()) -> bool:
    """Make `node` compute the tangents of what it writes into arrays with a tangent, and lay their memlet
    paths; False (nothing changed) when it writes no such array. The out edges in `elsewhere` get their
    tangents from another rule (a product's, `products.py`)."""
    where = f"tasklet '{node}' in state '{state.label}'"
    outs = [e for e in state.out_edges(node)
            if not e.data.is_empty() and mirror.has_tangent(e.data.data) and e not in elsewhere]
    if not outs:
        return False
    if node.language != dtypes.Language.Python:
        raise NotDifferentiableError(f"{where} is written in {node.language.name}, not Python",
                                     foreign_code_hint(state, node))
    ins = []
    for e in state.in_edges(node):
        if e.data.is_empty() or e.dst_conn is None:
            continue
        if e.data.data is None:
            raise NotDifferentiableError(f"{where}: input '{e.dst_conn}' comes from a tasklet without an array")
        if mirror.has_tangent(e.data.data) and not _integer(node.in_connectors.get(e.dst_conn)):
            ins.append(e)
    meaning = read_tasklet(node.code.as_string, node.in_connectors, node.out_connectors, where, constants=constants)
    active = {e.dst_conn for e in ins}
    # the value of every indexed element read, and the tangents of the active inputs, as printable symbols
    values = {s: sympy.Symbol(_indexed(el.conn, el.index), real=True) for s, el in meaning.reads.items()}
    tangents = {sympy.Symbol(c, real=True): sympy.Symbol(TAN + c, real=True) for c in sorted(active)}
    tangents.update({s: sympy.Symbol(_indexed(TAN + el.conn, el.index), real=True)
                     for s, el in meaning.reads.items() if el.conn in active})

    def tangent_of(value: sympy.Expr) -> sympy.Expr:
        total = sympy.Integer(0)
        for symbol, tan in tangents.items():
            if symbol in value.free_symbols:
                total += selected(derivative(value, symbol) * tan)
        return total.xreplace(values)

    assigned = []
    indexed_out = {w.element.conn for w in meaning.writes}
    for e in outs:
        _check_wcr(where, e)
        if e.src_conn in indexed_out:
            continue
        if e.src_conn not in meaning.outputs:
            raise NotDifferentiableError(f"{where} never assigns output '{e.src_conn}'")
        value = number_of(_settled(where, e, meaning.outputs[e.src_conn]))  # a stored truth value is 1 or 0
        dtype = node.out_connectors.get(e.src_conn)
        if isinstance(dtype, dtypes.typeclass) and dtype.type is not None and _integer(dtype):
            value = stored_as(value, dtype)
        assigned.append((TAN + e.src_conn, tangent_of(value)))
    # the tangent's temporaries share the tasklet with the original code's own (`__cse0`, ... of its
    # derivative): other names, or the first assignment's C++ type (a bool) holds both (a wrong hvp of a min)
    primal_names = set(re.findall(r"[A-Za-z_]\w*", node.code.as_string))
    lines = [assignments_code(assigned, reserved=primal_names)] if assigned else []
    tangent_outs = {e.src_conn for e in outs}
    for write in meaning.writes:
        if write.element.conn not in tangent_outs:
            continue
        target = _indexed(TAN + write.element.conn, write.element.index)
        line = f"{target} = {print_code(tangent_of(number_of(write.value)))}"
        if write.condition != sympy.true:
            line = f"if {print_code(write.condition.xreplace(values))}:\n    {line}"
        lines.append(line)
    node.code.as_string = "\n".join([*lines, node.code.as_string.strip()])
    for e in ins:
        mirror.path(e)
    for e in outs:
        mirror.path(e)
    return True
