"""The tape: per-site stacks that carry forward values and control decisions to the backward sweep.

Each recording site (an operation about to overwrite part of an array, a while loop's trip count, the
branch a conditional took) owns one stack: a transient array with one slot per execution of the site
(the product of the trip-count bounds of the loops around it) and a stack-pointer symbol. The forward
sweep pushes (`tape[sp] = value; sp += 1`); the backward sweep pops in exactly the reverse order
(`sp -= 1; value = tape[sp]`). The stack pointers start at zero in a state placed before the program,
and their final values are saved into one small array (`gradflow_tape_top`) at its end, which the backward
sweep loads first: so the forward and backward sweeps can also run as separate SDFGs.
"""

from __future__ import annotations

import attrs
import dace
from dace import subsets
from dace.sdfg.state import ControlFlowRegion, SDFGState

from gradflow.autodiff.emit import mapped_tasklet, subset_elements

TOP = "gradflow_tape_top"


@attrs.define
class Stack:
    array: str  # the transient holding the slots
    sp: str  # the stack-pointer symbol
    slot: int  # index of this stack's final pointer in TOP


@attrs.define
class Tape:
    sdfg: dace.SDFG
    stacks: list[Stack] = attrs.field(factory=list)

    def new_stack(self, stem: str, capacity, item_shape: tuple, dtype) -> Stack:
        name, _ = self.sdfg.add_array(f"gradflow_tape_{stem}", (capacity,) + tuple(item_shape), dtype,
                                      transient=True, find_new_name=True)
        stack = Stack(name, f"gf_sp{len(self.stacks)}", len(self.stacks))
        self.stacks.append(stack)
        return stack

    # ---- forward sweep -------------------------------------------------------------------------------

    def push_subset(self, region: ControlFlowRegion, before, stack: Stack, array: str, subset: subsets.Range) -> None:
        """Before block `before`: save array[subset] to the next slot."""
        state = region.add_state_before(before, f"push_{stack.array}", is_start_block=region.start_block is before)
        region.out_edges(state)[0].data.assignments[stack.sp] = f"{stack.sp} + 1"
        _copy_subset(state, array, subset, stack.array, stack.sp, to_tape=True)

    def push_symbol(self, region: ControlFlowRegion, after, stack: Stack, symbol: str) -> None:
        """After block `after`: save the value of `symbol` to the next slot."""
        state = region.add_state_after(after, f"push_{stack.array}")
        region.add_state_after(state, f"pushed_{stack.array}", assignments={stack.sp: f"{stack.sp} + 1"})
        tasklet = state.add_tasklet(f"record_{symbol}", set(), {"__o"}, f"__o = {symbol}")
        state.add_edge(tasklet, "__o", state.add_write(stack.array), None, dace.Memlet(f"{stack.array}[{stack.sp}]"))

    def bracket(self, sdfg: dace.SDFG, last_forward_block) -> SDFGState | None:
        """Zero the stack pointers before the program and save them after `last_forward_block`.

        Returns the state that saves them (the new last forward block), or None without stacks."""
        if not self.stacks:
            return None
        start = sdfg.start_block
        sdfg.add_state_before(start, "gradflow_tape_start", is_start_block=True,
                              assignments={s.sp: "0" for s in self.stacks})
        sdfg.add_array(TOP, (len(self.stacks),), dace.int64, transient=True)
        save = sdfg.add_state_after(last_forward_block, "gradflow_tape_save")
        top = save.add_write(TOP)
        for s in self.stacks:
            t = save.add_tasklet(f"save_{s.sp}", set(), {"__o"}, f"__o = {s.sp}")
            save.add_edge(t, "__o", top, None, dace.Memlet(f"{TOP}[{s.slot}]"))
        return save

    # ---- backward sweep ------------------------------------------------------------------------------

    def load_pointers(self) -> dict[str, str]:
        """Interstate assignments that set every stack pointer to its final forward value."""
        return {s.sp: f"{TOP}[{s.slot}]" for s in self.stacks}

    def pop_subset(self, ctx, stack: Stack, array: str, subset: subsets.Range) -> None:
        """Restore array[subset] (in the backward's working copy `array`) from the top slot."""
        state = ctx.new_state(f"pop_{stack.array}", {stack.sp: f"{stack.sp} - 1"})
        _copy_subset(state, array, subset, stack.array, stack.sp, to_tape=False)

    def pop_symbol(self, ctx, stack: Stack, symbol: str) -> None:
        ctx.new_state(f"pop_{stack.array}", {stack.sp: f"{stack.sp} - 1"})
        ctx.new_state(f"popped_{stack.array}", {symbol: f"{stack.array}[{stack.sp}]"})


def _copy_subset(state: SDFGState, array: str, subset: subsets.Range, tape: str, sp: str, to_tape: bool) -> None:
    """tape[sp, 0:n0, 0:n1, ...] <-> array[b0 + p0*s0, ...] as a map (strided subsets included)."""
    ranges, params, element = subset_elements(subset, "__t")
    slot = ", ".join([sp] + params)
    src, dst = (f"{array}[{element}]", f"{tape}[{slot}]") if to_tape else (f"{tape}[{slot}]", f"{array}[{element}]")
    mapped_tasklet(state, f"{'push' if to_tape else 'pop'}_{array}", ranges or {"__t": "0:1"},
                   {"__i": dace.Memlet(src)}, "__o = __i", {"__o": dace.Memlet(dst)})
