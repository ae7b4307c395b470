"""Hypothesis strategies that write fuzz programs (`programs()`), so a failing program shrinks.

Productions: elementwise expressions of the table's functions (`rules/elementwise.toml`, each argument
squashed into the function's domain), reductions (sum, max, min, prod, mean; along an axis), products of
slices (dot, matrix-vector, matrix-matrix through a transpose); slices with steps and offsets; in-place
updates (`+=`, `-=`, `*=`) of arguments and temporaries through overlapping slices; `for` loops of any step
and sign, triangular nests, trip counts from an argument and from data; data-dependent `while` loops and
`break`; accumulators that read their own target (`acc[0] = acc[0] * c + e`, `S[0] += S[0] * c`);
conditionals on data and on the loop variable; conversions to integers (`astype`, assignment into an
integer array); gathers and scatters through index arrays with repeated indices; nested programs; maps
(`dace.map`) of scalar code writing some elements of each row of a zeroed temporary; positions as weights
(`np.arange(N) * 0.25`); stops of the gradient (`stop_gradient(e)`, outside maps' scalar code); chains
of shifted slice statements over one dimension.

Shapes are tracked as keys (`Span.key`): two operands of an element-wise operation always have equal keys,
so a program is well formed whatever sizes it runs at; every index stays inside its array (each loop
variable carries the offsets it may be read at).
"""

from __future__ import annotations

import functools
from typing import Sequence

import attrs
from hypothesis import strategies as st

from gradflow.verify.fuzz.program import (
    Arange, Argument, Assign, At, Break, Call, CallHelper, Cond, Define, For, Helper, If, Map, MatMul, Num, Op,
    Program, Read, Reduce, Span, Stop, Transpose, Via, While,
)

Shape = tuple  # of keys: () for a scalar, (key,) or (key, key) for arrays (see `Span.key`)


@functools.cache
def _functions() -> tuple[tuple[str, float, float], ...]:
    """(numpy spelling, domain centre, domain radius) of the table's one-argument functions numpy has."""
    from gradflow.core.elementwise import elementwise_table

    found = []
    for entry in elementwise_table():
        spelling = next((s for s in entry.spellings if s.startswith("np.")), None)
        # np.absolute spells abs again; cbrt's slope is unbounded at 0, inside its domain, where central
        # differences of the twin cannot check a gradient
        if spelling is None or len(entry.args) != 1 or spelling in ("np.absolute", "np.cbrt"):
            continue
        lo, hi = entry.domain[entry.args[0]]
        found.append((spelling, round((lo + hi) / 2, 3), round((hi - lo) / 2 * 0.95, 3)))
    return tuple(sorted(found))


def full(dim) -> tuple:
    return (dim, 1, 0)


@attrs.define
class Var:
    """A loop variable over dimension `dim`: `var + k` is a valid index for `low <= k <= high`."""

    dim: object
    low: int
    high: int


@attrs.define
class Scope:
    """What a statement may use: arrays (name -> dims) it may read, those it may write, loop variables,
    index arrays (name -> (length, dim indexed)), whether it is inside a loop, the names taken so far."""

    reads: dict
    writes: dict
    ints: dict = attrs.field(factory=dict)
    loop_vars: dict = attrs.field(factory=dict)
    indices: dict = attrs.field(factory=dict)
    in_loop: bool = False
    in_for: bool = False
    depth: int = 0  # how many loops and branches enclose the statement
    counter: list = attrs.field(factory=lambda: [0])
    helpers: list = attrs.field(factory=list)
    features: frozenset = frozenset()
    scalar: bool = False  # scalar code only (a map's body): element reads, calls and arithmetic

    def child(self, **changes) -> "Scope":
        return attrs.evolve(self, reads=dict(self.reads), writes=dict(self.writes), ints=dict(self.ints),
                            loop_vars=dict(self.loop_vars), **changes)

    def fresh(self, prefix: str) -> str:
        self.counter[0] += 1
        return f"{prefix}{self.counter[0]}"


# ---- indices ----------------------------------------------------------------------------------------------

@st.composite
def point(draw, scope: Scope, dim) -> At:
    """One valid index into a dimension `dim`."""
    vars_here = [v for v, info in scope.loop_vars.items() if info.dim == dim]
    if vars_here and draw(st.booleans()):
        var = draw(st.sampled_from(sorted(vars_here)))
        info = scope.loop_vars[var]
        return At(var, draw(st.integers(info.low, info.high)))
    if isinstance(dim, int):
        return At(None, draw(st.integers(0, dim - 1)))
    if draw(st.booleans()):
        return At(None, draw(st.integers(0, 3)))
    return At(dim, -draw(st.integers(1, 3)))


@st.composite
def span_for(draw, key) -> Span:
    dim, step, cut = key
    lo = draw(st.integers(0, cut))
    return Span(lo, cut - lo, step, dim)


def span_key(dim) -> st.SearchStrategy:
    """A slice length key of a dimension: a step and how much is cut off the ends."""
    if isinstance(dim, int):
        return st.just(full(dim))
    # strided slices are rarer: DaCe 2.0.0b1 miscompiles several of their forms (reported apart as `dace`)
    return st.tuples(st.just(dim), st.sampled_from([1] * 10 + [2, 3]), st.integers(0, 2))


# ---- expressions ------------------------------------------------------------------------------------------

def _readers(scope: Scope, shape: Shape) -> list[tuple[str, tuple]]:
    """(array, dims) that can be indexed to give `shape`."""
    found = []
    for name, dims in sorted({**scope.reads, **scope.ints}.items()):
        if isinstance(dims, tuple) and dims and dims[0] == "temp":  # a temporary: read whole, shape as defined
            if dims[1] == shape:
                found.append((name, dims))
            continue
        if len(shape) <= len(dims) and _dims_match(dims, shape):
            found.append((name, dims))
    return found


def _dims_match(dims: tuple, shape: Shape) -> bool:
    """An array of `dims` can give `shape` when its sliced dimensions, in order, are those of the keys."""
    want = [k[0] for k in shape]
    for picked in _subsequences(len(dims), len(want)):
        if [dims[p] for p in picked] == want:
            return True
    return False


def _subsequences(n: int, k: int):
    if k == 0:
        yield ()
        return
    for first in range(n):
        for rest in _subsequences(n - first - 1, k - 1):
            yield (first,) + tuple(first + 1 + r for r in rest)


def _gather(draw, scope: Scope, shape: Shape) -> Read | None:
    """A read through an index array: `x[idx[q]]` in the scatter loop over `q`, or `x[idx]` (a vector of
    the index array's length), from a one-dimensional array over the dimension the indices address."""
    for idx_name, (length, dim) in sorted(scope.indices.items()):
        if not idx_name.startswith("idx"):
            continue
        sources = sorted(a for a, d in scope.reads.items() if d == (dim,))
        var = f"q_{idx_name}"
        if sources and not shape and var in scope.loop_vars:
            return Read(draw(st.sampled_from(sources)), (Via(idx_name, var),))
        if sources and shape == (full(length),):
            return Read(draw(st.sampled_from(sources)), (Via(idx_name, None),))
    return None


@st.composite
def read(draw, scope: Scope, shape: Shape) -> Read | None:
    if "gather" in scope.features and draw(st.integers(0, 3)) == 0:
        found = _gather(draw, scope, shape)
        if found is not None:
            return found
    options = _readers(scope, shape)
    if not options:
        return None
    name, dims = draw(st.sampled_from(options))
    if dims[0] == "temp":
        return Read(name)
    want = [k[0] for k in shape]
    choices = [p for p in _subsequences(len(dims), len(want)) if [dims[i] for i in p] == want]
    picked = draw(st.sampled_from(choices))
    index = []
    keys = iter(shape)
    for d, dim in enumerate(dims):
        if d in picked:
            index.append(draw(span_for(next(keys))))
        else:
            index.append(draw(point(scope, dim)))
    if shape and all(isinstance(i, Span) and i.lo == 0 and i.hi == 0 and i.step == 1 for i in index) \
            and draw(st.booleans()):
        return Read(name)
    return Read(name, tuple(index))


def _leaf(draw, scope: Scope, shape: Shape):
    if len(shape) == 1 and shape[0][1] == 1 and "arange" in scope.features and draw(st.integers(0, 5)) == 0:
        dim, _, cut = shape[0]  # positions as weights, `np.arange(N - cut) * scale`
        length = At(dim, -cut) if isinstance(dim, str) else At(None, dim - cut)
        return Arange(length, draw(st.sampled_from([0.25, -0.5, 0.125])))
    found = draw(read(scope, shape))
    if found is not None and (shape or draw(st.integers(0, 3)) > 0):
        return found
    if not shape:
        return Num(draw(st.sampled_from([0.5, 1.5, -0.75, 2.0, 0.1, -1.25, 3.0])))
    return found  # None when nothing has this shape


@st.composite
def expr(draw, scope: Scope, shape: Shape, depth: int):
    """An expression of `shape` (None when no array has it and it cannot be built)."""
    if depth <= 0:
        return _leaf(draw, scope, shape)
    kinds = ["leaf", "call", "op", "op", "minmax"] + ([] if scope.scalar else ["reduce", "product", "transpose"])
    if "stop" in scope.features and not scope.scalar:
        kinds.append("stop")
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        return _leaf(draw, scope, shape)
    if kind == "stop":
        inner = draw(expr(scope, shape, depth - 1))
        return None if inner is None else Stop(inner)
    if kind == "call":
        spelling, center, radius = draw(st.sampled_from(_functions()))
        inner = draw(expr(scope, shape, depth - 1))
        if inner is None:
            return None
        return Call(spelling, inner, center, radius)
    if kind in ("op", "minmax"):
        left = draw(expr(scope, shape, depth - 1))
        right_shape = shape if draw(st.booleans()) else ()
        right = draw(expr(scope, right_shape, depth - 1))
        if left is None or right is None:
            return left if left is not None and right is None else None
        if kind == "minmax":
            op = draw(st.sampled_from(["max", "min"]))
        else:
            op = draw(st.sampled_from(["+", "-", "*", "*", "/", "**"]))
        if op == "**":
            right = Num(draw(st.sampled_from([2.0, 3.0, 0.5, -1.0])))
        if draw(st.booleans()) and op in "+*":
            left, right = right, left
        return Op(op, left, right)
    if kind == "reduce" and len(shape) <= 1:
        if shape:  # along an axis of a matrix
            other = draw(_some_key(scope))
            arg_shape, axis = ((shape[0], other), 1) if draw(st.booleans()) else ((other, shape[0]), 0)
        else:
            arg_shape, axis = draw(_some_shape(scope)), None
        arg = draw(expr(scope, arg_shape, depth - 1))
        if arg is None or not arg_shape:
            return None
        return Reduce(draw(st.sampled_from(["sum", "sum", "max", "min", "prod", "mean"])), arg, axis)
    if kind == "product":
        inner = draw(_some_key(scope))
        if not shape:
            left, right = draw(expr(scope, (inner,), depth - 1)), draw(expr(scope, (inner,), depth - 1))
        elif len(shape) == 1:
            if draw(st.booleans()):
                left, right = draw(expr(scope, (shape[0], inner), depth - 1)), draw(expr(scope, (inner,), depth - 1))
            else:
                left, right = draw(expr(scope, (inner,), depth - 1)), draw(expr(scope, (inner, shape[0]), depth - 1))
        else:
            left, right = draw(expr(scope, (shape[0], inner), depth - 1)), draw(expr(scope, (inner, shape[1]), depth - 1))
        if left is None or right is None:
            return None
        return MatMul(left, right)
    if kind == "transpose" and len(shape) == 2:
        arg = draw(expr(scope, (shape[1], shape[0]), depth - 1))
        return None if arg is None else Transpose(arg)
    return _leaf(draw, scope, shape)


@st.composite
def some_expr(draw, scope: Scope, shape: Shape, depth: int):
    """An expression of `shape`, falling back to simpler ones (a constant for a scalar)."""
    for _ in range(3):
        found = draw(expr(scope, shape, depth))
        if found is not None:
            return found
    found = _leaf(draw, scope, shape)
    return found if found is not None or shape else Num(1.0)


def _dims(scope: Scope) -> list:
    dims = set()
    for d in scope.reads.values():
        if d and d[0] != "temp":
            dims |= set(d)
    if "gather" in scope.features:  # vectors as long as an index array: what `x[idx]` gives
        dims |= {length for name, (length, _) in scope.indices.items() if name.startswith("idx")}
    return sorted(dims, key=str)


@st.composite
def _some_key(draw, scope: Scope):
    dims = [d for d in _dims(scope) if d != 1]
    return draw(span_key(draw(st.sampled_from(dims))))


@st.composite
def _some_shape(draw, scope: Scope) -> Shape:
    rank = draw(st.sampled_from([1, 1, 2]))
    keys = tuple(draw(_some_key(scope)) for _ in range(rank))
    return keys


# ---- statements -------------------------------------------------------------------------------------------

@st.composite
def target(draw, scope: Scope) -> tuple[Read, Shape] | None:
    """A place to write: an element or slice of a writable array, or a whole temporary."""
    if not scope.writes:
        return None
    name = draw(st.sampled_from(sorted(scope.writes)))
    dims = scope.writes[name]
    if dims[0] == "temp":
        return Read(name, (Span(0, 0, 1, 0),) * len(dims[1])) if dims[1] else None, dims[1]
    index, shape = [], []
    for dim in dims:
        if draw(st.booleans()) and not (scope.in_loop and draw(st.booleans())):
            key = draw(span_key(dim))
            index.append(draw(span_for(key)))
            shape.append(key)
        else:
            index.append(draw(point(scope, dim)))
    return Read(name, tuple(index)), tuple(shape)


@st.composite
def assign(draw, scope: Scope):
    found = draw(target(scope))
    if found is None or found[0] is None:
        return None
    place, shape = found
    value_shape = shape if not shape or draw(st.integers(0, 3)) else ()
    value = draw(some_expr(scope, value_shape, draw(st.integers(1, 3))))
    if value is None:
        return None
    op = draw(st.sampled_from(["=", "=", "+=", "-=", "*="]))
    if op == "=" and not shape and "accumulate" in scope.features and draw(st.booleans()):
        # an accumulator reading its own target: `a[k] = a[k] * c + e`
        value = Op("+", Op("*", place, Num(draw(st.sampled_from([0.5, 0.9, 1.1, -0.3])))), value)
    return Assign(place, op, value)


@st.composite
def define(draw, scope: Scope):
    shape = draw(st.one_of(st.just(()), _some_shape(scope)))
    if shape and "view" in scope.features and draw(st.integers(0, 2)) == 0:
        value = draw(read(scope, shape))  # `v = x[1:N - 1]`: a view, through which later writes reach x
    else:
        value = draw(some_expr(scope, shape, draw(st.integers(1, 3))))
    if value is None:
        return None
    name = scope.fresh("t")
    if "cast" in scope.features and draw(st.integers(0, 4)) == 0 and shape and len(shape) == 1 \
            and shape[0][1:] == (1, 0):
        # a conversion to integers: assigned into an int64 array, or astype
        scope.ints[name] = (shape[0][0],)
        if draw(st.booleans()):
            return [Define(name, zeros=(shape[0][0],), dtype="int64"),
                    Assign(Read(name, (Span(0, 0, 1, shape[0][0]),)), "=", Op("*", value, Num(3.0)))]
        return [Define(name, Op("*", value, Num(3.0)), dtype="int64")]
    scope.reads[name] = ("temp", shape)
    if shape:
        scope.writes[name] = ("temp", shape)
    return [Define(name, value)]


@st.composite
def loop(draw, scope: Scope):
    dims = [d for d in _dims(scope) if d != 1 and not isinstance(d, int)]
    if not dims:
        return None
    dim = draw(st.sampled_from(dims))
    var = scope.fresh("i")
    lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    step = draw(st.sampled_from([1, 1, 1, 2, 3, -1, -1, -2]))
    outer = [v for v, info in scope.loop_vars.items() if info.dim == dim]
    trips = [a for a in scope.indices if a.startswith("T") or a.startswith("cnt")]
    if outer and "triangular" in scope.features and draw(st.booleans()) and step == 1:
        # a triangular nest: for j in range(lo, i) / range(i + 1, dim - hi)
        o = draw(st.sampled_from(sorted(outer)))
        if draw(st.booleans()):  # j in [0, o - 1]: o + k is valid for k <= high, so j + k is too
            start, stop, valid = At(None, 0), At(o, 0), Var(dim, 0, scope.loop_vars[o].high)
        else:  # j in [o + 1, dim - 1 - hi], o >= 0
            start, stop, valid = At(o, 1), At(dim, -hi), Var(dim, -1, hi)
        body_scope = scope.child(in_loop=True, in_for=True, depth=scope.depth + 1)
        body_scope.loop_vars[var] = valid
        return For(var, start, stop, 1, tuple(draw(block(body_scope, 3))))
    if step > 0:
        start, stop = At(None, lo), At(dim, -hi)
    else:
        start, stop = At(dim, -1 - hi), At(None, lo - 1)
    if step == 1 and trips and "trips" in scope.features and draw(st.integers(0, 2)) == 0:
        name = draw(st.sampled_from(sorted(trips)))
        if scope.indices[name][1] == dim:
            stop = name if name.startswith("T") else f"{name}[0]"
    body_scope = scope.child(in_loop=True, in_for=True, depth=scope.depth + 1)
    body_scope.loop_vars[var] = Var(dim, -lo, hi)
    body = draw(block(body_scope, 3))
    if scope.in_loop is False and "break" in scope.features and draw(st.integers(0, 4)) == 0:
        cond = draw(condition(body_scope))
        body = body + [Break(cond)]
    return For(var, start, stop, step, tuple(body))


@st.composite
def condition(draw, scope: Scope) -> Cond:
    if scope.loop_vars and draw(st.integers(0, 3)) == 0:
        var = draw(st.sampled_from(sorted(scope.loop_vars)))
        return Cond(Read(var), ">", 2.5)
    left = draw(some_expr(scope, (), draw(st.integers(0, 2))))
    if "Read(" not in repr(left):  # a condition on data, not on constants
        data = draw(read(scope, ()))
        left = left if data is None else Op("+", left, data)
    return Cond(left, draw(st.sampled_from([">", "<"])), draw(st.sampled_from([0.0, 0.3, -0.2, 1.0])))


@st.composite
def branch(draw, scope: Scope):
    cond = draw(condition(scope))
    then = draw(block(scope.child(depth=scope.depth + 1), 2))
    orelse = draw(block(scope.child(depth=scope.depth + 1), 2)) if draw(st.booleans()) else []
    return If(cond, tuple(then), tuple(orelse))


@st.composite
def while_loop(draw, scope: Scope):
    counter = scope.fresh("c")
    limit = draw(st.sampled_from([1.0, 2.0, 3.0]))
    inner = scope.child(in_loop=True, depth=scope.depth + 1)
    increment = draw(some_expr(inner, (), 1))
    body = draw(block(inner, 2))
    return [Define(counter, zeros=(1,)), While(counter, limit, increment, tuple(body))]


@st.composite
def scatter(draw, scope: Scope):
    """`for q in range(K): y[idx[q]] op= e(q)`: a scatter (repeated indices accumulate)."""
    if not scope.indices:
        return None
    options = [n for n in scope.indices if n.startswith("idx")]
    if not options:
        return None
    name = draw(st.sampled_from(sorted(options)))
    length, dim = scope.indices[name]
    targets = [a for a, d in scope.writes.items() if d == (dim,)]
    if not targets:
        return None
    var = f"q_{name}"
    inner = scope.child(in_loop=True, in_for=True, depth=scope.depth + 1)
    inner.loop_vars[var] = Var(length, 0, 0)
    value = draw(some_expr(inner, (), 2))
    place = Read(draw(st.sampled_from(sorted(targets))), (Via(name, var),))
    return For(var, At(None, 0), At(None, length), 1, (Assign(place, draw(st.sampled_from(["+=", "="])), value),))


@st.composite
def map_fill(draw, scope: Scope):
    """`z = np.zeros((D, E)); for i in dace.map[0:D]: z[i, k] = e(i) ...`: a map writing some elements of each
    row of a fresh zeroed temporary (the rest keep their zeros), its body scalar code (element reads, calls,
    arithmetic) that reads anything but `z`, as a kernel's map over points is written (GradBench's ba, ht)."""
    dims = [d for d in _dims(scope) if d != 1 and not isinstance(d, int)]
    if not dims:
        return None
    dim = draw(st.sampled_from(dims))
    other = draw(st.sampled_from([None, "N", "M"]))
    name, var = scope.fresh("z"), scope.fresh("i")
    inner = scope.child(in_loop=True, depth=scope.depth + 1, scalar=True)
    inner.loop_vars[var] = Var(dim, 0, 0)
    body = []
    for _ in range(draw(st.integers(1, 3))):
        value = draw(some_expr(inner, (), draw(st.integers(1, 3))))
        if value is None:
            continue
        index = (At(var, 0),) if other is None else (At(var, 0), At(None, draw(st.integers(0, 3))))
        body.append(Assign(Read(name, index), draw(st.sampled_from(["=", "=", "+="])), value))
    if not body:
        return None
    zeros = (dim,) if other is None else (dim, other)
    scope.reads[name] = ("temp", tuple(full(d) for d in zeros))
    scope.writes[name] = scope.reads[name]
    return [Define(name, zeros=zeros), Map(var, dim, tuple(body))]


@st.composite
def chain(draw, scope: Scope):
    """Two to four slice statements over one dimension, each writing a vector at some offset and computing
    from slices of the same length at others (`k2[1:] = x0[1:] * (k1[:N - 1] + 0.5)`): the shifted
    element-wise chains `tile_element_chains` runs block by block (Runge-Kutta stages, stencils applied
    twice), which statements drawn one by one rarely line up. Outside loops it writes mostly into fresh
    zeroed stage vectors, which the loss reads; a statement does not read its own target (through an
    overlapping slice that is a copy first, which the pass leaves alone: the grammar's other statements
    draw those)."""
    dims = sorted({d[0] for d in scope.writes.values() if len(d) == 1 and isinstance(d[0], str)})  # not temps
    if not dims:
        return None
    dim = draw(st.sampled_from(dims))
    key = (dim, 1, draw(st.integers(1, 2)))
    out: list = []
    stages = []
    for _ in range(0 if scope.in_loop else draw(st.integers(1, 2))):  # defined outside loops, as `define` does
        stages.append(scope.fresh("k"))
        out.append(Define(stages[-1], zeros=(dim,)))
        scope.reads[stages[-1]] = scope.writes[stages[-1]] = (dim,)
    targets = sorted(a for a, d in scope.writes.items() if d == (dim,))
    for _ in range(draw(st.integers(2, 4))):
        name = draw(st.sampled_from(stages if stages and draw(st.integers(0, 3)) else targets))
        others = scope.child()  # the value does not read the vector it writes
        others.reads.pop(name)
        if not [d for d in _dims(others) if d != 1]:  # nothing else to read
            continue
        value = draw(some_expr(others, (key,), draw(st.integers(1, 2))))
        if value is None:
            continue
        if not isinstance(value, Op):  # an operation, so DaCe writes a map rather than a copy
            value = Op(draw(st.sampled_from(["*", "+"])), value, Num(draw(st.sampled_from([0.5, 1.5, -0.75]))))
        place = Read(name, (draw(span_for(key)),))
        out.append(Assign(place, draw(st.sampled_from(["=", "=", "+="])), value))
    return out if any(isinstance(s, Assign) for s in out) else None


@st.composite
def statement(draw, scope: Scope):
    kinds = ["assign", "assign", "assign", "define"]
    if scope.counter[0] < 12 and scope.depth < 3:
        kinds += ["loop", "loop"]
        if "branch" in scope.features:
            kinds.append("branch")
        if "while" in scope.features and not scope.in_loop:
            kinds.append("while")
        if "scatter" in scope.features and not scope.in_loop:
            kinds.append("scatter")
        if "map" in scope.features and not scope.in_loop:
            kinds.append("map")
        if scope.helpers and not scope.in_loop:
            kinds.append("call")
    if "chain" in scope.features and not scope.scalar:
        kinds.append("chain")
    kind = draw(st.sampled_from(kinds))
    if kind == "assign":
        found = draw(assign(scope))
    elif kind == "define":
        found = draw(define(scope)) if not scope.in_loop else draw(assign(scope))
    elif kind == "loop":
        found = draw(loop(scope))
    elif kind == "branch":
        found = draw(branch(scope))
    elif kind == "while":
        found = draw(while_loop(scope))
    elif kind == "scatter":
        found = draw(scatter(scope))
    elif kind == "map":
        found = draw(map_fill(scope))
    elif kind == "chain":
        found = draw(chain(scope))
    else:
        helper = draw(st.sampled_from(scope.helpers))
        args: list[str] = []
        for param in helper.params:
            # distinct arrays: DaCe assumes a nested program's arguments do not alias (`helper0(x0, x0)` was
            # made one state whose copy and product then race; fuzz seed 21001, programs 114 and 115)
            same = sorted(a for a, d in scope.writes.items() if d == param.dims and a not in args)
            if not same:
                return None
            args.append(draw(st.sampled_from(same)))
        found = CallHelper(helper.name, tuple(args))
    if found is None:
        return []
    return found if isinstance(found, list) else [found]


@st.composite
def block(draw, scope: Scope, most: int) -> list:
    count = draw(st.integers(1, most))
    out = []
    for _ in range(count):
        out += draw(statement(scope))
    return out


FEATURES = ("accumulate", "branch", "break", "cast", "gather", "scatter", "trips", "triangular", "while", "helper",
            "view", "map", "arange", "stop", "chain")


@st.composite
def programs(draw, features: Sequence[str] = FEATURES) -> Program:
    """A random program and everything needed to run it (see the module docstring)."""
    sizes = (("N", draw(st.integers(5, 8))), ("M", draw(st.integers(4, 7))))
    shapes = draw(st.lists(st.sampled_from([("N",), ("M",), ("N", "M")]), min_size=1, max_size=3))
    arguments = [Argument(f"x{k}", dims, "input") for k, dims in enumerate(shapes)]
    enabled = frozenset(f for f in features if draw(st.booleans()))
    indices = {}
    extra = []
    if "scatter" in enabled or "gather" in enabled:
        dim = draw(st.sampled_from(sorted({d for s in shapes for d in s})))
        extent = dict(sizes)[dim]
        length = draw(st.integers(3, 7))
        values = tuple(draw(st.lists(st.integers(0, extent - 1), min_size=length, max_size=length)))
        extra.append(Argument("idx", (length,), "index", values))
        indices["idx"] = (length, dim)
    if "trips" in enabled:
        dim = draw(st.sampled_from(sorted({d for s in shapes for d in s})))
        extent = dict(sizes)[dim]
        if draw(st.booleans()):
            extra.append(Argument("T", (), "trips", (draw(st.integers(1, extent - 2)),)))
            indices["T"] = (0, dim)
        else:
            extra.append(Argument("cnt", (1,), "count", (draw(st.integers(1, extent - 2)),)))
            indices["cnt"] = (0, dim)
    reads = {a.name: a.dims for a in arguments}
    scope = Scope(reads=dict(reads), writes=dict(reads), indices=indices, features=enabled)
    helpers = []
    if "helper" in enabled:
        params = tuple(Argument(f"h{k}", dims, "input") for k, dims in enumerate(shapes[:2]))
        inner = Scope(reads={p.name: p.dims for p in params}, writes={p.name: p.dims for p in params},
                      features=enabled - {"helper", "scatter", "gather", "trips"}, counter=scope.counter)
        body = draw(block(inner, 2))
        helper = Helper("helper0", params, tuple(body))
        helpers.append(helper)
        scope.helpers.append(helper)
    if "accumulate" in enabled:
        scope.reads["S"] = (1,)
        scope.writes["S"] = (1,)
        if draw(st.booleans()):
            acc = scope.fresh("acc")
            scope.reads[acc] = (1,)
            scope.writes[acc] = (1,)
            pre = [Define(acc, zeros=(1,))]
        else:
            pre = []
    else:
        pre = []
    body = pre + draw(block(scope, 5))
    weights = [Argument(f"w{k}", a.dims, "weight") for k, a in enumerate(arguments)]
    loss = [(a.name, w.name) for a, w in zip(arguments, weights)]
    for name, dims in scope.reads.items():
        if dims and dims[0] == "temp" and dims[1]:
            loss.append((name, "1.0"))
        elif name.startswith("acc") or name.startswith("k"):  # accumulators, a chain's stage vectors
            loss.append((name, "1.0"))
    outputs = [Argument("S", (1,), "output")]
    return Program(sizes, tuple(arguments + weights + extra + outputs), tuple(body), tuple(loss), tuple(helpers))
