"""Pure analysis: what an operation costs to run once, and sizes in bytes, as SymPy expressions.

The store/recompute planner (`autodiff/budget.py`) weighs bytes kept for the backward sweep against the
work of rerunning definitions. Work is counted in element operations, the unit of a memory-bound loop:
- a map: its iteration count times the number of tasklets in its body (each does a few flops on the
  elements it moves);
- a top-level tasklet group: the number of tasklets;
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

from typing import Mapping

import sympy
from dace import subsets, symbolic
from dace.sdfg import nodes as nd

from gradflow.core.errors import InvalidArgumentError

#: element operations per element a tape stack holds: its push in the forward sweep and pop in the backward
#: (calibrated, see the module docstring; with 2, lp_go_fast's budget plans ran 1.9x slower than RECOMPUTE_ALL)
STORE_WORK = 8


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
                total += _volume(e.data.get_src_subset(e, state) or subsets.Range.from_array(state.sdfg.arrays[e.data.data]))
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
        tasklets = sum(isinstance(n, nd.Tasklet) for n in members)
        return sympy.sympify(entry.map.range.num_elements()) * max(tasklets, 1)
    if site.op.kind == "tasklet":
        return sympy.Integer(sum(isinstance(n, nd.Tasklet) for n in members))
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
