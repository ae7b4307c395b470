"""Store or recompute under a byte budget, solved exactly as a mixed-integer linear program.

`Forwarding.budget(max_bytes, sizes=...)` asks for the recompute set S that minimizes the work of the
reruns subject to the bytes the forward sweep keeps for the backward sweep (saved temporaries and the
tape; the program's own arguments are not counted) being at most `max_bytes`. The model states exactly
what the engine then does with S (`recompute.plan_recomputation`, `Reversal.record_overwrites`):

- binaries `x_a`: array a is in S (only arrays whose definition can be rerun somewhere);
- `need[b,p]`: the reverse of operation p needs b: 1 for the values its rule reads, and
  `need[c,p] >= need[a,p] + x_a - 1` for every input c of a's definition (a rerun needs its inputs);
  `need[a,p] + x_a <= 1` where a's definition cannot be rerun for p (the engine would refuse S);
- `rc[b,p] >= need[b,p] + x_b - 1`: b is rerun for p (costs the work of its definition times the number
  of times p's reverse runs); `st[b,p] >= need[b,p] - x_b`: b must be available from the forward;
- `t_b >= st[b,p]`: a temporary the backward reads is kept (its size); `u_w >= st[b,q]` for every q that
  may run before the overwrite w of b: w pushes the part it overwrites on the tape (the stack's size);
- bytes: `sum size_b t_b + sum stack_w u_w + (the tape of the control flow, which S does not change)`.
The objective is the work of the reruns plus that of the stacks (`cost.STORE_WORK` per element, the push
and the pop, calibrated by measurement; keeping a temporary alive costs nothing), so a plan that fits
the budget stores only where storing is cheaper than rerunning; it adds the bytes with a tiny weight, so
that among equally cheap plans the smallest wins.
Everything is evaluated at the sizes the user gives (`sizes=`), symbolic sizes otherwise being unknown.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import numpy as np

from gradflow.analysis.cost import STORE_WORK, evaluate, op_work
from gradflow.autodiff.recompute import Recomputability
from gradflow.autodiff.spec import Choice
from gradflow.core.errors import GradflowError, InvalidArgumentError, NotDifferentiableError

TOP_SLOT = 8  # one int64 per stack in gradflow_tape_top


@attrs.frozen(eq=False)
class BudgetError(InvalidArgumentError):
    """The byte budget is below the least any plan of this program needs; `minimum` says how many."""

    minimum: int = 0


@attrs.frozen(eq=False)
class OverBudgetError(GradflowError):
    """A plan built under a byte budget keeps more for the backward sweep than the budget at its sizes: a
    defect of gradflow (its model of the program and the program it built disagree), reported instead of
    returning a plan that breaks the promise."""


def check_within(plan, policy, heaps: tuple[str, ...] = ()) -> None:
    """Raise `OverBudgetError` unless `plan` (a `ForwardingPlan` as built) keeps at most the budget of
    `policy` at its sizes."""
    if policy.max_bytes is None:
        return
    sizes = dict(policy.sizes)
    if heaps:
        raise OverBudgetError(f"the plan for {policy.name} keeps stacks that grow while the program runs "
                              f"({', '.join(heaps)}): no byte count bounds them", "please report this program")
    try:
        kept = plan.total_bytes(sizes)
    except InvalidArgumentError as err:
        raise OverBudgetError(f"the plan for {policy.name} keeps arrays whose size the budget's sizes do not fix "
                              f"({err.message})", "please report this program") from None
    if kept > policy.max_bytes:
        raise OverBudgetError(f"the plan for {policy.name} keeps {kept} bytes for the backward sweep (predicted "
                              f"{plan.predicted.predicted_bytes if plan.predicted else '?'})",
                              "please report this program; Forwarding.budget(..., checkpoint=False) or "
                              "RECOMPUTE_ALL may serve meanwhile")


class _Model:
    """Variables and constraints of the MILP, built from the engine's own facts: the rows, and per
    variable its work (`cost`), its bytes (`bytes_of`) and whether it must stay 0 (`never`)."""

    def __init__(self) -> None:
        self.index: dict[tuple, int] = {}
        self.rows: list[tuple[dict[int, float], float, float]] = []
        self.cost: dict[tuple, float] = {}
        self.bytes_of: dict[tuple, float] = {}
        self.never: set[tuple] = set()

    def var(self, key: tuple) -> int:
        if key not in self.index:
            self.index[key] = len(self.index)
        return self.index[key]

    def row(self, coefs: Mapping[tuple, float], lo: float, hi: float) -> None:
        self.rows.append(({self.var(k): c for k, c in coefs.items()}, lo, hi))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(work per variable, bytes per variable, upper bounds, constraint matrix, row lows, row highs)."""
        n = len(self.index)
        weights, byte_row, upper = np.zeros(n), np.zeros(n), np.ones(n)
        for key, b in self.bytes_of.items():
            byte_row[self.index[key]] = b
        for key, c in self.cost.items():
            weights[self.index[key]] = c
        for key in self.never:
            upper[self.index[key]] = 0
        matrix = np.zeros((len(self.rows), n))
        lo, hi = np.empty(len(self.rows)), np.empty(len(self.rows))
        for r, (coefs, a, z) in enumerate(self.rows):
            for j, c in coefs.items():
                matrix[r, j] += c
            lo[r], hi[r] = a, z
        return weights, byte_row, upper, matrix, lo, hi


def _needs(model: _Model, sites: list, needs: list[frozenset[str]], accesses: list,
           facts: Recomputability, results: list[frozenset[str]]) -> dict[tuple[str, int], object]:
    """The `need` rows: what each operation's reverse needs (the values it read, and the results it reads
    back: rerun, those come from rerunning the operation itself), and (transitively) the inputs of the
    definitions rerun for it. Returns where each (array, operation) need can be rerun."""
    rerun_at: dict[tuple[str, int], object] = {}
    for p in sites:
        own = results[p.index] if p.index < len(results) else frozenset()
        frontier = [(b, p, b in own and b not in needs[p.index]) for b in sorted(needs[p.index] | own)]
        for b in needs[p.index] | own:
            model.row({("need", b, p.index): 1}, 1, 1)
        # every (array, reader) pair of the chains for p: an array is rerun for p only when one definition
        # serves every reader (`plan_recomputation` chains each reader and must find the plan this allows:
        # nb_resnet's `mean`, rerunnable for one reader and not for another, failed there at 10%)
        definitions: dict[str, set] = {}  # array -> the definitions its readers found (None: not rerunnable)
        first: dict[str, Any] = {}  # array -> the definition found first
        explored: set[tuple[str, int, bool]] = set()
        while frontier:
            b, reader, its_result = frontier.pop()
            if (b, reader.index, its_result) in explored:
                continue
            explored.add((b, reader.index, its_result))
            q = facts.rerunnable(b, reader, p, its_result)
            definitions.setdefault(b, set()).add(q.index if q is not None else None)
            if q is not None:
                frontier.extend((c, q, False) for c in sorted(accesses[q.index].reads))
                first.setdefault(b, q)
        for b, found in definitions.items():
            model.var(("need", b, p.index))
            if len(found) != 1 or None in found:
                continue
            rerun_at[(b, p.index)] = first[b]
            for c in sorted(accesses[first[b].index].reads):
                model.row({("need", c, p.index): 1, ("need", b, p.index): -1, ("x", b): -1}, -1, np.inf)
    return rerun_at


def _executions(rev, p, sizes: Mapping[str, int]) -> int:
    """How often the reverse of operation `p` runs, the weight of a rerun for it. Inside a loop checkpointed
    online (its trip count is known once it has run; its snapshots, not stacks, hold its state) a trip of
    that loop counts once: the weight only orders the reruns, and no count exists to price."""
    where = f"the trip count around '{p.state.label}'"
    if p.index in rev.tape_free:
        return evaluate(rev.trips(p.loops, unbounded=1), sizes, where)
    return evaluate(rev.priced_capacity(p.loops), sizes, where)


def _store_or_rerun(model: _Model, rev, rerun_at: dict, sizes: Mapping[str, int]) -> None:
    """The `rc` (rerun, its work) and `st` (available from the forward) rows of every need, and `t` (a
    temporary kept, its bytes)."""
    candidates = {b for b, _ in rerun_at}
    executions = {p.index: _executions(rev, p, sizes) for p in rev.sites}
    for key in [k for k in model.index if k[0] == "need"]:
        _, b, pi = key
        if b in candidates:
            x = ("x", b)
            if (b, pi) in rerun_at:
                q = rerun_at[(b, pi)]
                model.row({("rc", b, pi): 1, key: -1, x: -1}, -1, np.inf)
                work = rev.worst_case(op_work(q), q.loops)
                model.cost[("rc", b, pi)] = evaluate(work, sizes, f"the work of '{q.state.label}'") * executions[pi]
            else:
                model.row({key: 1, x: 1}, -np.inf, 1)  # cannot be rerun for this operation
            model.row({("st", b, pi): 1, key: -1, x: 1}, 0, np.inf)
        else:
            model.row({("st", b, pi): 1, key: -1}, 0, np.inf)
        desc = rev.sdfg.arrays[b]
        if desc.transient:
            model.row({("t", b): 1, ("st", b, pi): -1}, 0, np.inf)
            model.bytes_of[("t", b)] = evaluate(desc.total_size * desc.dtype.bytes, sizes, f"the size of '{b}'")


def _stacks(model: _Model, rev, accesses: list, sizes: Mapping[str, int]) -> None:
    """The `u` rows: an overwrite pushes what it overwrites when a stored value is read before it."""
    stored = {(k[1], k[2]) for k in model.index if k[0] == "st"}
    for w, b in rev.overwrite_sites(accesses):
        readers = [q for q in rev.sites if (b, q.index) in stored and rev.may_read_overwritten(q, w, b)]
        if not readers:
            continue
        key = ("u", w.index, b)
        for q in readers:
            model.row({key: 1, ("st", b, q.index): -1}, 0, np.inf)
        try:
            stack = evaluate(rev.stack_bytes(w, b, register=False), sizes, f"the stack of '{b}' at '{w.state.label}'")
            model.bytes_of[key] = stack + TOP_SLOT
            model.cost[key] = STORE_WORK * (stack // rev.sdfg.arrays[b].dtype.bytes)
        except NotDifferentiableError:  # a loop without a bound around the overwrite: it cannot be stored
            model.never.add(key)
            model.var(key)


def choose(rev, needs: list[frozenset[str]], accesses: list, max_bytes: int,
           sizes: Mapping[str, int], results: list[frozenset[str]] | None = None) -> Choice:
    """The cheapest recompute set within `max_bytes` (see the module docstring); `BudgetError` when no
    plan fits, naming the least bytes any plan needs. `results`: per operation, what its reverse reads of
    what it wrote (`ReverseContext.results_read`)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    model = _Model()
    rerun_at = _needs(model, rev.sites, needs, accesses, Recomputability(rev.sites, accesses), results or [])
    _store_or_rerun(model, rev, rerun_at, sizes)
    _stacks(model, rev, accesses, sizes)
    weights, byte_row, upper, matrix, lo, hi = model.arrays()
    constant = evaluate(rev.control_tape_bytes(), sizes, "the control-flow tape")
    structure = [LinearConstraint(matrix, lo, hi)] if len(model.rows) else []
    integral = np.ones(len(model.index))
    minimum = constant  # no reverse needs a forward value: nothing to choose (and milp refuses no variables)
    if model.index:
        least = milp(byte_row, constraints=structure, integrality=integral, bounds=Bounds(0, upper))
        if not least.success:
            raise NotDifferentiableError(f"the store/recompute model has no solution ({least.message})")
        minimum += int(round(least.fun))
    if max_bytes < minimum:
        raise BudgetError(f"no plan keeps at most {max_bytes} bytes for the backward sweep; the least any plan "
                          f"needs is {minimum} bytes", f"raise the budget to at least {minimum}", minimum)
    if not model.index:
        return Choice(frozenset(), constant, 0, constant)
    scale = max(1.0, float(weights.sum()))
    objective = weights + byte_row * (1e-6 / max(1.0, float(byte_row.sum()))) * scale
    budget_row = LinearConstraint(byte_row.reshape(1, -1), -np.inf, max_bytes - constant)
    best = milp(objective, constraints=structure + [budget_row], integrality=integral, bounds=Bounds(0, upper))
    if not best.success:
        raise NotDifferentiableError(f"the store/recompute model found no plan within the budget ({best.message})")
    values = best.x
    chosen = frozenset(k[1] for k, j in model.index.items() if k[0] == "x" and values[j] > 0.5)
    return Choice(chosen, int(round(float(byte_row @ values))) + constant, int(round(float(weights @ values))),
                  minimum)
