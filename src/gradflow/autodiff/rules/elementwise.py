"""Reverse rule for element-wise operations: top-level tasklets and maps over tasklet bodies.

The body is composed into one expression per output element (`elementfn`); the reverse is one tasklet in a
map over the same iteration space that, per element:
- reads the gradient of each output element it overwrote and clears it (the old value is dead), unless the
  write was an accumulation (`wcr` sum), whose target keeps its gradient;
- adds `sum_o g_o * d out_o / d in` into the gradient of each input element (write-conflict sum);
- where an input element is the very element the operation overwrote (`A[i] = f(A[i])`), assigns the
  contribution instead of clearing and adding.

Elements chosen by an index (indirect ports: gathers `x = A[idx[i]]`, scatters `A[idx[i]] = v`, `+=`) are
read and written through memlets over the whole array, indexed in the tasklet: the reverse of a gather is
a scatter-add into the gradient (duplicate indices accumulate), the reverse of an accumulating scatter is a
gather of the gradient. An overwriting scatter inside a map may hit one element from several iterations;
the forward program then races (DaCe runs map iterations in parallel), and the gradient goes to the
iteration that comes last in the map's row-major order, as in sequential execution: the reverse first
records, per element, the last iteration writing it (a max write-conflict map), reads the gradient in that
iteration only, and clears the written elements in a map of its own afterwards.
"""

from __future__ import annotations

import attrs
import dace
import sympy
from dace import subsets

from gradflow.analysis.dependence import apart_over
from gradflow.analysis.ops import source_line
from gradflow.autodiff.context import OpSite, ReverseContext
from gradflow.autodiff.elementfn import ElementFunction, Port, element_function
from gradflow.autodiff.emit import add_element_tasklet, fill, map_ranges
from gradflow.autodiff.protocols import reverse_rule
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.symbolic import assignments_code, derivative, print_code
from gradflow.core.wcr import MAX, SUM


def _element_function(site: OpSite, ctx: ReverseContext) -> ElementFunction:
    """The operation's element function, composed once per build (`needs` and `reverse` both ask)."""
    return ctx.memo(("element_function", site.index), lambda: element_function(site.state, site.members()))


@attrs.frozen
class _Plan:
    """What the reverse of one operation reads and writes."""

    gouts: tuple[int, ...]  # output ports whose array carries a gradient
    contrib: dict[int, sympy.Expr]  # input port -> its gradient contribution
    assigned: dict[tuple, sympy.Expr]  # overwritten element (key) -> the contribution assigned to its gradient
    accumulated: tuple[int, ...]  # input ports whose contribution is added
    used: frozenset[sympy.Symbol]  # input port symbols the reverse code reads (values and indices)
    results: dict[int, sympy.Symbol]  # output port -> symbol of its value, read where the code uses it


def _index_symbols(port: Port) -> set[sympy.Symbol]:
    return set().union(*(i.free_symbols for i in port.index)) if port.index is not None else set()


def _result_symbol(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"__res{i}", real=True)


def _result_ports(ef: ElementFunction) -> list[int]:
    """Outputs a reverse may read instead of calling their function again: computed by a function call and
    written directly (no index, no write-conflict) into an array the operation does not read."""
    return [i for i, port in enumerate(ef.outputs)
            if not (port.indirect or port.wcr is not None or not ef.exprs[i].atoms(sympy.Function)
                    or any(p.array == port.array for p in ef.inputs))]


def _read_results(ef: ElementFunction, ctx: ReverseContext, state, contrib: dict[int, sympy.Expr],
                  kept=None) -> dict[int, sympy.Symbol]:
    """Outputs computed by a function call (`exp(x - m)`) whose value a contribution contains (the derivative
    of `exp` is `exp`): the contributions read the value the forward wrote instead of calling the function
    again on inputs it would also have to keep. Where the backward sweep finds the output unchanged
    (`ReverseContext.final_value`), always; else for the outputs `kept` accepts (the reverse asks the
    engine, `ReverseContext.keeps_result`, once the tape is planned; its inputs are still needed then)."""
    found = {}
    for i in _result_ports(ef):
        port, expr = ef.outputs[i], ef.exprs[i]
        if ctx.final_value(state, port.array) is None and not (kept is not None and kept(port.array)):
            continue
        symbol = _result_symbol(i)
        changed = {j: c.subs(expr, symbol) for j, c in contrib.items()}
        if any(changed[j] != contrib[j] for j in contrib):
            contrib.update(changed)
            found[i] = symbol
    return found


def _apart(ef: ElementFunction, read: Port, write: Port) -> bool:
    """A read and an overwrite of one array through direct memlets whose elements differ over the whole map
    (`x[N - 3, j] -= x[N - 2, j]`): no iteration reads what another writes, so they reverse independently."""
    if read.indirect or write.indirect:
        return False
    entry = ef.map_entry
    assert entry is not None  # `_plan` asks only about an operation in a map
    intervals = {p: (b, e) for p, (b, e, _) in zip(entry.map.params, entry.map.range)}
    return apart_over(subsets.Range.from_string(read.subset), subsets.Range.from_string(write.subset), intervals)


def _plan(ef: ElementFunction, ctx: ReverseContext, where: str, state, kept=None) -> _Plan:
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
    results = _read_results(ef, ctx, state, contrib, kept)

    in_map = ef.map_entry is not None
    overwritten = {ef.outputs[i].key: ef.outputs[i] for i in gouts if ef.outputs[i].wcr is None}
    chosen = {p.array for p in overwritten.values() if p.indirect}
    assigned: dict[tuple, sympy.Expr] = {}
    accumulated: list[int] = []
    for j, expr in contrib.items():
        port = ef.inputs[j]
        same = overwritten.get(port.key)
        if same is not None and not (in_map and port.indirect):
            assigned[port.key] = assigned.get(port.key, sympy.Integer(0)) + expr
        elif same is not None or (in_map and any(a == port.array and not _apart(ef, port, out)
                                                 for (a, _), out in overwritten.items())):
            raise NotDifferentiableError(
                f"{where}: the map reads '{port.array}' and overwrites elements of '{port.array}'"
                + (" chosen by an index" if port.indirect or port.array in chosen else "")
                + "; iterations would race", "write the result to a new array")
        elif port.array in chosen or (port.indirect and any(a == port.array for a, _ in overwritten)):
            raise NotDifferentiableError(
                f"{where}: reads and overwrites elements of '{port.array}' of which an index chooses some; whether "
                "they are the same element is known only at run time", "write the result to a new array")
        else:
            accumulated.append(j)

    used = set().union(*(c.free_symbols for c in contrib.values())) if contrib else set()
    for j in accumulated:
        used |= _index_symbols(ef.inputs[j])
    for i in gouts:
        used |= _index_symbols(ef.outputs[i])
    by_symbol = {p.symbol: p for p in ef.inputs}
    frontier = [s for s in used if s in by_symbol]
    while frontier:  # the index of an element read through an index is read too
        extra = _index_symbols(by_symbol[frontier.pop()]) - used
        used |= extra
        frontier.extend(s for s in extra if s in by_symbol)
    results = {i: r for i, r in results.items() if any(r in c.free_symbols for c in contrib.values())}
    return _Plan(tuple(gouts), contrib, assigned, tuple(accumulated), frozenset(s for s in used if s in by_symbol),
                 results)


def _iteration_number(entry, where: str) -> str:
    """An integer that grows with the map's iterations in row-major order (the last writer wins)."""
    terms, scale = [], "1"
    for param, (begin, end, step) in reversed(list(zip(entry.map.params, entry.map.range))):
        try:
            ascending = bool(step > 0)
        except TypeError:
            raise NotDifferentiableError(f"{where}: an overwriting write through an index in a map whose step "
                                         f"'{step}' has no known sign") from None
        offset = f"(({param}) - ({begin}))" if ascending else f"(({begin}) - ({param}))"
        terms.append(f"{offset} * ({scale})")
        scale = f"({scale}) * (abs(({end}) - ({begin})) + 1)"
    return " + ".join(terms) or "0"


def _index_code(port: Port) -> str:
    assert port.index is not None  # called for indirect ports only
    return ", ".join(print_code(i) for i in port.index)


def _single_precision(sdfg: dace.SDFG, memlets) -> bool:
    """Whether the floating arrays a reverse tasklet touches are all float32 (its literals are then
    printed as float32 values, see `core.symbolic._Printer`)."""
    floats = {sdfg.arrays[m.data].dtype for m in memlets if m.data is not None
              and sdfg.arrays[m.data].dtype in (dace.float16, dace.float32, dace.float64)}
    return floats == {dace.float32}


def _whole(array: str, port: Port, wcr: str | None = None) -> dace.Memlet:
    """A memlet over what an indirect port may touch, for indexing in the tasklet."""
    return dace.Memlet(f"{array}[{port.subset}]", wcr=wcr, dynamic=True, volume=1)


def _where(site: OpSite) -> str:
    """The operation in its author's terms first: the source line DaCe's frontend put in the state's label
    (`augassign_16_4_op4` is line 16), then DaCe's names for the map and the state."""
    line = source_line(site.state.label)
    dace_names = f"'{site.op.label}' in state '{site.state.label}'"
    return f"line {line} ({dace_names})" if line else dace_names


@reverse_rule("map", "tasklet")
class ElementwiseReverse:
    """Element-wise maps and top-level tasklet groups: one reverse tasklet per element (module doc)."""

    @staticmethod
    def _plan(site: OpSite, ctx: ReverseContext) -> tuple[ElementFunction, _Plan, str]:
        ef = _element_function(site, ctx)
        where = _where(site)
        return ef, ctx.memo(("elementwise_plan", site.index), lambda: _plan(ef, ctx, where, site.state)), where

    def needs(self, site: OpSite, ctx: ReverseContext) -> frozenset[str]:
        ef, plan, _ = self._plan(site, ctx)
        for i in plan.results:  # read back where the backward finds them (`_read_results`): the engine is told
            ctx.note_result_read(site.state, ef.outputs[i].array)
        return frozenset(p.array for p in ef.inputs if p.symbol in plan.used)

    def reverse(self, site: OpSite, ctx: ReverseContext) -> None:
        ef, plan, where = self._plan(site, ctx)
        if not plan.gouts:
            return
        # results the tape happens to keep (read from the working copy): planned again only when there are any
        if ctx.keeps_result is not None and any(i not in plan.results and ctx.keeps_result(site, ef.outputs[i].array)
                                                for i in _result_ports(ef)):
            kept = _plan(ef, ctx, where, site.state, lambda array: ctx.keeps_result(site, array))
            if kept.results.keys() - plan.results.keys():
                plan = kept
        in_map = ef.map_entry is not None
        ranges = map_ranges(ef.map_entry) if in_map else None
        label = f"{site.state.label}"
        inputs: dict[str, dace.Memlet] = {}
        outputs: dict[str, dace.Memlet] = {}
        before: list[str] = []  # code reading elements through indices, before the contributions
        lines: list[tuple[str, sympy.Expr]] = []
        after: list[str] = []  # code writing elements through indices, after them
        later_clears: list[int] = []  # overwritten indirect outputs of a map: cleared by a map of their own

        pending = [p for p in ef.inputs if p.symbol in plan.used]
        while pending:  # direct ports first; an element read through an index after the ports of its index
            ready = [p for p in pending if not (_index_symbols(p) & {q.symbol for q in pending})]
            for j, port in ((ef.inputs.index(p), p) for p in ready):
                value = ctx.value_of(site.index, port.array)
                if port.indirect:
                    inputs[f"__v{j}"] = _whole(value, port)
                    before.append(f"{port.symbol.name} = __v{j}[{_index_code(port)}]")
                else:
                    inputs[port.symbol.name] = dace.Memlet(f"{value}[{port.subset}]")
            pending = [p for p in pending if p not in ready]

        for i, symbol in plan.results.items():
            value = ctx.value_of(site.index, ef.outputs[i].array)
            inputs[symbol.name] = dace.Memlet(f"{value}[{ef.outputs[i].subset}]")
        for i in plan.gouts:
            port = ef.outputs[i]
            grad = ctx.grad_of(port.array)
            assert grad is not None  # `gouts` holds the outputs with a gradient
            if not port.indirect:
                inputs[f"__gout{i}"] = dace.Memlet(f"{grad}[{port.subset}]")
                continue
            inputs[f"__gr{i}"] = _whole(grad, port)
            read = f"__gr{i}[{_index_code(port)}]"
            if in_map and port.wcr is None:
                winner = self._last_writers(site, ctx, ef, port, ranges)
                inputs[f"__win{i}"] = _whole(winner, port)
                read = f"({read} if (__win{i}[{_index_code(port)}] == ({_iteration_number(ef.map_entry, where)})) " \
                       "else 0)"
                later_clears.append(i)
            before.append(f"__gout{i} = {read}")

        overwritten = [(i, ef.outputs[i]) for i in plan.gouts if ef.outputs[i].wcr is None]
        for n, (i, port) in enumerate(sorted(overwritten, key=lambda t: str(t[1].key))):
            grad = ctx.grad_of(port.array)
            assert grad is not None  # one of `gouts`, which have a gradient
            value = plan.assigned.get(port.key, sympy.Integer(0))
            if not port.indirect:
                lines.append((f"__gset{n}", value))
                outputs[f"__gset{n}"] = dace.Memlet(f"{grad}[{port.subset}]")
            elif i not in later_clears:  # a single tasklet: set the element through its index
                lines.append((f"__gset{n}", value))
                outputs[f"__gc{n}"] = _whole(grad, port)
                after.append(f"__gc{n}[{_index_code(port)}] = __gset{n}")
        for j in plan.accumulated:
            port = ef.inputs[j]
            grad = ctx.grad_of(port.array)
            assert grad is not None  # a port with a contribution, which `_plan` gives only inputs with a gradient
            lines.append((f"__gin{j}", plan.contrib[j]))
            if port.indirect:
                outputs[f"__ga{j}"] = _whole(grad, port, SUM)
                after.append(f"__ga{j}[{_index_code(port)}] = __gin{j}")
            else:
                outputs[f"__gin{j}"] = dace.Memlet(f"{grad}[{port.subset}]", wcr=SUM)
        if outputs:
            single = _single_precision(ctx.sdfg, [*inputs.values(), *outputs.values()])
            code = "\n".join([*before, assignments_code(lines, single=single), *after]).strip()
            add_element_tasklet(ctx.new_state(f"reverse_{label}"), f"rev_{site.op.label}", ranges, inputs, code,
                                outputs)
        for i in later_clears:
            self._clear_written(site, ctx, ef, ef.outputs[i], ranges)

    @staticmethod
    def _index_inputs(site: OpSite, ctx: ReverseContext, ef: ElementFunction, port: Port) -> dict[str, dace.Memlet]:
        """Memlets of the ports the index of `port` reads (direct ports: an index read through an index of its
        own is refused here, the tasklets below read no arrays through indices)."""
        out = {}
        for p in ef.inputs:
            if p.symbol in _index_symbols(port):
                if p.indirect:
                    raise NotDifferentiableError(
                        f"'{site.op.label}' in state '{site.state.label}': an overwriting write through an index that "
                        "is itself read through an index", "compute the index into an array first")
                out[p.symbol.name] = dace.Memlet(f"{ctx.value_of(site.index, p.array)}[{p.subset}]")
        return out

    def _last_writers(self, site, ctx, ef, port: Port, ranges) -> str:
        """An int64 array holding, per element of `port.array`, the number of the last iteration writing it."""
        desc = ctx.sdfg.arrays[port.array]
        winner, _ = ctx.sdfg.add_array(f"gradflow_t_last_{port.array}", desc.shape, dace.int64, transient=True,
                                       find_new_name=True)
        fill(ctx.new_state(f"last_writer_{site.state.label}_init"), winner, "-1")
        add_element_tasklet(ctx.new_state(f"last_writer_{site.state.label}"), f"last_{port.array}", ranges,
                            self._index_inputs(site, ctx, ef, port),
                            f"__w[{_index_code(port)}] = {_iteration_number(ef.map_entry, site.op.label)}",
                            {"__w": _whole(winner, port, MAX)})
        return winner

    def _clear_written(self, site, ctx, ef, port: Port, ranges) -> None:
        grad = ctx.grad_of(port.array)
        add_element_tasklet(ctx.new_state(f"clear_{site.state.label}"), f"clear_{port.array}", ranges,
                            self._index_inputs(site, ctx, ef, port), f"__c[{_index_code(port)}] = 0",
                            {"__c": _whole(grad, port)})
