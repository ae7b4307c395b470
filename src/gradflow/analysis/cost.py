"""Pure analysis: what an operation costs to run once, and sizes in bytes, as SymPy expressions.

The store/recompute planner (`autodiff/budget.py`) weighs bytes kept for the backward sweep against the
work of rerunning definitions. Work is counted in element operations, the unit of a memory-bound loop:
- a map: its iteration count times the work of the tasklets in its body: one per tasklet (a few flops on
  the elements it moves), plus `CALL_WORK` per call of a function that costs more than an arithmetic
  operation (`exp`, `sin`, `log`, `sqrt`, ...: 10-40 ns each, where a loaded element costs about 1 ns), so
  that a planner does not rerun a `sin` per element to save a stack whose push and pop are cheaper;
- a top-level tasklet group: the work of its tasklets;
- a copy: the elements copied;
- a library node: `2 m n k` for matrix products (`2 n` for dot products), else the elements it reads;
- a nested SDFG: the elements it reads (it is never recomputed; the figure only orders);
- storing instead: `STORE_WORK` per element pushed on the tape. Storage is not free: a stored value is
  copied onto its stack in the forward sweep and back in the backward sweep, each time with the stack
  top's bookkeeping, and inside scalar loops (where most stacks live) one element per iteration, where a
  rerun adds an element operation to an iteration that runs anyway. Measured on the loop corpus
  (`benchmarks/memory.py`, one thread): a push and pop cost 4-10 ns per element (lp_durbin, lp_go_fast),
  an element operation of a rerun about 1 ns.
Expressions are symbolic in the program's sizes; `evaluate` substitutes the sizes the user gave.
"""

from __future__ import annotations

import ast
from typing import Mapping

import dace
import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd

from gradflow.core.errors import InvalidArgumentError

#: element operations per element a tape stack holds: its push in the forward sweep and pop in the backward
#: (calibrated, see the module docstring; with 2, lp_go_fast's budget plans ran 1.9x slower than RECOMPUTE_ALL)
STORE_WORK = 8

#: element operations per call of a function in a tasklet (see the module docstring)
CALL_WORK = 16

#: calls that cost about an arithmetic operation (conversions, min/max, abs)
_CHEAP_CALLS = frozenset({"min", "max", "abs", "float", "int", "bool", "round"})


def _tasklet_work(tasklet: nd.Tasklet) -> int:
    """1, plus `CALL_WORK` per function call in the tasklet's (Python) code; C++ code counts as 1."""
    if tasklet.code.language != dace.dtypes.Language.Python:
        return 1
    try:
        tree = ast.parse(tasklet.code.as_string)
    except SyntaxError:
        return 1
    calls = sum(isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _CHEAP_CALLS)
                for n in ast.walk(tree))
    return 1 + CALL_WORK * calls


def _volume(subset) -> sympy.Expr:
    if subset is None:
        return sympy.Integer(1)
    return sympy.sympify(subset.num_elements())


def _read_volume(site) -> sympy.Expr:
    state = site.state
    total = sympy.Integer(0)
    for i in site.op.reads:
        for e in state.out_edges(state.node(i)):
            if not e.data.is_empty():
                read = e.data.get_src_subset(e, state) or subsets.Range.from_array(state.sdfg.arrays[e.data.data])
                total += _volume(read)
    return total if total != 0 else sympy.Integer(1)


def _product_work(site, node) -> sympy.Expr:
    state = site.state
    dims = {}
    for e in list(state.in_edges(node)) + list(state.out_edges(node)):
        if e.data.is_empty():
            continue
        conn = e.dst_conn if e.dst is node else e.src_conn
        subset = e.data.get_src_subset(e, state) if e.dst is node else e.data.get_dst_subset(e, state)
        dims[conn] = [s for s in (subset.size() if subset is not None else []) if sympy.sympify(s) != 1]
    if type(node).__name__ == "Dot":
        return 2 * sympy.sympify(dims.get("_x", [1])[0] if dims.get("_x") else 1)
    a, c = dims.get("_a", []), dims.get("_c", [])
    inner = sympy.sympify(a[-1]) if a else sympy.Integer(1)
    out = sympy.Integer(1)
    for extent in c:
        out *= sympy.sympify(extent)
    return 2 * out * inner


def op_work(site) -> sympy.Expr:
    """Element operations of one run of the operation at `site` (see the module docstring)."""
    members = site.members()
    state = site.state
    if site.op.kind == "copy":
        (i,), (j,) = site.op.reads, site.op.writes
        edge = next(iter(state.edges_between(state.node(i), state.node(j))))
        return _volume(edge.data.subset)
    if site.op.kind == "map":
        entry = next(n for n in members if isinstance(n, nd.MapEntry) and state.entry_node(n) is None)
        tasklets = sum(_tasklet_work(n) for n in members if isinstance(n, nd.Tasklet))
        return sympy.sympify(entry.map.range.num_elements()) * max(tasklets, 1)
    if site.op.kind == "tasklet":
        return sympy.Integer(sum(_tasklet_work(n) for n in members if isinstance(n, nd.Tasklet)))
    if site.op.kind == "library":
        node = members[0]
        if type(node).__name__ in ("MatMul", "Gemm", "Dot", "Gemv", "BatchedMatMul"):
            return _product_work(site, node)
        return _read_volume(site)
    return _read_volume(site)


def evaluate(expr, sizes: Mapping[str, int], what: str) -> int:
    """`expr` with `sizes` substituted, as an int; a typed error names the symbols still missing."""
    value = symbolic.pystr_to_symbolic(str(expr)) if not isinstance(expr, (int, sympy.Basic)) else sympy.sympify(expr)
    value = value.subs({symbolic.symbol(k): v for k, v in sizes.items()})
    free = sorted(map(str, getattr(value, "free_symbols", ())))
    if free:
        raise InvalidArgumentError(f"{what} depends on {', '.join(free)}; the budget planner needs their values",
                                   "give them: gradflow.Forwarding.budget(max_bytes, sizes={" +
                                   ", ".join(f"'{s}': ..." for s in free) + "})")
    return int(sympy.ceiling(value))
