"""The tape: per-site stacks that carry forward values and control decisions to the backward sweep.

Each recording site (an operation about to overwrite part of an array, a while loop's trip count, the
branch a conditional took, a symbol about to be reassigned) owns one stack. The forward sweep pushes,
the backward sweep pops in exactly the reverse order. There are two kinds of stack:

- *fixed*: a transient array with one slot per execution of the site (the product of the trip-count
  bounds of the loops around it) and a stack-pointer symbol (`tape[sp] = value; sp += 1`, and back). The
  pointers start at zero in a state placed before the program, and their final values are saved into one
  small array (`gradflow_tape_top`) at its end, which the backward sweep loads first: so the forward and
  backward sweeps can also run as separate SDFGs, the stacks crossing as arrays.
- *growable*, for a site whose number of executions gradflow cannot bound before the program runs (inside
  a while loop without a user bound, or a loop whose bound is a symbol assigned at run time): a heap buffer
  that doubles when full (`realloc`), held by a four-element int64 record `[address, capacity, count,
  item bytes]`. A push copies the item into a one-item staging array and a C++ tasklet appends it; a pop
  takes it back into the staging array. The record is cleared before the program and the buffer freed by
  `release`, after the backward sweep. The buffer lives within one call of the SDFG (see `split_vjp`).
"""

from __future__ import annotations

import math

import attrs
import dace
from dace import subsets, symbolic
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, SDFGState

from gradflow.autodiff.emit import mapped_tasklet, subset_elements

TOP = "gradflow_tape_top"

_GROW = """\
if (__r[2] >= __r[1]) {
    int64_t capacity = __r[1] < 16 ? 16 : 2 * __r[1];
    void* grown = std::realloc(reinterpret_cast<void*>(__r[0]), capacity * __r[3]);
    if (grown == nullptr) throw std::bad_alloc();
    __r[0] = reinterpret_cast<int64_t>(grown);
    __r[1] = capacity;
}
std::memcpy(reinterpret_cast<char*>(__r[0]) + __r[2] * __r[3], ITEM, __r[3]);
__r[2] += 1;
"""

_TAKE = """\
__r[2] -= 1;
std::memcpy(ITEM, reinterpret_cast<char*>(__r[0]) + __r[2] * __r[3], __r[3]);
"""

_FREE = """\
std::free(reinterpret_cast<void*>(__r[0]));
__r[0] = 0; __r[1] = 0; __r[2] = 0;
"""


@attrs.define
class Stack:
    array: str  # fixed: the transient holding the slots; growable: the one-item staging array
    sp: str | None  # fixed: the stack-pointer symbol
    slot: int | None  # fixed: index of this stack's final pointer in TOP
    record: str | None = None  # growable: the int64[4] heap record
    item_bytes: object = None  # growable: bytes per item (symbolic)

    @property
    def growable(self) -> bool:
        return self.record is not None

    @property
    def pointer(self) -> str:
        """The stack-pointer symbol of a fixed stack."""
        assert self.sp is not None, f"growable stack '{self.array}' has no stack pointer"
        return self.sp

    @property
    def heap_record(self) -> str:
        """The heap record of a growable stack."""
        assert self.record is not None, f"fixed stack '{self.array}' has no heap record"
        return self.record


@attrs.define
class Tape:
    sdfg: dace.SDFG
    stacks: list[Stack] = attrs.field(factory=list)  # fixed stacks, in slot order
    growable: list[Stack] = attrs.field(factory=list)
    popped: set[str] = attrs.field(factory=set)  # symbols the backward sweep sets from the tape

    def new_stack(self, stem: str, capacity, item_shape: tuple, dtype) -> Stack:
        """A stack for `capacity` items of `item_shape`; growable when `capacity` is None (unknown)."""
        if capacity is None:
            shape = tuple(item_shape) or (1,)
            name, _ = self.sdfg.add_array(f"gradflow_tape_{stem}", shape, dtype, transient=True, find_new_name=True)
            record, _ = self.sdfg.add_array(f"gradflow_heap_{stem}", (4,), dace.int64, transient=True,
                                            find_new_name=True)
            count = math.prod(shape) if all(isinstance(s, int) for s in shape) else symbolic.pystr_to_symbolic(
                " * ".join(f"({s})" for s in shape))
            stack = Stack(name, None, None, record, count * dtype.bytes)
            self.growable.append(stack)
            return stack
        name, _ = self.sdfg.add_array(f"gradflow_tape_{stem}", (capacity,) + tuple(item_shape), dtype,
                                      transient=True, find_new_name=True)
        stack = Stack(name, f"gf_sp{len(self.stacks)}", len(self.stacks))
        self.stacks.append(stack)
        return stack

    # ---- forward sweep -------------------------------------------------------------------------------

    def push_subset(self, region: ControlFlowRegion, before, stack: Stack, array: str, subset: subsets.Range,
                    guard: str | None = None) -> None:
        """Before block `before`: save array[subset] to the next slot; with a `guard`, only where it holds
        (`pop_subset` takes the same guard, so the pushes and pops still pair up)."""
        if guard is not None:
            branch = _guarded_branch(region, before, f"guard_{stack.array}", guard)
            self.push_subset(branch, branch.add_state(f"pushed_{stack.array}", is_start_block=True), stack, array,
                             subset)
            return
        state = region.add_state_before(before, f"push_{stack.array}", is_start_block=region.start_block is before)
        if stack.growable:
            _copy_subset(state, array, subset, stack.array, None, to_tape=True)
            _heap_call(state, stack, _GROW, "push")
            return
        region.out_edges(state)[0].data.assignments[stack.sp] = f"{stack.sp} + 1"
        _copy_subset(state, array, subset, stack.array, stack.sp, to_tape=True)

    def push_symbol(self, region: ControlFlowRegion, after, stack: Stack, symbol: str) -> SDFGState:
        """After block `after`: save the value of `symbol` to the next slot. Returns the last state added."""
        state = region.add_state_after(after, f"push_{stack.array}")
        tasklet = state.add_tasklet(f"record_{symbol}", {}, {"__o": None}, f"__o = {symbol}")
        if stack.growable:
            staging = state.add_access(stack.array)
            state.add_edge(tasklet, "__o", staging, None, dace.Memlet(f"{stack.array}[0]"))
            _heap_call(state, stack, _GROW, "push", staging)
            return state
        state.add_edge(tasklet, "__o", state.add_write(stack.array), None, dace.Memlet(f"{stack.array}[{stack.sp}]"))
        return region.add_state_after(state, f"pushed_{stack.array}", assignments={stack.sp: f"{stack.sp} + 1"})

    def push_symbol_before(self, region: ControlFlowRegion, before, stack: Stack, symbol: str) -> None:
        """Before block `before`: save the value of `symbol` to the next slot."""
        state = region.add_state_before(before, f"save_{stack.array}", is_start_block=region.start_block is before)
        self.push_symbol(region, state, stack, symbol)

    def bracket(self, sdfg: dace.SDFG, last_forward_block, initial: dict[str, str] | None = None) -> SDFGState | None:
        """Zero the stack pointers, clear the heap records and set the symbols in `initial` before the
        program; save the pointers after `last_forward_block`. Returns the state that saves them (the new
        last forward block), or None."""
        if not self.stacks and not self.growable:
            return None
        start = sdfg.start_block
        begin = sdfg.add_state_before(start, "gradflow_tape_start", is_start_block=True,
                                      assignments={**(initial or {}), **{s.pointer: "0" for s in self.stacks}})
        for stack in self.growable:
            values = ("0", "0", "0", symbolic.symstr(stack.item_bytes))
            tasklet = begin.add_tasklet(f"clear_{stack.record}", set(), {f"__o{k}" for k in range(4)},
                                        "\n".join(f"__o{k} = {v}" for k, v in enumerate(values)))
            node = begin.add_write(stack.record)
            for k in range(4):
                begin.add_edge(tasklet, f"__o{k}", node, None, dace.Memlet(f"{stack.record}[{k}]"))
        if not self.stacks:
            return None
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
        return {s.pointer: f"{TOP}[{s.slot}]" for s in self.stacks}

    def pop_subset(self, ctx, stack: Stack, array: str, subset: subsets.Range, guard: str | None = None) -> None:
        """Restore array[subset] (in the backward's working copy `array`) from the top slot; with a `guard`
        (the push's), only where it holds."""
        if guard is not None:
            block = ConditionalBlock(f"guard_{stack.array}", sdfg=ctx.sdfg)
            ctx.add_block(block)
            branch = ControlFlowRegion(f"guarded_{stack.array}", sdfg=ctx.sdfg)
            block.add_branch(guard, branch)
            with ctx.inside(branch):
                self.pop_subset(ctx, stack, array, subset)
            return
        if stack.growable:
            state = ctx.new_state(f"pop_{stack.array}")
            staging = state.add_access(stack.array)
            _heap_call(state, stack, _TAKE, "pop", staging)
            _copy_subset(state, array, subset, stack.array, None, to_tape=False, source=staging)
            return
        state = ctx.new_state(f"pop_{stack.array}", {stack.sp: f"{stack.sp} - 1"})
        _copy_subset(state, array, subset, stack.array, stack.sp, to_tape=False)

    def pop_symbol(self, ctx, stack: Stack, symbol: str) -> None:
        """Set `symbol` to the value on top of the stack."""
        self.popped.add(symbol)
        if stack.growable:
            state = ctx.new_state(f"pop_{stack.array}")
            _heap_call(state, stack, _TAKE, "pop", state.add_access(stack.array))
            ctx.new_state(f"popped_{stack.array}", {symbol: f"{stack.array}[0]"})
            return
        ctx.new_state(f"pop_{stack.array}", {stack.sp: f"{stack.sp} - 1"})
        ctx.new_state(f"popped_{stack.array}", {symbol: f"{stack.array}[{stack.sp}]"})

    def records(self) -> tuple[str, ...]:
        """The heap records of the growable stacks (what `release` frees)."""
        return tuple(s.heap_record for s in self.growable)


def _guarded_branch(region: ControlFlowRegion, before, label: str, guard: str) -> ControlFlowRegion:
    """A conditional inserted before block `before` of `region` (the edges into `before` now enter it), and
    its one branch, taken where `guard` holds, empty."""
    block = ConditionalBlock(label, sdfg=region.sdfg)
    was_start = region.start_block is before
    region.add_node(block, ensure_unique_name=True)
    for e in list(region.in_edges(before)):
        region.add_edge(e.src, block, e.data)
        region.remove_edge(e)
    region.add_edge(block, before, dace.InterstateEdge())
    if was_start:
        region.start_block = region.node_id(block)
    branch = ControlFlowRegion(f"{label}_taken", sdfg=region.sdfg)
    block.add_branch(guard, branch)
    return branch


def release(state: SDFGState, records) -> None:
    """Free the heap buffers of the growable stacks with these records (in `state`)."""
    for record in records:
        tasklet = state.add_tasklet(f"free_{record}", {}, {"__r": None}, _FREE, language=dace.Language.CPP)
        state.add_edge(tasklet, "__r", state.add_write(record), None, dace.Memlet(f"{record}[0:4]"))


def heap_call(node) -> str | None:
    """"push" or "pop" for the C++ tasklet of a growable stack's heap (`_heap_call`), else None."""
    if not isinstance(node, dace.nodes.Tasklet) or node.language != dace.Language.CPP:
        return None
    code = node.code.as_string.strip()
    for kind, template in (("push", _GROW), ("pop", _TAKE)):
        if any(code == template.replace("ITEM", item).strip() for item in ("&__item", "__item")):
            return kind
    return None


def heap_code(kind: str, items: list[tuple[str, bool]]) -> str:
    """The code of a heap push (`kind` "push") or pop of several items of one stack's item size, each a
    (connector, scalar) pair, in that order; a pop takes them in reverse, so pops mirror pushes."""
    template = _GROW if kind == "push" else _TAKE
    ordered = items if kind == "push" else items[::-1]
    return "".join(template.replace("ITEM", f"&{c}" if scalar else c) for c, scalar in ordered)


def _heap_call(state: SDFGState, stack: Stack, code: str, what: str, staging=None) -> None:
    """A C++ tasklet that appends the staging array to (`_GROW`) or takes it from (`_TAKE`) the heap."""
    desc = state.sdfg.arrays[stack.array]
    item = dace.Memlet.from_array(stack.array, desc)
    pushing = code == _GROW
    scalar = desc.total_size == 1  # DaCe hands a one-element memlet to a tasklet as a value, not a pointer
    code = code.replace("ITEM", "&__item" if scalar else "__item")
    tasklet = state.add_tasklet(f"{what}_{stack.array}", {"__item": None} if pushing else {},
                                {"__r": None} if pushing else {"__r": None, "__item": None}, code,
                                language=dace.Language.CPP)
    state.add_edge(tasklet, "__r", state.add_write(stack.record), None, dace.Memlet(f"{stack.record}[0:4]"))
    node = staging if staging is not None else next(
        n for n in state.data_nodes() if n.data == stack.array and state.out_degree(n) == 0)
    if pushing:
        state.add_edge(node, None, tasklet, "__item", item)
    else:
        state.add_edge(tasklet, "__item", node, None, item)


def _copy_subset(state: SDFGState, array: str, subset: subsets.Range, tape: str, sp: str | None, to_tape: bool,
                 source=None) -> None:
    """tape[sp, 0:n0, 0:n1, ...] <-> array[b0 + p0*s0, ...] as a map (strided subsets included); without
    `sp` (a growable stack's staging array) the tape side has no slot index."""
    ranges, params, element = subset_elements(subset, "__t")
    slot = ", ".join(([sp] if sp is not None else []) + params) or "0"
    src, dst = (f"{array}[{element}]", f"{tape}[{slot}]") if to_tape else (f"{tape}[{slot}]", f"{array}[{element}]")
    tasklet, entry, exit_ = mapped_tasklet(state, f"{'push' if to_tape else 'pop'}_{array}",
                                           ranges or {"__t": "0:1"}, {"__i": dace.Memlet(src)}, "__o = __i",
                                           {"__o": dace.Memlet(dst)})
    if source is not None:  # read the staging array the heap call wrote, not a fresh access node
        for e in list(state.in_edges(entry)):
            if e.src.data == tape:
                fresh = e.src
                state.add_edge(source, e.src_conn, e.dst, e.dst_conn, e.data)
                state.remove_edge(e)
                if state.degree(fresh) == 0:
                    state.remove_node(fresh)
