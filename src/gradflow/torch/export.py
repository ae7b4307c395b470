"""Export a torch module to ONNX so that its parameters stay parameters, and check that they did.

`gradflow.torch.compile` trains the exported graph with the module's own tensors bound to the ONNX
initializers of the same name. That only trains the module the user wrote when every parameter and
buffer the graph reads is an initializer named and shaped like it: an export that folds BatchNorm into
a Conv, stores a Linear weight transposed, or merges equal initializers (a fresh BatchNorm's weight and
running_var are both ones) yields a graph that computes the same values today and trains another model.
So `export_module` asks the TorchScript exporter for exactly that (no constant folding, no
de-duplication, modes as the modules have them), and `check_initializers` rejects any model that lost
a tensor, naming it and what happened to it.

Training-mode BatchNorm: ONNX's own running-statistics outputs follow ONNX's convention (momentum stored
as a float32 attribute, population variance), not torch's, so `expose_batch_stats` sets each such node's
momentum to 0, which makes those outputs the batch mean and population variance of its input, and makes
them graph outputs; the compiled module updates the buffers from them exactly as torch does
(`BatchStats`).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Mapping, Sequence

import attrs
import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from gradflow.torch import stops
from gradflow.torch.batch import BATCH, Conversions, traced_conversions
from gradflow.torch.dropout import Mask, RandomSite, attention_drops, attention_mask, masks_as_inputs
from gradflow.torch.embedding import recorded, refuse
from gradflow.torch.errors import ExportError, LostParameterError
from gradflow.torch.precision import float32_scales, undo_scalar_downcasts

#: the opset the TorchScript exporter writes (its newest); gradflow's rules cover it
OPSET = 20
INPUT_PREFIX, OUTPUT_PREFIX, STATS_PREFIX = "gradflow_input_", "gradflow_output_", "gradflow_stats_"
MASK_PREFIX = "gradflow_mask_"


@attrs.frozen
class BatchStats:
    """One training-mode BatchNorm of the exported graph: the module whose buffers it updates and the graph
    outputs holding its input's batch mean and population variance (the number of values per channel,
    which the update needs, is the call's: `compiled._Traced.counts`)."""

    module: str  # qualified name of the `_BatchNorm` module ('' for the root)
    mean_output: str
    var_output: str


@attrs.frozen(eq=False)
class Exported:
    """An exported module: the ONNX model, its positional inputs and outputs (graph names; an input the
    graph does not read is None), the initializers that are module tensors, and the BatchNorm statistics."""

    model: onnx.ModelProto
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    tensors: tuple[str, ...]
    stats: tuple[BatchStats, ...]
    #: the dropout masks, inputs after the positional ones drawn at every call, in the order the forward
    #: uses them, and their graph input names (None: the graph does not read it)
    masks: tuple[Mask, ...] = ()
    mask_inputs: tuple[str | None, ...] = ()
    #: what the trace turned from a traced value into a Python value (when traced with a symbolic batch)
    conversions: Conversions = ()
    #: where the forward registers gradient hooks on its tensors (`stops.exported_as_stops`)
    hooks: tuple[str, ...] = ()


def _quiet_export(module: torch.nn.Module, args: tuple, input_names: list[str], output_names: list[str],
                  dynamic_axes: Mapping[str, Mapping[int, str]] | None = None) -> bytes:
    """The exported model's bytes. With `dynamic_axes` the tracer's warnings all reach the caller
    (`batch.traced_conversions` judges them); else those from inside torch.nn are dropped."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # the TorchScript exporter is deprecated but is the one that keeps initializers as they are; the
        # mutation it removes is num_batches_tracked's increment, which the compiled module does itself
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="ONNX Preprocess - Removing mutation")
        if not dynamic_axes:
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch\.nn\.")
        # an RNN's initial state for another batch size: the batch program's trace is checked at two batch
        # sizes instead (gradflow.torch.batch)
        warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size other than 1")
        torch.onnx.export(
            module, args, buf, dynamo=False, export_params=True, do_constant_folding=False,
            keep_initializers_as_inputs=True,  # also turns off de-duplication of equal initializers
            training=torch.onnx.TrainingMode.PRESERVE, opset_version=OPSET,
            input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes or None)
    return buf.getvalue()


def _attention_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """`scaled_dot_product_attention` written out (softmax(q k^T * scale + mask) v), for the exporter: the
    TorchScript exporter cannot trace the fused op as `nn.MultiheadAttention` calls it (`is_causal` arrives
    as a tensor), while these ops (MatMul, Softmax, Where/Add) it exports and gradflow lowers."""
    if isinstance(is_causal, torch.Tensor):
        is_causal = bool(is_causal)  # a traced constant
    if dropout_p and not attention_drops():
        raise ExportError("attention with dropout in training mode outside torch.nn.MultiheadAttention: gradflow "
                          "draws attention masks for nn.MultiheadAttention only",
                          "call .eval() on the module, or give it dropout=0")
    if enable_gqa:
        raise ExportError("grouped-query attention (enable_gqa=True) is not exported by gradflow yet")
    weights = torch.matmul(query, key.transpose(-2, -1)) * (query.size(-1) ** -0.5 if scale is None else scale)
    if is_causal:
        causal = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool).tril()
        weights = weights.masked_fill(causal.logical_not(), float("-inf"))
    if attn_mask is not None:
        weights = (weights.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool
                   else weights + attn_mask)
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights * attention_mask(weights.shape) if dropout_p else weights, value)


@contextlib.contextmanager
def _traceable_attention():
    """While exporting, `torch.nn.functional.scaled_dot_product_attention` is `_attention_math`."""
    functional = torch.nn.functional
    fused = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _attention_math
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = fused


@contextlib.contextmanager
def _all_buffers_persistent(module: torch.nn.Module):
    """The exporter takes its initializers from the `state_dict`: a non-persistent buffer would be traced as
    a constant of the graph (its value frozen), so it is made persistent while exporting."""
    saved = [(m, set(m._non_persistent_buffers_set)) for m in module.modules()]
    try:
        for m, _ in saved:
            m._non_persistent_buffers_set.clear()
        yield
    finally:
        for m, names in saved:
            m._non_persistent_buffers_set.update(names)


def _check_outputs(model: onnx.ModelProto, shapes: Sequence[tuple[int, ...]], owner: str, what: str) -> None:
    """The graph outputs must be the forward's tensors, in the order `pytree` flattens them (checked by shape)."""
    outputs = model.graph.output
    if len(outputs) != len(shapes):
        raise ExportError(f"{what} of {owner} has {len(outputs)} outputs, but its forward returns {len(shapes)} "
                          "tensors", "return tensors, or tuples/lists/dicts of tensors")
    for k, (vi, shape) in enumerate(zip(outputs, shapes)):
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim)
        if len(dims) != len(shape) or any(d is not None and d != n for d, n in zip(dims, shape)):
            raise ExportError(f"output {k} ('{vi.name}') of {what} of {owner} has shape {dims}, but the forward's "
                              f"tensor {k} has shape {shape}", "return tensors, or tuples/lists/dicts of tensors")


def export_module(module: torch.nn.Module, args: Sequence[torch.Tensor], shapes: Sequence[tuple[int, ...]],
                  dropouts: Sequence[RandomSite] = (), *, batch: Sequence[bool] | None = None,
                  mask_cols: Sequence[int | None] | None = None) -> Exported:
    """Export `module(*args)` (in the train/eval modes its submodules have now) and check its initializers
    and that its outputs have the `shapes` of the forward's output tensors. `dropouts`: the Dropout calls
    of a forward (`dropout.record_calls`); those in training mode multiply by mask inputs, laid out as
    `mask_cols` says (`dropout.masks_as_inputs`). `batch`: per input, whether its first dimension is the
    symbolic `BATCH` (then masks with `cols` have it too, and the trace's conversions of traced values
    to Python values are recorded in `Exported.conversions`)."""
    owner = getattr(module, "owner", type(module).__name__)  # a Dynamo graph's is the user's name for it
    input_names = [f"{INPUT_PREFIX}{k}" for k in range(len(args))]
    output_names = [f"{OUTPUT_PREFIX}{k}" for k in range(len(shapes))]
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()),
                 next((a.dtype for a in args if a.is_floating_point()), torch.get_default_dtype()))
    conversions: Conversions = ()
    with masks_as_inputs(module, dropouts, dtype, len(args), mask_cols) as (masks, examples):
        mask_names = [f"{MASK_PREFIX}{k}" for k in range(len(masks))]
        dynamic = {}
        if batch is not None:
            dynamic = {n: {0: BATCH} for n, b in zip(input_names, batch) if b}
            dynamic.update({n: {0: BATCH} for n, m in zip(mask_names, masks) if m.cols is not None})
        try:
            varying = ([a for a, b in zip(args, batch) if b]
                       + [e for e, m in zip(examples, masks) if m.cols is not None] if batch is not None else [])
            with _all_buffers_persistent(module), _traceable_attention(), stops.exported_as_stops() as hooks, \
                    traced_conversions(batch is not None, varying) as seen, recorded(named_tensors(module)) as dropped:
                data = _quiet_export(module, (*args, *examples), input_names + mask_names, output_names, dynamic)
            conversions = tuple(seen)
        except (RuntimeError, TypeError, ValueError, torch.onnx.errors.OnnxExporterError) as exc:
            raise ExportError(f"torch.onnx.export of {owner} failed: {type(exc).__name__}: {exc}",
                              "gradflow.torch.compile traces the module with torch.onnx.export(dynamo=False); "
                              "make its forward traceable (tensors in, tensors out)") from exc
        refuse(dropped, module)  # an option that changes the forward value, trained or not
        model = onnx.load_from_string(data)
        undo_scalar_downcasts(model)
        float32_scales(model)
        matched = check_initializers(model, named_tensors(module), owner)
    graph_inputs = {vi.name for vi in model.graph.input}
    _check_outputs(model, shapes, owner, "the ONNX export")
    outputs = tuple(o.name for o in model.graph.output)
    stats = expose_batch_stats(model, module)
    return Exported(model, tuple(n if n in graph_inputs else None for n in input_names), outputs, matched, stats,
                    tuple(masks), tuple(n if n in graph_inputs else None for n in mask_names), conversions,
                    tuple(dict.fromkeys(hooks)))


def adopt_model(model: onnx.ModelProto, module: torch.nn.Module, n_inputs: int,
                shapes: Sequence[tuple[int, ...]]) -> Exported:
    """A model the user exported (a private copy, as `read_model` gives it), checked like `export_module`'s:
    its initializers against the module's tensors, its graph inputs (those that are no initializers, in
    order) against the forward's `n_inputs` positional inputs and its outputs against the forward's
    output tensors (their `shapes`)."""
    owner = type(module).__name__
    matched = check_initializers(model, named_tensors(module), owner)
    inits = {t.name for t in model.graph.initializer}
    inputs = tuple(vi.name for vi in model.graph.input if vi.name not in inits)
    if len(inputs) != n_inputs:
        raise ExportError(f"the ONNX model given for {owner} has {len(inputs)} inputs, but the module takes "
                          f"{n_inputs}", "export the module itself with the example inputs, or let "
                          "gradflow.torch.compile do it")
    _check_outputs(model, shapes, owner, "the ONNX model given")
    outputs = tuple(o.name for o in model.graph.output)
    return Exported(model, inputs, outputs, matched, expose_batch_stats(model, module))


def named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `module` by its `state_dict`-style name (shared tensors under every name)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in module.named_parameters(remove_duplicate=False):
        out[name] = t
    for name, t in module.named_buffers(remove_duplicate=False):
        if t is not None:
            out[name] = t
    return out


def _init_values(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def check_initializers(model: onnx.ModelProto, tensors: Mapping[str, torch.Tensor], owner: str) -> tuple[str, ...]:
    """The initializers of `model` that are tensors of the module (same name); raises `LostParameterError`
    when one of them has another shape, element type or value (the model is exported from the module as
    it is now), or when a floating parameter/buffer is not an
    initializer while an Identity node stands for it (merged into another initializer) or the model holds
    a floating initializer of the same size that is no module tensor (a transposed, reshaped or folded
    copy). Any other tensor that is no initializer is one the graph does not read: it gets no gradient,
    as in torch."""
    inits = _init_values(model)
    hint = ("export with torch.onnx.export(..., dynamo=False, do_constant_folding=False, "
            "keep_initializers_as_inputs=True, training=torch.onnx.TrainingMode.PRESERVE), or let "
            "gradflow.torch.compile export the module itself")
    matched = []
    for name, proto in inits.items():
        if name not in tensors:
            continue
        t = tensors[name]
        shape = tuple(int(d) for d in proto.dims)
        if shape != tuple(t.shape):
            raise LostParameterError(
                f"ONNX initializer '{name}' has shape {shape}, but {owner}'s '{name}' has shape {tuple(t.shape)}: "
                "the export transposed or reshaped it", hint)
        want = helper.tensor_dtype_to_np_dtype(proto.data_type)
        if want != np.dtype(str(t.dtype).removeprefix("torch.")):
            raise LostParameterError(
                f"ONNX initializer '{name}' has element type {want}, but {owner}'s '{name}' is {t.dtype}", hint)
        if not np.array_equal(numpy_helper.to_array(proto), t.detach().cpu().numpy(), equal_nan=True):
            raise LostParameterError(
                f"ONNX initializer '{name}' holds other values than {owner}'s '{name}': the export folded "
                "another tensor into it (e.g. a BatchNorm into the Conv before it)", hint)
        matched.append(name)
    orphans = {n: p for n, p in inits.items() if n not in tensors
               and helper.tensor_dtype_to_np_dtype(p.data_type).kind == "f"}
    identities = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity" and n.input}
    for name, t in tensors.items():
        if name in inits or not t.is_floating_point():
            continue
        if name in identities and identities[name] in inits:
            raise LostParameterError(f"{owner}'s '{name}' was merged into ONNX initializer '{identities[name]}' "
                                     "(an Identity node stands for it)", hint)
        same_size = sorted(o for o, p in orphans.items() if int(np.prod(p.dims, dtype=np.int64)) == t.numel())
        if same_size:
            raise LostParameterError(
                f"{owner}'s '{name}' is not an ONNX initializer, and initializer(s) {', '.join(map(repr, same_size))} "
                "of the same size are no tensor of the module (folded, transposed or renamed by the export)", hint)
    return tuple(matched)


def _batchnorm_module(module: torch.nn.Module, buffer: str) -> tuple[str, torch.nn.Module] | None:
    path, _, attr = buffer.rpartition(".")
    if attr != "running_mean":
        return None
    try:
        owner = module.get_submodule(path)
    except AttributeError:
        return None
    return (path, owner) if isinstance(owner, torch.nn.modules.batchnorm._BatchNorm) else None


def _is_initializer(model: onnx.ModelProto, name: str) -> bool:
    return any(t.name == name for t in model.graph.initializer)


def _training_mode(node: onnx.NodeProto) -> bool:
    return any(a.name == "training_mode" and a.i for a in node.attribute)


def expose_batch_stats(model: onnx.ModelProto, module: torch.nn.Module) -> tuple[BatchStats, ...]:
    """Expose, for every training-mode BatchNormalization reading a BatchNorm module's running statistics,
    its input's per-channel mean and population variance as graph outputs (edits `model`, which this module
    created). A training-mode node whose statistics are no module's buffers is an `ExportError`."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {vi.name: vi.type.tensor_type for vi in
              [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    stats = []
    for k, node in enumerate(list(model.graph.node)):
        if node.op_type != "BatchNormalization" or not _training_mode(node):
            continue
        node_attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if not _is_initializer(model, node.input[3]):
            continue  # statistics computed in the graph (track_running_stats=False): no buffers to update
        found = _batchnorm_module(module, node.input[3])
        if found is None:
            raise ExportError(f"training-mode BatchNormalization node '{node.name}' reads '{node.input[3]}', "
                              "which is not the running_mean of a torch.nn BatchNorm module",
                              "use torch.nn.BatchNorm1d/2d/3d modules, or compile the module in eval mode")
        path, _ = found
        channels = int(next(t.dims[0] for t in model.graph.initializer if t.name == node.input[3]))
        # The node's running-statistics outputs with momentum 0 are its batch mean and population variance
        # (running * 0 + batch * 1), which it computes anyway: a second pass over the input is not needed.
        tag = f"{STATS_PREFIX}{k}"
        mean, var = f"{tag}_mean", f"{tag}_var"
        outputs = list(node.output) + [""] * (3 - len(node.output))
        outputs[1:3] = [mean, var]
        del node.output[:]
        node.output.extend(outputs)
        del node.attribute[:]  # only epsilon, momentum and training_mode exist in opset 14+
        node.attribute.extend([helper.make_attribute("epsilon", float(node_attrs.get("epsilon", 1e-5))),
                               helper.make_attribute("momentum", 0.0),
                               helper.make_attribute("training_mode", 1)])
        elem = shapes[node.input[0]].elem_type
        model.graph.output.extend([helper.make_tensor_value_info(n, elem, [channels]) for n in (mean, var)])
        stats.append(BatchStats(path, mean, var))
    return tuple(stats)
