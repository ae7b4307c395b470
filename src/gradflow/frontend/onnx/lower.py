"""The `onnx_lower` pass: a placeholder Graph carrying an `OnnxModel` -> the lowered SDFG.

Input: `Graph` whose `meta["onnx_model"]` is an `OnnxModel` (its SDFG is an empty placeholder, untouched).
Output: a new `Graph` owning the lowered SDFG, with `meta["onnx_signature"]` describing the calling
convention (which array is which ONNX input/output, initializer values, symbols). Graph inputs and
initializers (weights) are non-transient arrays, so a later AD pass can differentiate with respect to them;
the signature carries the weight values so that callers bind them automatically.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

import attrs
import dace
import numpy as np
import onnx
from returns.result import Failure, Success

from gradflow.core import progress
from gradflow.core.checks import ERROR_FLAG, SITES, IndexSite
from gradflow.core.errors import ORIGINS, GradflowError
from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult, register_pass
from gradflow.core.rule_table import RuleTable
from gradflow.frontend.onnx import fold, limits
from gradflow.frontend.onnx.builder import (
    Dim,
    InvalidNode,
    Lowering,
    NeedsValue,
    RuleUnsupported,
    Tensor,
    params,
    storage_dtype,
)
from gradflow.frontend.onnx.dtypes import check_dtype, input_dtype
from gradflow.frontend.onnx.errors import (
    DynamicShapeError,
    InvalidNodeError,
    MalformedModelError,
    UnsupportedOpError,
    UnsupportedOpsetError,
    UnsupportedTypeError,
)
from gradflow.frontend.onnx.model import OnnxModel
from gradflow.frontend.onnx.naming import Namer
from gradflow.frontend.onnx.rules import default_table
from gradflow.frontend.onnx.spec import check_attributes
from gradflow.frontend.onnx.table import GRADFLOW_OPS, Node, opset_range, select_rule


@attrs.frozen(eq=False)
class InputDecidesShapeError(DynamicShapeError):
    """Graph inputs whose *values* decide shapes; the program specialises on them at call time."""

    inputs: tuple[str, ...] = ()


@attrs.frozen
class Port:
    """One ONNX graph input/output: its name, the SDFG array holding it ('' for an empty output, which
    has no array), logical shape and dtype."""

    onnx_name: str
    array: str
    shape: tuple[Dim, ...]
    dtype: np.dtype


@attrs.frozen(eq=False)
class Signature:
    """Calling convention of a lowered model."""

    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    params: Mapping[str, np.ndarray] = attrs.field(converter=lambda m: MappingProxyType(dict(m)), repr=False)
    symbols: tuple[str, ...] = ()
    weights: tuple[Port, ...] = ()  # float initializers: ONNX name -> SDFG array (values in `params`)
    #: the checks of indices read from data (numbered from 1 in the `ERROR_FLAG` array, when there is one)
    sites: tuple[IndexSite, ...] = ()
    #: node label (the prefix of every state, map and tasklet its rule made) and every array a rule made
    #: -> "ONNX node '<name>' (<op>)"
    origins: Mapping[str, str] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)), repr=False)

    @property
    def error_flag(self) -> str:
        """The SDFG array generated code reports out-of-range indices in ('' when nothing is checked)."""
        return ERROR_FLAG if self.sites else ""


def _value_info_shape(lw: Lowering, vi: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        raise UnsupportedOpError(f"graph input '{vi.name}' has no shape", "export the model with input shapes")
    dims: list[Dim] = []
    for k, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(lw.symbol(d.dim_param or f"{vi.name}_dim{k}"))
    return tuple(dims)


def lower_model(model: OnnxModel, table: RuleTable, max_tensor_bytes: int | None = None) -> tuple[dace.SDFG, Signature]:
    """Build the SDFG of `model` (a fresh one; nothing shared with the caller). No array may need more than
    `max_tensor_bytes` (default: `limits.max_tensor_bytes()`).

    DaCe's source-line info is off while building: it would record gradflow's own file and line numbers
    (inspecting the stack at every node added, most of the lowering time) in the SDFG and its fingerprint.
    """
    with dace.config.set_temporary("compiler", "lineinfo", value="none"), \
            progress.step(f"lowering ONNX model ({len(model.graph().node)} nodes)"):
        return _lower_model(model, table, limits.max_tensor_bytes(max_tensor_bytes))


def _lower_model(model: OnnxModel, table: RuleTable, max_bytes: int) -> tuple[dace.SDFG, Signature]:
    proto = model.proto()
    graph = proto.graph
    namer = Namer()
    lw = Lowering(graph.name or "model", model.opset, namer, max_bytes)
    for sub in graph.node:
        if sub.domain not in ("", "ai.onnx") and (sub.domain, sub.op_type) not in GRADFLOW_OPS:
            raise UnsupportedOpError.build(sub.op_type, sub.name or sub.op_type, sub.domain, _opset_of(proto, sub.domain))

    inits = {t.name: t for t in graph.initializer}
    init_values = model.initializer_values()
    inputs: list[Port] = []
    weights: list[Port] = []
    for vi in graph.input:
        if vi.name in inits:
            continue
        dtype = input_dtype(vi)
        if vi.name in model.bound_inputs:
            lw.set_value(vi.name, model.bound_inputs[vi.name], dtype)
            continue
        shape = _value_info_shape(lw, vi)
        arr = namer("in", vi.name)
        t = Tensor(shape, dtype, arr)
        lw.add_array(arr, t.phys_shape, dtype, f"graph input '{vi.name}'", transient=False)
        lw.set(vi.name, t)
        inputs.append(Port(vi.name, arr, t.shape, t.dtype))
    for name, value in init_values.items():
        check_dtype(value.dtype, f"initializer '{name}'")
        lw.init_values[name] = value
        if value.dtype.kind in "iub":
            lw.set_value(name, value)  # integer data: shapes, axes, indices; never a weight
            continue
        arr = namer("w", name)
        t = Tensor(value.shape, value.dtype, arr)
        lw.add_array(arr, t.phys_shape, value.dtype, f"initializer '{name}'", transient=False)
        lw.params[arr] = value.astype(storage_dtype(value.dtype)).reshape([int(d) for d in t.phys_shape])
        lw.set(name, t)
        weights.append(Port(name, arr, t.shape, t.dtype))

    taken = {p.onnx_name for p in inputs} | set(inits) | set(model.bound_inputs)
    for k, vi in enumerate(graph.output):
        if vi.name not in taken and vi.name not in lw.pending_outputs:
            lw.pending_outputs[vi.name] = namer("out", vi.name)

    origins = {}
    for proto_node in graph.node:
        node = Node.of(proto_node, namer("n", proto_node.name or proto_node.op_type), model.opset)
        origins[node.label] = node.where
        _lower_node(lw, table, node)

    lw.node = None
    outputs: list[Port] = []
    used: set[str] = set()
    for vi in graph.output:
        if vi.name not in lw.tensors:
            raise MalformedModelError(f"graph output '{vi.name}' is never computed")
        t = lw.tensors[vi.name]
        if any(isinstance(d, int) and d == 0 for d in t.shape):  # empty output: no array, nothing to write
            if t.array in lw.sdfg.arrays and not lw.sdfg.arrays[t.array].transient:
                lw.sdfg.remove_data(t.array, validate=False)
            outputs.append(Port(vi.name, "", t.shape, t.dtype))
            continue
        if t.array is None or lw.sdfg.arrays[t.array].transient or t.array in used or t.array in lw.params or any(
            p.array == t.array for p in inputs
        ):
            src = lw.get(vi.name)
            arr = namer("out", vi.name)
            lw.add_array(arr, src.phys_shape, src.dtype, f"graph output '{vi.name}'", transient=False)
            dst = attrs.evolve(src, array=arr, value=None)
            p = params("p", src.rank)
            lw.copy_indexed("output", src, dst, p, p)
            t = dst
        used.add(t.array)
        outputs.append(Port(vi.name, t.array, t.shape, t.dtype))
    sig = Signature(tuple(inputs), tuple(outputs), lw.params, tuple(sorted(s.name for s in lw.symbols.values())),
                    weights=tuple(weights), sites=tuple(lw.sites), origins={**lw.array_origins, **origins})
    lw.sdfg.validate()
    return lw.sdfg, sig


def _opset_of(proto: onnx.ModelProto, domain: str) -> int:
    for imp in proto.opset_import:
        if imp.domain == domain:
            return int(imp.version)
    return 0


def _try_fold(lw: Lowering, node: Node) -> bool:
    """Evaluate `node` now when all its inputs are known values (see `fold`); False when it must be lowered."""
    if node.op_type in fold.NO_FOLD or not node.outputs:
        return False
    present = [n for n in node.inputs if n]
    if not all(lw.has(n) and lw.tensors[n].value is not None for n in present):
        return False
    if node.op_type == "Constant" or not present and node.op_type not in ("ConstantOfShape",):
        return False  # handled by rules (Constant) / nothing to fold
    values = [lw.tensors[n].value if n else None for n in node.inputs]
    if any(v is not None and np.asarray(v).dtype == object for v in values):
        folder = fold.SYMBOLIC.get(node.op_type)
        if folder is None:
            return False
        try:
            out = folder(node, values)
        except fold.SYMBOLIC_ERRORS:  # e.g. an axis out of range: the rule lowers or rejects the node
            return False
        lw.set_value(node.outputs[0], fold.simplify_object(np.asarray(out, dtype=object)))
        return True
    onnx_node = onnx.helper.make_node(node.op_type, list(node.inputs), list(node.outputs))
    onnx_node.attribute.extend(_attrs_proto(node))
    results = fold.fold_numeric(onnx_node, values, lw.opset)
    if results is None or any(r.size > fold.MAX_FOLD_ELEMENTS for r in results):
        return False
    for name, value, wide in zip(node.outputs, results, _widen(lw, node, onnx_node, values)):
        if wide is not None and node.op_type == "Cast" and node.attrs.get("to") == onnx.TensorProto.DOUBLE:
            value = wide
        elif wide is not None and value.dtype in _NARROW and wide.dtype == np.float64 and wide.shape == value.shape:
            lw.wide[name] = wide
        lw.set_value(name, value)
    return True


_NARROW = (np.dtype(np.float16), np.dtype(np.float32))


def _widen(lw: Lowering, node: Node, onnx_node: onnx.NodeProto, values: list) -> list:
    """The node's outputs evaluated again on float64 inputs, when an input is a narrower float (or has a
    float64 value in `lw.wide`); else Nones. A float64 model's exported constants are computed in float32
    (torch's attention scale: Cast(Pow(8.0f, -0.5f), to=double) is 0.35355338 where the module computes
    0.3535533905932738): a `Cast` to double of such a value takes the float64 evaluation instead, what the
    expression gives in the precision the model computes in."""
    narrow = [v is not None and np.asarray(v).dtype in _NARROW for v in values]
    if not any(narrow) and not any(n in lw.wide for n in node.inputs if n):
        return [None] * len(node.outputs)
    wide = [lw.wide.get(n, np.asarray(v, np.float64) if k else v) if n else v
            for n, v, k in zip(node.inputs, values, narrow)]
    results = fold.fold_numeric(onnx_node, wide, lw.opset)
    return list(results) if results is not None else [None] * len(node.outputs)


def _attrs_proto(node: Node) -> list[onnx.AttributeProto]:
    out = []
    for k, v in node.attrs.items():
        if isinstance(v, np.ndarray):
            out.append(onnx.helper.make_attribute(k, onnx.numpy_helper.from_array(v)))
        else:
            out.append(onnx.helper.make_attribute(k, v))
    return out


def _lower_node(lw: Lowering, table: RuleTable, node: Node) -> None:
    where = node.name or f"{node.label} (unnamed)"
    for name in node.inputs:
        if name and not lw.defined(name):
            raise MalformedModelError(f"node '{where}' ({node.op_type}) reads '{name}', which is not defined before it")
    lw.node = node
    try:
        check_attributes(node)
        rule, candidates = select_rule(table, node)
        in_range = [r for r in candidates if opset_range(r)[0] <= node.opset <= opset_range(r)[1]]
        if candidates and not in_range:
            covered = ", ".join(f"{a}-{b}" for a, b in sorted({opset_range(r) for r in candidates}))
            raise UnsupportedOpsetError.build(
                node.op_type, where, node.domain, node.opset, f"its lowering rules cover opsets {covered} only",
                f"export the model with an opset in {covered}, or give load() a table with a rule for this opset")
        if _try_fold(lw, node):
            return
        if rule is None:
            known = node.op_type in table.keys()
            why = "no rule applies to its attributes/opset" if known else "no lowering rule for this op"
            raise UnsupportedOpError.build(node.op_type, where, node.domain, node.opset, why)
        rule.fn(lw, node)
    except RuleUnsupported as exc:
        raise UnsupportedOpError.build(node.op_type, where, node.domain, node.opset, str(exc)) from None
    except InvalidNode as exc:
        raise InvalidNodeError.build(node.op_type, where, node.opset, str(exc)) from None
    except UnsupportedTypeError as exc:  # a rule met a type it cannot represent (e.g. a Cast target)
        raise exc.at_node(node.op_type, where, node.domain, node.opset) from None
    except NeedsValue as exc:
        raise InputDecidesShapeError(
            f"node '{where}' ({node.op_type}) needs the value of '{exc.tensor}' at compile time",
            "only constants, initializers, shape arithmetic or graph inputs may decide shapes",
            (exc.tensor,),
        ) from None
    for out in node.outputs:
        if out and not lw.defined(out):
            raise UnsupportedOpError.build(node.op_type, where, node.domain, node.opset, f"output '{out}' not produced")


@register_pass
@attrs.frozen
class OnnxLower(Pass):
    """Lower the ONNX model in `graph.meta["onnx_model"]` to an SDFG (the placeholder SDFG is ignored).

    `table` selects the rule table (default: the built-in registry), so users can override or add rules.
    """

    table: RuleTable | None = None
    max_tensor_bytes: int | None = None  # None: $GRADFLOW_MAX_TENSOR_BYTES or the default (see `limits`)
    name = "onnx_lower"

    def run(self, graph: Graph) -> PassResult:
        model = graph.meta.get("onnx_model")
        if not isinstance(model, OnnxModel):
            return Failure(
                UnsupportedOpError(
                    "onnx_lower needs a Graph with meta['onnx_model'] (an OnnxModel)",
                    "create it with gradflow.frontend.onnx.model_graph(model)",
                )
            )
        try:
            sdfg, sig = lower_model(model, self.table or default_table(), self.max_tensor_bytes)
        except GradflowError as err:
            return Failure(err)
        return Success(Graph.adopt(sdfg, {**graph.meta, "onnx_signature": sig, SITES: sig.sites,
                                          ORIGINS: sig.origins}))


def model_graph(model: OnnxModel) -> Graph:
    """The placeholder Graph `onnx_lower` consumes: an empty SDFG plus the model in `meta`."""
    return Graph.adopt(dace.SDFG("onnx_placeholder"), {"onnx_model": model})
