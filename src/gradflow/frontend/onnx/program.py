"""`load`: the public entry point, and `OnnxProgram`: a lowered model you can call.

Calling validates every argument against the model's declared input (dtype exactly, rank, fixed dims,
consistent symbolic dims), binds symbols from the argument shapes, binds the weights, allocates outputs
and runs the compiled SDFG (content-addressed cache, so equal models compile once per machine).

Models where a graph *input* decides a shape (ONNX's node tests feed Reshape's `shape` as an input) are
lowered lazily: one specialisation per distinct value of those inputs, cached in the program.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Mapping

import dace
import numpy as np
import sympy

from gradflow.core.checks import FLAG_SIZE, raise_for_flag
from gradflow.core.errors import GradflowError
from gradflow.core.graph import Graph
from gradflow.core.passes import unwrap_or_raise
from gradflow.core.rule_table import RuleTable
from gradflow.frontend.onnx import limits
from gradflow.frontend.onnx.dtypes import elem_dtype, storage_dtype
from gradflow.frontend.onnx.errors import InputMismatchError, OnnxError
from gradflow.frontend.onnx.lower import InputDecidesShapeError, OnnxLower, Port, Signature, model_graph
from gradflow.frontend.onnx.model import OnnxModel, read_model
from gradflow.runtime.allocation import check_fits


def _torch():
    """torch if the caller has imported it (a torch tensor argument implies it has); never imported here,
    so importing gradflow does not pay for torch."""
    return sys.modules.get("torch")


def _lower(model: OnnxModel, table: RuleTable | None, max_tensor_bytes: int) -> Graph:
    return unwrap_or_raise(OnnxLower(table, max_tensor_bytes)(model_graph(model)))


def _as_numpy(value: Any, port_name: str) -> tuple[np.ndarray, bool]:
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
            import ml_dtypes

            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16), True
        return value.numpy(), True
    if isinstance(value, np.ndarray):
        return value, False
    if isinstance(value, (np.generic, int, float, bool)):
        return np.asarray(value), False
    raise InputMismatchError(
        f"input '{port_name}': expected a numpy array or torch tensor, got {type(value).__name__}"
    )


class _Specialized:
    """One lowered + compiled graph with its calling convention."""

    def __init__(self, graph: Graph, max_tensor_bytes: int) -> None:
        self.graph = graph
        self.signature: Signature = graph.meta["onnx_signature"]
        self._compiled = None
        self._lock = threading.Lock()
        self._max_bytes = max_tensor_bytes
        # arrays whose size depends on input shapes: checked against the limit once per binding of the symbols
        self._sized = {name: (desc.total_size, desc.dtype.bytes) for name, desc in graph.sdfg.arrays.items()
                       if getattr(desc.total_size, "free_symbols", None)}
        self._sizes_ok: set[tuple] = set()

    def _check_sizes(self, bindings: dict[sympy.Symbol, int]) -> None:
        key = tuple(sorted((s.name, v) for s, v in bindings.items()))
        if key not in self._sizes_ok:
            limits.check_bound(self._sized, dict(key), self._max_bytes)
            self._sizes_ok.add(key)

    def compiled(self):
        with self._lock:
            if self._compiled is None:
                from gradflow.optimize import optimized
                from gradflow.runtime.compile import compile_sdfg

                # the lowered graph stays as it is (`OnnxProgram.graph`); what runs is optimized, as what
                # `gradflow.torch.compile` runs (atomics-free sums, BLAS, schedules)
                self._compiled = compile_sdfg(optimized(self.graph))
                self._arglist = set(getattr(self._compiled, "_sig", None) or self._compiled.sdfg.arglist().keys())
            return self._compiled

    def run(self, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        sig = self.signature
        bindings: dict[sympy.Symbol, int] = {}
        kwargs: dict[str, Any] = {}
        for port in sig.inputs:
            a = arrays[port.onnx_name]
            _check(port, a, bindings)
            if not a.flags.c_contiguous:  # copied into the dense layout the program reads
                check_fits(f"input '{port.onnx_name}' (copied to a dense layout)", a.shape,
                           storage_dtype(port.dtype), {})
            a = np.ascontiguousarray(a.astype(storage_dtype(port.dtype), copy=False))
            kwargs[port.array] = a if port.shape else a.reshape(1)
        if self._sized:
            self._check_sizes(bindings)
        outs = []
        shapes = [[_concrete(d, bindings, port) for d in port.shape] for port in sig.outputs]
        for port, shape in zip(sig.outputs, shapes):  # all checked before any is allocated
            check_fits(f"output '{port.onnx_name}'", shape, storage_dtype(port.dtype), {})
        for port, shape in zip(sig.outputs, shapes):
            buf = np.zeros(shape if shape else (1,), dtype=storage_dtype(port.dtype))
            kwargs[port.array or f"__empty{len(outs)}"] = buf
            outs.append(buf if shape else buf.reshape(()))
        kwargs.update(sig.params)
        flag = None
        if sig.error_flag:
            flag = kwargs[sig.error_flag] = np.zeros(FLAG_SIZE, dtype=np.int64)
        compiled = self.compiled()
        for sym, val in bindings.items():
            if sym.name in self._arglist:
                kwargs[sym.name] = val
        kwargs = {k: v for k, v in kwargs.items() if k in self._arglist}
        # Arguments were checked above (dtype, shape, C-contiguous); torch-backed and reshaped arrays are
        # numpy "views" only in the sense that they have a base object.
        with dace.config.set_temporary("compiler", "allow_view_arguments", value=True):
            compiled(**kwargs)
        raise_for_flag(flag, sig.sites)
        # logical dtypes stored wider (bfloat16 in float32) are rounded back here
        return [o.astype(p.dtype) if o.dtype != p.dtype else o for o, p in zip(outs, sig.outputs)]


def _to_torch(a: np.ndarray):
    torch = _torch()
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bfloat16
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _concrete(d, bindings, port: Port) -> int:
    if isinstance(d, int):
        return d
    value = sympy.sympify(sympy.sympify(d).xreplace({k: sympy.Integer(v) for k, v in bindings.items()}))
    if not value.is_Integer:
        raise InputMismatchError(f"cannot determine the size of output '{port.onnx_name}' ({d}) from the inputs")
    return int(value)


def _check(port: Port, a: np.ndarray, bindings: dict) -> None:
    if a.dtype != port.dtype:
        raise InputMismatchError(
            f"input '{port.onnx_name}' must have dtype {port.dtype}, got {a.dtype}",
            f"convert it, e.g. x.astype(np.{port.dtype.name}) or tensor.to(torch.{port.dtype.name})",
        )
    want = tuple(str(d) if not isinstance(d, int) else d for d in port.shape)
    if a.ndim != len(port.shape):
        raise InputMismatchError(f"input '{port.onnx_name}' must have rank {len(port.shape)} (shape {want}), got shape {a.shape}")
    for k, (d, n) in enumerate(zip(port.shape, a.shape)):
        if isinstance(d, int):
            if d != n:
                raise InputMismatchError(f"input '{port.onnx_name}' must have shape {want}, got {a.shape} (dim {k})")
        elif isinstance(d, sympy.Symbol):
            if d in bindings and bindings[d] != n:
                raise InputMismatchError(
                    f"input '{port.onnx_name}' dim {k} is symbolic and was bound to {bindings[d]} by an earlier "
                    f"input, got {n}"
                )
            bindings[d] = int(n)


class OnnxProgram:
    """A loaded ONNX model: call it with arrays/tensors; `.graph` / `.sdfg` give the lowered program."""

    def __init__(self, model: OnnxModel, table: RuleTable | None = None, max_tensor_bytes: int | None = None) -> None:
        self.model = model
        self._table = table
        self._max_bytes = limits.max_tensor_bytes(max_tensor_bytes)
        self._value_inputs: tuple[str, ...] = ()
        self._specs: dict[Any, _Specialized] = {}
        self._lock = threading.Lock()
        graph = None
        bound: dict[str, np.ndarray] = {}
        for _ in range(64):
            try:
                graph = _lower(model, table, self._max_bytes)
                break
            except InputDecidesShapeError as err:
                names = [n for n in err.inputs if n in self._graph_input_names() and n not in bound]
                if not names:
                    raise
                self._value_inputs += tuple(names)
                # placeholder values only to discover further value inputs; lowering happens per call
                bound.update({n: self._dummy(n) for n in names})
                model = self.model.bind(bound)
            except GradflowError:
                if self._value_inputs:
                    break  # dummy values may be invalid; the real lowering happens at call time
                raise
        self._main = _Specialized(graph, self._max_bytes) if graph is not None and not self._value_inputs else None

    # -- introspection ----------------------------------------------------------------------------
    def _graph_input_names(self) -> list[str]:
        inits = {t.name for t in self.model.graph().initializer}
        return [vi.name for vi in self.model.graph().input if vi.name not in inits]

    def _dummy(self, name: str) -> np.ndarray:
        vi = next(v for v in self.model.graph().input if v.name == name)
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
        return np.ones(dims, dtype=elem_dtype(vi.type.tensor_type.elem_type, name))

    @property
    def input_names(self) -> list[str]:
        return self._graph_input_names()

    @property
    def output_names(self) -> list[str]:
        return [vi.name for vi in self.model.graph().output]

    @property
    def value_inputs(self) -> tuple[str, ...]:
        """Inputs whose values decide shapes; each distinct value gets its own lowering."""
        return self._value_inputs

    def _require_main(self) -> _Specialized:
        if self._main is None:
            raise OnnxError(
                f"the inputs {list(self._value_inputs)} decide shapes, so this model has one SDFG per value of them",
                "use program.specialize({name: value}) to get the Graph for given values",
            )
        return self._main

    @property
    def graph(self) -> Graph:
        """The lowered, frozen SDFG as a `gradflow.core.Graph` (meta: `onnx_model`, `onnx_signature`)."""
        return self._require_main().graph

    @property
    def sdfg(self) -> dace.SDFG:
        """A copy of the lowered SDFG (modifying it cannot affect this program)."""
        return self._require_main().graph.to_sdfg()

    @property
    def signature(self) -> Signature:
        return self._require_main().signature

    @property
    def weights(self) -> Mapping[str, np.ndarray]:
        """SDFG array name -> initializer value (read-only), bound automatically at call time."""
        return self.signature.params

    def specialize(self, values: Mapping[str, np.ndarray]) -> _Specialized:
        key = tuple((n, values[n].dtype.str, values[n].shape, values[n].tobytes()) for n in self._value_inputs)
        with self._lock:
            spec = self._specs.get(key)
            if spec is None:
                model = self.model.bind({n: values[n] for n in self._value_inputs})
                spec = _Specialized(_lower(model, self._table, self._max_bytes), self._max_bytes)
                self._specs[key] = spec
        return spec

    # -- calling ----------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        names = self.input_names
        if len(args) > len(names):
            raise InputMismatchError(f"the model takes {len(names)} input(s) {names}, got {len(args)} positional")
        given: dict[str, Any] = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise InputMismatchError(f"the model has no input named {k!r}; inputs: {names}")
            if k in given:
                raise InputMismatchError(f"input {k!r} given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise InputMismatchError(f"missing input(s) {missing}; the model's inputs are {names}")
        arrays: dict[str, np.ndarray] = {}
        as_torch = False
        for n in names:
            arrays[n], was_torch = _as_numpy(given[n], n)
            as_torch |= was_torch
        if self._value_inputs:
            self._check_value_inputs(arrays)
            spec = self.specialize(arrays)
        else:
            spec = self._require_main()
        outs = spec.run(arrays)
        if as_torch:
            return tuple(_to_torch(o) for o in outs)
        return tuple(outs)

    def _check_value_inputs(self, arrays: Mapping[str, np.ndarray]) -> None:
        for vi in self.model.graph().input:
            if vi.name in self._value_inputs:
                want = elem_dtype(vi.type.tensor_type.elem_type, vi.name)
                if arrays[vi.name].dtype != want:
                    raise InputMismatchError(f"input '{vi.name}' must have dtype {want}, got {arrays[vi.name].dtype}")


def load(model: Any, *, table: RuleTable | None = None, base_dir: str | os.PathLike | None = None,
         max_tensor_bytes: int | None = None) -> OnnxProgram:
    """Load an ONNX model (path, bytes or `onnx.ModelProto`): check it, infer shapes, lower it to an SDFG.

    `base_dir`: the folder external data is read from (default: the model file's folder; a model given as
    bytes or `ModelProto` with external data needs it). `max_tensor_bytes`: the largest tensor allowed
    (default `$GRADFLOW_MAX_TENSOR_BYTES`, else 16 GiB). Raises `MalformedModelError` (checker message;
    `InvalidNodeError` for a node that breaks its specification; `ExternalDataError`), `UnsupportedOpError`
    (op, node, opset; `UnsupportedOpsetError`) or `TensorTooLargeError` on failure.
    """
    limit = limits.max_tensor_bytes(max_tensor_bytes)
    return OnnxProgram(read_model(model, base_dir=base_dir, max_tensor_bytes=limit), table, limit)


__all__ = ["OnnxProgram", "load"]
