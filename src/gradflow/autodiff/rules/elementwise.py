"""Reverse rule for element-wise operations: top-level tasklets and maps over tasklet bodies.

The body is composed into one expression per output element (`elementfn`); the reverse is one tasklet in a
map over the same iteration space that, per element:
- reads the gradient of each output element it overwrote and clears it (the old value is dead), unless the
  write was an accumulation (`wcr` sum), whose target keeps its gradient;
- adds `sum_o g_o * d out_o / d in` into the gradient of each input element (write-conflict sum);
- where an input element is the very element the operation overwrote (`A[i] = f(A[i])`), assigns the
  contribution instead of clearing and adding.
"""

from __future__ import annotations

import dace
import sympy

from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.elementfn import ElementFunction, element_function
from gradflow.autodiff.emit import SUM, add_element_tasklet, map_ranges
from gradflow.autodiff.rules import reverse_rule
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import assignments_code, derivative


def _element_function(site: OpSite, ctx: ReverseContext) -> ElementFunction:
    """The operation's element function, composed once per build (`needs` and `reverse` both ask)."""
    return ctx.memo(("element_function", site.index), lambda: element_function(site.state, site.members()))


def _contributions(ef: ElementFunction, ctx: ReverseContext, where: str):
    """(gradient-carrying output indices, {input index: contribution expression})."""
    gouts = [i for i, p in enumerate(ef.outputs) if ctx.grad_of(p.array)]
    for i in gouts:
        if ef.outputs[i].wcr not in (None, "sum"):
            raise NotDifferentiableError(
                f"{where}: output '{ef.outputs[i].array}' is written with {ef.outputs[i].wcr} conflict resolution; "
                "only sums are differentiated"
            )
    contrib: dict[int, sympy.Expr] = {}
    for j, port in enumerate(ef.inputs):
        if not ctx.grad_of(port.array):
            continue
        total = sympy.Integer(0)
        for i in gouts:
            total += sympy.Symbol(f"__gout{i}", real=True) * derivative(ef.exprs[i], port.symbol)
        if total != 0:
            contrib[j] = total
    return gouts, contrib


def _used_symbols(contrib: dict[int, sympy.Expr]) -> set[sympy.Symbol]:
    """The symbols the reverse code reads: forward input values and output gradients."""
    return set().union(*(c.free_symbols for c in contrib.values()))


@reverse_rule("map", "tasklet")
class ElementwiseReverse:
    """Element-wise maps and top-level tasklet groups: one reverse tasklet per element (module doc)."""

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        ef = _element_function(site, ctx)
        where = f"'{site.op.label}' in state '{site.state.label}'"
        _, contrib = ctx.memo(("contributions", site.index), lambda: _contributions(ef, ctx, where))
        used = _used_symbols(contrib)
        return frozenset(p.array for p in ef.inputs if p.symbol in used)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        ef = _element_function(site, ctx)
        where = f"'{site.op.label}' in state '{site.state.label}'"
        gouts, contrib = ctx.memo(("contributions", site.index), lambda: _contributions(ef, ctx, where))
        if not gouts:
            return
        in_map = ef.map_entry is not None
        overwritten = {(ef.outputs[i].array, ef.outputs[i].subset): i for i in gouts if ef.outputs[i].wcr is None}
        overwritten_arrays = {a for a, _ in overwritten}

        assigned: dict[tuple[str, str], sympy.Expr] = {}
        accumulated: list[int] = []
        for j, expr in contrib.items():
            port = ef.inputs[j]
            key = (port.array, port.subset)
            if key in overwritten:
                assigned[key] = assigned.get(key, sympy.Integer(0)) + expr
            elif in_map and port.array in overwritten_arrays:
                raise NotDifferentiableError(
                    f"{where}: the map reads '{port.array}[{port.subset}]' and overwrites other elements of "
                    f"'{port.array}'; iterations would race",
                    "write the result to a new array",
                )
            else:
                accumulated.append(j)

        inputs: dict[str, dace.Memlet] = {}
        outputs: dict[str, dace.Memlet] = {}
        lines: list[tuple[str, sympy.Expr]] = []
        used = _used_symbols(contrib)
        for port in ef.inputs:
            if port.symbol in used:
                inputs[port.symbol.name] = dace.Memlet(f"{ctx.value_of(site.index, port.array)}[{port.subset}]")
        for i in gouts:
            port = ef.outputs[i]
            inputs[f"__gout{i}"] = dace.Memlet(f"{ctx.grad_of(port.array)}[{port.subset}]")
        for j in accumulated:
            port = ef.inputs[j]
            name = f"__gin{j}"
            lines.append((name, contrib[j]))
            outputs[name] = dace.Memlet(f"{ctx.grad_of(port.array)}[{port.subset}]", wcr=SUM)
        for n, key in enumerate(sorted(overwritten)):
            name = f"__gset{n}"
            lines.append((name, assigned.get(key, sympy.Integer(0))))
            outputs[name] = dace.Memlet(f"{ctx.grad_of(key[0])}[{key[1]}]")
        if not outputs:
            return
        code = assignments_code(lines)
        state = ctx.new_state(f"reverse_{site.state.label}")
        ranges = map_ranges(ef.map_entry) if in_map else None
        add_element_tasklet(state, f"rev_{site.op.label}", ranges, inputs, code, outputs)

