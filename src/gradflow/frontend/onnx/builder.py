"""The SDFG under construction while an ONNX graph is lowered, and the helpers rules build with.

`Lowering` is private to one run of the `onnx_lower` pass: rules write into it, nobody else sees it.
It maps ONNX tensor names to `Tensor`s (logical shape, dtype, SDFG array name and/or a value known at
lowering time). States form one straight chain, one state per ONNX node, so ordering is explicit and no
two nodes race. Rank-0 tensors are stored as arrays of shape (1,); their element index is "0".

Index expressions and map ranges are strings over map parameters (`p0`, `r0`, ...) and symbols, built
only from generated names and integers: no ONNX name or attribute string ever reaches them.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence, Union

import attrs
import dace
import numpy as np
import sympy
from dace import symbolic

from gradflow.core.checks import ERROR_FLAG, FLAG_SIZE, IndexSite
from gradflow.frontend.onnx import limits
from gradflow.frontend.onnx.dtypes import STORAGE, storage_dtype  # noqa: F401  (re-exported)
from gradflow.frontend.onnx.errors import MalformedModelError
from gradflow.frontend.onnx.naming import Namer

Dim = Union[int, sympy.Expr]


class RuleUnsupported(Exception):
    """Raised by a rule for a case it does not cover; becomes an `UnsupportedOpError` naming the node."""


class InvalidNode(Exception):
    """Raised by a rule for a node that breaks the ONNX specification (an axis out of range, k larger than
    the axis, ...); becomes an `InvalidNodeError` naming the node."""


def norm_axis(axis: int, rank: int, what: str = "axis", *, end: bool = False) -> int:
    """`axis` in [-rank, rank - 1] (or [-rank, rank] with `end`, for Flatten-like split points) as a
    non-negative axis; anything else is `InvalidNode` (ONNX never wraps an axis modulo the rank)."""
    hi = rank if end else rank - 1
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -rank <= axis <= hi:
        raise InvalidNode(f"{what} {axis!r} is out of range for a tensor of rank {rank} (valid: [{-rank}, {hi}])")
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Every axis normalized (see `norm_axis`); a repeated axis is `InvalidNode`."""
    out = [norm_axis(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise InvalidNode(f"{what} {list(axes)} name an axis twice")
    return out


class NeedsValue(Exception):
    """A rule needs the value of a tensor at lowering time (a shape, axes, pads...)."""

    def __init__(self, tensor: str) -> None:
        super().__init__(tensor)
        self.tensor = tensor


def norm_dim(d: Dim) -> Dim:
    """Integers as `int`, everything else as a simplified SymPy expression."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    e = sympy.sympify(d)
    if e.is_Integer:
        return int(e)
    return sympy.simplify(e)


def exact_div(a: Dim, b: Dim) -> Dim:
    """a / b for dims known to divide (integer division on ints, never a float)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return norm_dim(sympy.sympify(a) / sympy.sympify(b))


def dstr(d: Dim) -> str:
    """A dimension / index expression as a string DaCe parses."""
    if isinstance(d, (int, np.integer)):
        return str(int(d))
    if isinstance(d, str):
        return d
    return symbolic.symstr(d)


def prod(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return norm_dim(out)


def dace_type(dtype: np.dtype) -> dace.typeclass:
    dtype = storage_dtype(dtype)
    if dtype == np.bool_:
        return dace.bool_
    return dace.dtypes.typeclass(dtype.type)


#: The tasklet connector through which checked index code writes the error flag.
FLAG_CONNECTOR = "err"


@attrs.frozen
class Checked:
    """An index computed in tasklet code (`index`, an expression over connectors and map parameters) that
    must lie in [0, extent) after wrapping (with `wraps`, -extent..-1 count from the end, as ONNX says);
    `what` describes it for the error message."""

    index: str
    extent: "Dim"
    what: str
    wraps: bool = True


@attrs.frozen
class Tensor:
    """One ONNX value: logical shape, dtype, and where it lives (SDFG array and/or known value)."""

    shape: tuple[Dim, ...] = attrs.field(converter=lambda s: tuple(norm_dim(d) for d in s))
    dtype: np.dtype = attrs.field(converter=np.dtype)
    array: str | None = None
    value: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def phys_shape(self) -> tuple[Dim, ...]:
        return self.shape if self.shape else (1,)

    def full(self) -> str:
        return ", ".join(f"0:{dstr(d)}" for d in self.phys_shape)

    def at(self, index: Sequence[str] | None) -> dace.Memlet:
        """Memlet for one element (`index`, rank-many strings) or the whole array (`None`)."""
        if index is None:
            return dace.Memlet(f"{self.array}[{self.full()}]")
        idx = list(index) if self.shape else ["0"]
        assert len(idx) == len(self.phys_shape), (idx, self.shape)
        return dace.Memlet(f"{self.array}[{', '.join(idx)}]")


def strides(shape: Sequence[Dim]) -> list[Dim]:
    out: list[Dim] = []
    acc: Dim = 1
    for d in reversed(shape):
        out.append(acc)
        acc = norm_dim(acc * d)
    return out[::-1]


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        not_one = [d for d in dims if not (isinstance(d, int) and d == 1)]
        if not not_one:
            out.append(1)
            continue
        first = not_one[0]
        for d in not_one[1:]:
            diff = norm_dim(d - first)
            if diff != 0:
                bad = InvalidNode if isinstance(diff, int) else RuleUnsupported
                raise bad(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(first)
    return tuple(out)


def same_extent(a: Dim, b: Dim, what: str) -> None:
    """Two extents that must be equal: different integers are `InvalidNode`; extents that cannot be
    compared while lowering (different symbols) are `RuleUnsupported`."""
    diff = norm_dim(sympy.sympify(a) - b)
    if diff != 0:
        raise (InvalidNode if isinstance(diff, int) else RuleUnsupported)(f"{what}: extents {a} and {b} differ")


def bcast_index(in_shape: Sequence[Dim], out_shape: Sequence[Dim], params: Sequence[str]) -> list[str]:
    """Index into an input broadcast (numpy rules) to `out_shape`, given the output's map parameters. An
    input that does not broadcast to `out_shape` is `InvalidNode` (unsupported when symbols decide it)."""
    off = len(out_shape) - len(in_shape)
    if off < 0:
        raise InvalidNode(f"shape {tuple(in_shape)} does not broadcast to {tuple(out_shape)}")
    idx = []
    for k, d in enumerate(in_shape):
        o = out_shape[k + off]
        diff = norm_dim(sympy.sympify(o) - d)
        if diff != 0 and not (isinstance(d, int) and d == 1):
            bad = InvalidNode if isinstance(diff, int) else RuleUnsupported
            raise bad(f"shape {tuple(in_shape)} does not broadcast to {tuple(out_shape)}")
        idx.append("0" if (isinstance(d, int) and d == 1 and not (isinstance(o, int) and o == 1)) else params[k + off])
    return idx


def row_major_index(indices: Sequence[str], extents: Sequence[Dim]) -> str:
    """Row-major linear index of `indices` over `extents` (flattening dimensions into one)."""
    flat = indices[0]
    for i, d in zip(indices[1:], extents[1:]):
        flat = f"({flat}) * ({dstr(d)}) + {i}"
    return flat


def params(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{k}" for k in range(n)]


class Lowering:
    """Mutable builder state of one lowering (never escapes the pass that owns it)."""

    def __init__(self, name: str, opset: int, namer: Namer, max_bytes: int = limits.DEFAULT_MAX_TENSOR_BYTES) -> None:
        self.namer = namer
        self.opset = opset
        self.max_bytes = max_bytes
        self.sdfg = dace.SDFG(namer("onnx", name))
        self.prologue = self.sdfg.add_state("prologue", is_start_block=True)
        self._last = self.prologue
        self.tensors: dict[str, Tensor] = {}
        #: sequence values known while lowering (their elements are tensors of the program), by ONNX name
        self.sequences: dict[str, tuple[Tensor, ...]] = {}
        self.init_values: dict[str, np.ndarray] = {}
        self.params: dict[str, np.ndarray] = {}
        #: float64 values of folded float constants the model computes at lower precision (see `lower._widen`)
        self.wide: dict[str, np.ndarray] = {}
        self.pending_outputs: dict[str, str] = {}  # ONNX name -> reserved non-transient array name
        self.symbols: dict[str, dace.symbol] = {}
        self.sites: list[IndexSite] = []  # the checks of data-dependent indices, numbered from 1
        self._flag: Tensor | None = None
        self.node = None  # the ONNX node being lowered (a `table.Node`), for messages
        self.array_origins: dict[str, str] = {}  # array -> the ONNX node whose rule created it, for messages
        #: ONNX value -> the 2-D value it is the transpose of (`Transpose` records it; a product reads the
        #: source with its transposed flag instead). ONNX values are never overwritten, so the pair holds.
        self.transposes: dict[str, str] = {}

    # -- arrays -----------------------------------------------------------------------------------
    def add_array(self, name: str, shape: Sequence[Dim], dtype: np.dtype, what: str, transient: bool = True) -> None:
        """Every array of the lowered SDFG is added here, so no array over the size limit is ever declared."""
        for d in shape:
            if isinstance(d, (int, np.integer)) and d < 0:
                if self.node is None:  # a graph input or initializer
                    raise MalformedModelError(f"{what} has a negative extent in its shape {tuple(shape)}")
                raise InvalidNode(f"{what} would have a negative extent {tuple(shape)}")
        if self.node is not None:
            what = f"{what} of {self.node.where}"
            self.array_origins[name] = self.node.where
        limits.check_static(shape, storage_dtype(dtype), what, self.max_bytes)
        self.sdfg.add_array(name, shape, dace_type(dtype), transient=transient)

    # -- checked data-dependent indices -------------------------------------------------------------
    def error_flag(self) -> Tensor:
        """The `ERROR_FLAG` argument (created, and zeroed in the prologue, on first use)."""
        if self._flag is None:
            self._flag = Tensor((FLAG_SIZE,), np.int64, ERROR_FLAG)
            self.sdfg.add_array(ERROR_FLAG, (FLAG_SIZE,), dace.int64, transient=False)
            tasklet = self.prologue.add_tasklet("clear_error_flag", {}, {"o"}, "o = 0")
            me, mx = self.prologue.add_map("clear_error_flag", {"z": f"0:{FLAG_SIZE}"})
            self.prologue.add_nedge(me, tasklet, dace.Memlet())
            self.prologue.add_memlet_path(tasklet, mx, self.prologue.add_write(ERROR_FLAG), src_conn="o",
                                          memlet=dace.Memlet(f"{ERROR_FLAG}[z]"))
        return self._flag

    def checked(self, where: str, checks: Sequence["Checked"]) -> tuple[list[str], dict]:
        """Tasklet lines that compute each index of `checks` into `g0`, `g1`, ... (negative ones wrapped
        when the check says so) and set `ok`; a failed check stops, records its site, the index and the
        extent in the error flag, and sets `ok = False`. Every access through the `g` variables must be
        guarded by `ok`. Returns the lines and the output connector to add to the tasklet."""
        lines = ["ok = True"]
        for k, c in enumerate(checks):
            self.sites.append(IndexSite(where, c.what, c.wraps))
            extent = dstr(c.extent)
            lines.append(f"r{k} = {c.index}")
            lines.append(f"g{k} = (r{k} + {extent}) if r{k} < 0 else r{k}" if c.wraps else f"g{k} = r{k}")
            lines += [
                f"if ok and (g{k} < 0 or g{k} >= {extent}):",
                "    ok = False",
                f"    {FLAG_CONNECTOR}[0] = {len(self.sites)}",
                f"    {FLAG_CONNECTOR}[1] = r{k}",
                f"    {FLAG_CONNECTOR}[2] = {extent}",
            ]
        return lines, {FLAG_CONNECTOR: (self.error_flag(), None, None)}

    # -- states -----------------------------------------------------------------------------------
    def state(self, label: str) -> dace.SDFGState:
        """A new state after the last one: each node's dataflow runs after its predecessors'."""
        st = self.sdfg.add_state_after(self._last, self.namer("s", label))
        self._last = st
        return st

    # -- symbols ----------------------------------------------------------------------------------
    def symbol(self, dim_param: str) -> dace.symbol:
        if dim_param not in self.symbols:
            name = self.namer("S", dim_param)
            self.sdfg.add_symbol(name, dace.int64)
            self.symbols[dim_param] = dace.symbol(name, dace.int64, positive=True)
        return self.symbols[dim_param]

    # -- tensors ----------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return bool(name) and name in self.tensors

    def info(self, name: str) -> Tensor:
        return self.tensors[name]

    def value(self, name: str) -> np.ndarray:
        """The value of `name` at lowering time (constants, initializers, folded shape arithmetic)."""
        t = self.tensors[name]
        if t.value is not None:
            return t.value
        if name in self.init_values:
            return self.init_values[name]
        raise NeedsValue(name)

    def get(self, name: str) -> Tensor:
        """The tensor with an SDFG array (a known value is materialized as a constant array on demand)."""
        t = self.tensors[name]
        if t.array is None:
            t = self._materialize(name, t)
            self.tensors[name] = t
        return t

    def _materialize(self, name: str, t: Tensor) -> Tensor:
        arr = self.namer("c", name)
        value = np.asarray(t.value)
        self.add_array(arr, t.phys_shape, t.dtype, f"constant '{name}'")
        out = attrs.evolve(t, array=arr)
        if value.dtype != object:
            data = value.astype(t.dtype).astype(storage_dtype(t.dtype))
            if data.dtype.kind != "f" or np.isfinite(data).all():
                # DaCe prints constant arrays with str(): bools as 0/1 (not Python's True/False)
                data = data.astype(np.uint8) if data.dtype == np.bool_ else data
                data = np.ascontiguousarray(data.reshape([int(d) for d in t.phys_shape]))
                self.sdfg.add_constant(arr, data, self.sdfg.arrays[arr])
                return out
        # Symbolic values (shape arithmetic over symbols) and floats with inf/nan (no C++ literal in a
        # constant array) are written once, in the prologue.
        flat = value.reshape(-1)
        lines = [
            f"{sub('o', out, [str(int(i)) for i in np.unravel_index(k, value.shape)])} = {_element_code(v)}"
            for k, v in enumerate(flat)
        ]
        tasklet = self.prologue.add_tasklet(self.namer("sym", name), {}, {"o"}, "\n".join(lines))
        w = self.prologue.add_write(arr)
        m = dace.Memlet(f"{arr}[{out.full()}]")
        m.dynamic = True
        self.prologue.add_edge(tasklet, "o", w, None, m)
        return out

    def set(self, name: str, tensor: Tensor) -> None:
        if name:
            self.tensors[name] = tensor

    def defined(self, name: str) -> bool:
        """Whether value `name` exists yet: a tensor or a sequence."""
        return name in self.tensors or name in self.sequences

    def set_sequence(self, name: str, elements: Sequence[Tensor]) -> None:
        """Record sequence value `name` as the tensors it holds (sequence ops are resolved while lowering)."""
        if name:
            self.sequences[name] = tuple(elements)

    def sequence(self, name: str) -> tuple[Tensor, ...]:
        if name not in self.sequences:
            raise InvalidNode(f"input '{name}' is not a sequence")
        return self.sequences[name]

    def set_value(self, name: str, value: np.ndarray, dtype: np.dtype | None = None) -> None:
        value = np.asarray(value)
        dt = np.dtype(dtype) if dtype is not None else (np.dtype(np.int64) if value.dtype == object else value.dtype)
        self.set(name, Tensor(value.shape, dt, None, value))

    def output(self, name: str, shape: Sequence[Dim], dtype: np.dtype) -> Tensor:
        """Allocate the array of node output `name` (non-transient when it is a graph output)."""
        shape = tuple(norm_dim(d) for d in shape)
        t = Tensor(shape, dtype)
        reserved = self.pending_outputs.pop(name, None) if name else None
        arr = reserved or self.namer("t", name)
        self.add_array(arr, t.phys_shape, dtype, f"tensor '{name}'", transient=reserved is None)
        t = attrs.evolve(t, array=arr)
        self.set(name, t)
        return t

    def temp(self, shape: Sequence[Dim], dtype: np.dtype, hint: str = "tmp") -> Tensor:
        """A transient array that is no ONNX value (intermediate of a multi-step rule)."""
        t = Tensor(shape, dtype)
        arr = self.namer("t", hint)
        self.add_array(arr, t.phys_shape, dtype, f"an intermediate ({hint})")
        return attrs.evolve(t, array=arr)

    # -- dataflow ---------------------------------------------------------------------------------
    def map(
        self,
        label: str,
        ranges: Sequence[tuple[str, Dim]],
        ins: Mapping[str, tuple[Tensor, Sequence[str] | None]],
        code: str,
        outs: Mapping[str, tuple[Tensor, Sequence[str] | None, str | None]],
        *,
        state: dace.SDFGState | None = None,
        language: dace.Language = dace.Language.Python,
        sequential: bool = False,
    ) -> dace.SDFGState:
        """One mapped tasklet in a new state. `None` as index means the whole array (indexed in code)."""
        st = state or self.state(label)
        if any(isinstance(d, int) and d <= 0 for _, d in ranges) or any(
            isinstance(d, int) and d == 0 for t, _, _ in outs.values() for d in t.shape
        ):
            return st  # empty iteration space: nothing to compute
        rng = {p: f"0:{dstr(d)}" for p, d in ranges} or {"z0": "0:1"}
        in_m = {c: t.at(i) for c, (t, i) in ins.items()}
        out_m = {}
        for c, (t, i, wcr) in outs.items():
            m = t.at(i)
            if wcr:
                m = dace.Memlet(data=m.data, subset=m.subset, wcr=wcr)
            if i is None:
                m.dynamic = True
            out_m[c] = m
        if language == dace.Language.Python:
            # float16 elements are computed in float32: DaCe's half type has no mixed-type overloads
            # (max(0, x) would not compile); the result is rounded to float16 where it is stored
            for c, (t, _) in ins.items():
                if np.dtype(t.dtype) == np.float16 and not in_m[c].dynamic and in_m[c].subset.num_elements() == 1:
                    in_m[f"{c}_half"] = in_m.pop(c)
                    code = f"{c} = dace.float32({c}_half)\n{code}"
        kwargs = {}
        if sequential:
            kwargs["schedule"] = dace.ScheduleType.Sequential
        st.add_mapped_tasklet(
            self.namer("k", label), rng, in_m, code, out_m, language=language, external_edges=True, **kwargs
        )
        return st

    def fill(self, label: str, out: Tensor, value_code: str) -> None:
        p = params("p", out.rank)
        self.map(label, list(zip(p, out.shape)), {}, f"o = {value_code}", {"o": (out, p, None)})

    def elementwise(
        self, label: str, code: str, ins: Mapping[str, Tensor], out_name: str, dtype: np.dtype, out_shape=None
    ) -> Tensor:
        """`code` assigns connector `res` from connectors named by `ins`, numpy-broadcast over inputs."""
        shape = broadcast_shapes(*(t.shape for t in ins.values())) if out_shape is None else tuple(out_shape)
        out = self.output(out_name, shape, dtype)
        p = params("p", out.rank)
        self.map(
            label,
            list(zip(p, out.shape)),
            {c: (t, bcast_index(t.shape, out.shape, p)) for c, t in ins.items()},
            code,
            {"res": (out, p, None)},
        )
        return out

    def copy_indexed(self, label: str, src: Tensor, out: Tensor, src_index: Sequence[str], p: Sequence[str]) -> None:
        """out[p] = src[src_index(p)] with an affine/integer index known without data."""
        self.map(label, list(zip(p, out.shape)), {"a": (src, src_index)}, "o = a", {"o": (out, p, None)})


def _element_code(v) -> str:
    """One element of a known value as tasklet source: a float literal, or an integer / symbolic expression."""
    if isinstance(v, (float, np.floating)):
        return literal_float(v)
    return dstr(norm_dim(v))


def literal_float(v: float) -> str:
    """A float attribute as tasklet source (repr of a Python float: digits only, or inf/nan)."""
    f = float(v)
    if f != f:
        return "nan"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    return repr(f)


def sub(conn: str, t: Tensor, index: Sequence[str]) -> str:
    """Tasklet-code element access through a whole-array connector.

    DaCe drops size-1 dimensions from such a connector's view, so their indices are dropped too; a
    connector of one element is a plain value.
    """
    idx = list(index) if t.shape else ["0"]
    keep = [i for i, d in zip(idx, t.phys_shape) if not (isinstance(d, int) and d == 1)]
    return f"{conn}[{', '.join(keep)}]" if keep else conn
