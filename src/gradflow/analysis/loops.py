"""Pure analysis of `LoopRegion`s: is a loop a counted `for` loop, and how often can it run?

A loop is *counted* when it has a loop variable, an update `i = i + s` with a nonzero integer constant
`s`, a condition `i < b`, `i <= b`, `i > b` or `i >= b` (matching the sign of `s`), and neither its
bounds nor its variable are assigned inside its body. A counted loop is reversed in closed form
(the reverse loop starts at the last value the forward loop took); any other loop (a `while`, a
do-while, a data-dependent bound) is reversed by recording its trip count.

Upper bounds of trip counts (the capacity of per-iteration storage) are found by substituting the
extreme values of enclosing loop variables into affine expressions; where that is not possible the
caller asks the user for a bound.
"""

from __future__ import annotations

import re
from typing import Mapping

import attrs
import dace
import sympy
from dace import symbolic
from dace.sdfg.state import LoopRegion

_CMP = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">", sympy.GreaterThan: ">="}


@attrs.frozen
class CountedLoop:
    """`for (var = start; var <cmp> stop; var += step)`, with `step` a nonzero integer."""

    var: str
    start: sympy.Expr
    stop: sympy.Expr
    step: int
    cmp: str  # "<", "<=", ">", ">="

    def trip_count(self) -> tuple[sympy.Expr, int]:
        """(numerator, divisor): the trip count is numerator // divisor when the loop runs at all."""
        s = self.step
        if self.cmp == "<":
            return self.stop - self.start + s - 1, s
        if self.cmp == "<=":
            return self.stop - self.start + s, s
        m = -s
        if self.cmp == ">":
            return self.start - self.stop + m - 1, m
        return self.start - self.stop + m, m

    def last_value(self) -> str:
        """C-safe expression of the last value taken; `start - step` when the loop does not run."""
        a, b, s = symbolic.symstr(self.start), symbolic.symstr(self.stop), self.step
        m = abs(s)
        span = {"<": f"({b}) - ({a})", "<=": f"({b}) - ({a}) + 1",
                ">": f"({a}) - ({b})", ">=": f"({a}) - ({b}) + 1"}[self.cmp]
        trips = f"((max({span}, 0) + {m - 1}) // {m})"  # non-negative numerator: any rounding is floor
        return f"({a}) + ({s}) * ({trips} - 1)"

    def forward_condition(self) -> str:
        return f"{self.var} {self.cmp} ({symbolic.symstr(self.stop)})"

    def interval(self) -> tuple[sympy.Expr, sympy.Expr]:
        """(lowest, highest) value the variable can take (affine; may over-approximate by < |step|)."""
        a, b = self.start, self.stop
        return {"<": (a, b - 1), "<=": (a, b), ">": (b + 1, a), ">=": (b, a)}[self.cmp]


def loop_depth(block) -> int:
    """How many `LoopRegion`s of its SDFG enclose `block` (a state or region)."""
    depth, region = 0, block.parent_graph
    while region is not None and not isinstance(region, dace.SDFG):
        depth += isinstance(region, LoopRegion)
        region = region.parent_graph
    return depth


def describe_loop(loop: LoopRegion) -> str:
    """A loop in its author's terms: `the loop over i (line 10)`, `the while loop (line 7)`. DaCe's
    frontend labels loops `for_<line>` / `while_<line>` with the line of the source file."""
    match = re.search(r"(?:^|_)(for|while)_(\d+)(?:_\d+)*$", loop.label)  # inlined: `<program>_while_11_0`
    where = f" (line {match.group(2)}, DaCe's label '{loop.label}')" if match else f" ('{loop.label}')"
    if loop.loop_variable:
        return f"the loop over {loop.loop_variable}{where}"
    return f"the while loop{where}"


def in_loop(block) -> bool:
    """`block` (a state or region) lies inside a `LoopRegion` of its SDFG: it may run more than once per call."""
    return loop_depth(block) > 0


def _parse(code: str) -> sympy.Basic | None:
    try:
        return symbolic.pystr_to_symbolic(code)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError, AttributeError):  # unparsable: not counted
        return None


def assigned_symbols(region) -> frozenset[str]:
    """Symbols that `region`'s body assigns: on its interstate edges, or as the variables of loops inside it
    (what `counted_loop` needs to know is not a bound or the variable itself)."""
    return frozenset(_assignment_counts(region))


def _step(loop: LoopRegion) -> sympy.Expr | None:
    """What the update `var = var + step` adds to the loop's variable (simplified), or None when the update
    is not an assignment of the variable that parses."""
    var = loop.loop_variable
    if not var or loop.update_statement is None:
        return None
    update = loop.update_statement.as_string.split("=", 1)
    expr = _parse(update[1]) if len(update) == 2 and update[0].strip() == var else None
    return None if expr is None else sympy.simplify(expr - symbolic.symbol(var))


def counted_loop(loop: LoopRegion, assigned_in_body: frozenset[str]) -> CountedLoop | None:
    """The counted-loop form of `loop`, or None when it must be treated as a while loop."""
    var = loop.loop_variable
    if not var or loop.inverted or loop.init_statement is None or loop.update_statement is None:
        return None
    if var in assigned_in_body:
        return None
    init = loop.init_statement.as_string.split("=", 1)
    if len(init) != 2 or init[0].strip() != var:
        return None
    start, step, cond = _parse(init[1]), _step(loop), _parse(loop.loop_condition.as_string)
    if start is None or step is None or cond is None:
        return None
    v = symbolic.symbol(var)
    if not step.is_Integer or step == 0 or type(cond) not in _CMP:
        return None
    cmp = _CMP[type(cond)]
    if cond.lhs == v and v not in cond.rhs.free_symbols:
        stop = cond.rhs
    elif cond.rhs == v and v not in cond.lhs.free_symbols:
        stop, cmp = cond.lhs, {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[cmp]
    else:
        return None
    if (int(step) > 0) != (cmp in ("<", "<=")):
        return None  # e.g. `i < n` with a negative step: runs zero times or forever
    bounds = {str(s) for s in (start.free_symbols | stop.free_symbols)}
    if bounds & (assigned_in_body | {var}):
        return None
    return CountedLoop(var, sympy.sympify(start), sympy.sympify(stop), int(step), cmp)


def variable_step(loop: LoopRegion) -> str | None:
    """The step of a `for` loop whose variable advances by something other than a constant (`i = i + K`,
    `range(0, N, K)`), as written; None for a loop that steps by a constant or has no variable."""
    step = _step(loop)
    return None if step is None or step.is_Integer else str(step)


def upper_bound(expr: sympy.Expr, intervals: Mapping[str, tuple[sympy.Expr, sympy.Expr]],
                maximize: bool = True) -> sympy.Expr | None:
    """An expression free of the variables in `intervals` that bounds `expr` over them (max or min).

    Exact for expressions affine in each variable (the extreme is at an end of its interval); None when
    `expr` is not affine in one of them.
    """
    expr = sympy.sympify(expr)
    for _ in range(64):
        names = sorted(str(s) for s in expr.free_symbols if str(s) in intervals)
        if not names:
            return sympy.simplify(expr)
        sym = next(s for s in expr.free_symbols if str(s) == names[0])
        coeff = sympy.diff(expr, sym)
        if coeff.free_symbols or not coeff.is_number:
            return None
        lo, hi = intervals[names[0]]
        pick = hi if (coeff >= 0) == maximize else lo
        expr = sympy.expand(expr.subs(sym, pick))
    return None


def counter_bound(loop: LoopRegion) -> CountedLoop | None:
    """A counted loop bounding the trips of `loop`, a loop without a variable whose condition has a conjunct
    on a counter: `i = 0` before it, `while i < n and ...:`, `i = i + 1` once per iteration (as users write
    a `while` with a cap, and as `lower_breaks` leaves a `for` with a `break`). None when that cannot be
    shown; then the trip count is known only while the loop runs.

    What makes it an upper bound: the counter is assigned exactly once in the body, as `i = i + s`, on an
    edge of the body's chain of blocks (so once per iteration) after which nothing in the iteration reads it
    (every block that does sees it within the counted loop's interval); the stop is not assigned in the
    body; the start is the counter's last assignment before the loop in the enclosing chain, and nothing
    between that assignment and the loop changes a symbol it reads. Start and stop read no data.
    """
    region = loop.parent_graph
    if loop.loop_variable or loop.inverted or region is None or not loop.nodes():  # a do-while runs once more
        return None
    body_assigned = _assignment_counts(loop)
    entry_of = _entry_assignments(loop, region)
    for rel in _conjuncts(loop.loop_condition.as_string):
        for var in sorted(str(s) for s in rel.free_symbols):
            update = _update_at_the_end(loop, var) if body_assigned.get(var) == 1 else None
            if update is None or var not in entry_of:
                continue
            others = frozenset(n for n in body_assigned if n != var)
            fake = LoopRegion(f"{loop.label}_bound", rel_to_str(rel), var, f"{var} = {entry_of[var]}",
                              f"{var} = {update}")
            counted = counted_loop(fake, others)
            if counted is not None and "[" not in entry_of[var] and "[" not in symbolic.symstr(counted.stop):
                return counted
    return None


def _update_at_the_end(loop: LoopRegion, var: str) -> str | None:
    """The value `var` is assigned on an edge of `loop`'s own chain of blocks (so once per iteration) after
    which no block of the iteration reads it; None when there is no such edge or the body is no chain."""
    edges = [e for e in loop.edges() if var in e.data.assignments]
    if len(edges) != 1 or any(loop.out_degree(b) > 1 or loop.in_degree(b) > 1 for b in loop.nodes()):
        return None
    block = edges[0].dst
    while block is not None:
        if not isinstance(block, dace.SDFGState) or var in {str(s) for s in block.free_symbols}:
            return None
        out = loop.out_edges(block)
        if out and var in {str(s) for s in out[0].data.free_symbols}:
            return None
        block = out[0].dst if out else None
    return edges[0].data.assignments[var]


def _conjuncts(condition: str) -> tuple:
    cond = _parse(condition)
    if cond is None:
        return ()
    conjunction = isinstance(cond, sympy.And) or type(cond).__name__ == "AND"  # DaCe parses `and` as its own AND
    return tuple(rel for rel in (cond.args if conjunction else (cond,)) if type(rel) in _CMP)


def _assignment_counts(region) -> dict[str, int]:
    """How many interstate edges (and inner loop headers) inside `region` assign each symbol."""
    counts: dict[str, int] = {}
    for edge in region.all_interstate_edges():
        for name in edge.data.assignments:
            counts[name] = counts.get(name, 0) + 1
    for block in region.all_control_flow_blocks():
        if isinstance(block, LoopRegion) and block.loop_variable:
            counts[block.loop_variable] = counts.get(block.loop_variable, 0) + 2  # never "exactly once"
    return counts


def _entry_assignments(loop: LoopRegion, region) -> dict[str, str]:
    """The value each symbol was last assigned before `loop` along the chain of single predecessors in
    `region`, kept only where no symbol it reads is assigned again on the way to the loop."""
    found: dict[str, str] = {}
    later: set[str] = set()  # symbols assigned between an edge and the loop
    node = loop
    for _ in range(len(region.nodes())):
        ins = region.in_edges(node)
        if len(ins) != 1:
            break
        assignments = ins[0].data.assignments
        for name, value in assignments.items():
            if name in found or name in later:
                continue
            reads = _parse(value)  # (the edge's assignments are simultaneous: `i = n, n = 0` gives i the old n)
            if reads is not None and not ({str(s) for s in reads.free_symbols} & (later | set(assignments))):
                found[name] = value
        later |= set(assignments)
        node = ins[0].src
        if not isinstance(node, dace.SDFGState):
            later |= assigned_symbols(node)
    return found


def rel_to_str(rel: sympy.Basic) -> str:
    return f"{symbolic.symstr(rel.lhs)} {_CMP[type(rel)]} {symbolic.symstr(rel.rhs)}"
