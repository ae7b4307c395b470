"""`torch.compile(model, backend="gradflow")`: gradflow as a TorchDynamo backend.

Dynamo captures the forward as FX graphs (Python it cannot trace becomes a graph break, run by torch) and
hands each graph to a backend. gradflow's backend (`backend`) runs each graph through
`gradflow.torch.compile`: the graph, as a module (`Captured`), is exported to ONNX, lowered, differentiated
by gradflow's AD and run by its dispatcher; torch's autograd then chains the graphs' backwards and torch's
own code between them.

What Dynamo gives and how it is taken:
- Parameters and buffers arrive as graph inputs (lifted). The `nn.Parameter` inputs become the parameters of
  the `Captured` module (the very same objects, so their gradients reach the user's optimizer); the other
  tensors stay inputs.
- A training-mode `F.batch_norm` updates its running statistics in place, and the graph also has
  `num_batches_tracked.add_(1)`: each such batch norm becomes a BatchNorm submodule holding the user's
  buffers, which `gradflow.torch.compile` updates as torch does. Any other in-place update of a graph
  input is refused (`BackendError`).
- A training-mode `F.dropout` (what `nn.Dropout` becomes in the graph) becomes an `nn.Dropout` submodule,
  and an `F.multi_head_attention_forward` with dropout (what `nn.MultiheadAttention` becomes) an
  `AttentionCall` submodule: their masks are drawn at each call as eager torch draws them
  (`gradflow/torch/dropout.py`).
- A `Captured` module is built at the first real call (the example tensors Dynamo gives the backend are
  fake), one per value of the integer inputs that are no sizes of its tensor inputs and identity of the
  tensors it holds. Dynamo's symbolic sizes (inputs after it sees a second batch size) are read from the
  tensors at each call, so the export keeps them symbolic and the `CompiledModule` runs its one batch
  program for every batch size but its first call's (`gradflow.torch.batch`).
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable, Mapping, Sequence

import torch

from gradflow.core.errors import GradflowError
from gradflow.torch.compiled import CompiledModule, CompileOptions
from gradflow.torch.dropout import AttentionCall


class BackendError(GradflowError):
    """A graph Dynamo captured that gradflow's backend cannot run as it is."""


class _AnyRankBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """A BatchNorm module for an input of any rank (the functional call it stands for did not check)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        return None


def _is_batch_norm(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch.nn.functional.batch_norm


def _argument(node: torch.fx.Node, k: int, name: str, default: Any = None) -> Any:
    return node.args[k] if len(node.args) > k else node.kwargs.get(name, default)


class Captured(torch.nn.Module):
    """One Dynamo graph as a module: its parameter inputs as parameters, its training-mode batch norms as
    BatchNorm submodules, its integer inputs that are sizes of its tensor inputs (Dynamo's symbolic sizes)
    taken from those tensors at each call, its other integer inputs fixed, and `forward` taking the
    remaining tensor inputs."""

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any],
                 sizes: Mapping[int, tuple[int, int]] | None = None) -> None:
        super().__init__()
        # read before the copy, which drops where Dynamo found each input
        users_names = {n.name: _user_name(n) for n in gm.graph.nodes if n.op == "placeholder"}
        gm = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())  # the rewrite below edits a private copy
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(args):
            raise BackendError(f"the captured graph has {len(placeholders)} inputs, but was called with {len(args)}")
        value = dict(zip(placeholders, args))
        self._adopt_batch_norms(gm, value)
        self._adopt_dropouts(gm)
        self._fixed: dict[int, Any] = {}
        self._inputs: list[int] = []
        self._names: dict[str, str] = {}  # parameter -> its name in the user's module ('e.weight')
        #: integer input -> (tensor input, dimension) whose size it is (`size_inputs`), where `args` agree
        self._sizes = {k: (j, dim) for k, (j, dim) in (sizes or {}).items()
                       if isinstance(args[k], int) and isinstance(args[j], torch.Tensor) and args[j].dim() > dim
                       and args[j].size(dim) == args[k]}
        for k, (node, arg) in enumerate(zip(placeholders, args)):
            if k in self._sizes:
                continue
            if not node.users:
                self._fixed[k] = arg if not isinstance(arg, torch.Tensor) else None
            elif isinstance(arg, torch.nn.Parameter):
                self.register_parameter(f"p{k}", arg)
                self._names[f"p{k}"] = users_names.get(node.name, node.name)
            elif isinstance(arg, torch.Tensor):
                self._inputs.append(k)
            else:
                self._fixed[k] = arg
        _refuse_input_updates(gm)
        # values Dynamo left unused (`operator.not_` of a size test whose branch it specialised): a trace
        # would turn them into Python values, which `gradflow.torch.batch` must count against the batch
        gm.graph.eliminate_dead_code()
        gm.recompile()
        self.__dict__["_gm"] = gm  # traced through, not registered: its tensors are the ones above
        self._n = len(placeholders)
        self._params = {k: f"p{k}" for k in range(len(args)) if f"p{k}" in self._parameters}
        held = {id(t) for t in (*self.parameters(), *self.buffers())}
        #: the positions of the arguments this module holds (its parameters and BatchNorm buffers): the
        #: same graph serves another module instance with other tensors there, which needs its own module
        self.held = tuple(k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and id(a) in held)

    def _adopt_batch_norms(self, gm: torch.fx.GraphModule, value: dict) -> None:
        """Each training-mode batch norm on graph-input statistics becomes a call of a BatchNorm submodule
        holding those very tensors; the graph's own `num_batches_tracked.add_(1)` goes (the module counts)."""
        placeholders = {n.name: n for n in value}
        for k, node in enumerate([n for n in gm.graph.nodes if _is_batch_norm(n)]):
            x, mean, var = (_argument(node, i, name) for i, name in enumerate(("input", "running_mean",
                                                                                    "running_var")))
            weight, bias = _argument(node, 3, "weight"), _argument(node, 4, "bias")
            training, momentum = _argument(node, 5, "training", False), _argument(node, 6, "momentum", 0.1)
            eps = _argument(node, 7, "eps", 1e-5)
            if not training or not isinstance(mean, torch.fx.Node) or mean.op != "placeholder":
                continue  # eval mode, or statistics of the batch only: a pure function of its inputs
            if not isinstance(momentum, float):
                raise BackendError("a training-mode batch norm whose momentum is computed in the graph "
                                   "(momentum=None)", "give the BatchNorm a numeric momentum")
            bn = _AnyRankBatchNorm(value[mean].shape[0], eps=eps, momentum=momentum, affine=weight is not None)
            bn.weight, bn.bias = (value[weight], value[bias]) if weight is not None else (None, None)
            bn.running_mean, bn.running_var = value[mean], value[var]
            counter = placeholders.get(mean.name.replace("running_mean", "num_batches_tracked"))
            if counter is not None and counter is not mean:
                bn.num_batches_tracked = value[counter]
                for user in list(counter.users):
                    if user.op == "call_method" and user.target == "add_" and not user.users:
                        gm.graph.erase_node(user)
            self.add_module(f"bn{k}", bn)
            gm.add_submodule(f"bn{k}", bn)
            with gm.graph.inserting_before(node):
                call = gm.graph.call_module(f"bn{k}", (x,))
            node.replace_all_uses_with(call)
            gm.graph.erase_node(node)

    def _adopt_dropouts(self, gm: torch.fx.GraphModule) -> None:
        """Each training-mode `F.dropout` becomes a call of an `nn.Dropout` submodule, and each
        `F.multi_head_attention_forward` with dropout a call of an `AttentionCall` submodule: their masks
        `gradflow.torch.compile` draws as eager torch does (`gradflow.torch.dropout`)."""
        functional = torch.nn.functional
        for k, node in enumerate([n for n in gm.graph.nodes if n.op == "call_function"
                                  and n.target in (functional.dropout, functional.multi_head_attention_forward)]):
            if node.target is functional.dropout:
                p, training = _argument(node, 1, "p", 0.5), _argument(node, 2, "training", True)
                if _argument(node, 3, "inplace", False):
                    continue
                make, args, kwargs = (lambda p=p: torch.nn.Dropout(p)), (_argument(node, 0, "input"),), {}
            else:
                p, training = _argument(node, 10, "dropout_p", 0.0), node.kwargs.get("training", True)
                make, args, kwargs = (lambda p=p: AttentionCall(p)), node.args, dict(node.kwargs)
            if not training or not isinstance(p, float) or p == 0:
                continue
            self.add_module(f"dropout{k}", make())
            gm.add_submodule(f"dropout{k}", self.get_submodule(f"dropout{k}"))
            with gm.graph.inserting_before(node):
                call = gm.graph.call_module(f"dropout{k}", args, kwargs)
            node.replace_all_uses_with(call)
            gm.graph.erase_node(node)

    #: how errors name the module (`gradflow.torch.embedding`)
    owner = "the graph torch.compile captured"

    def describe_tensor(self, name: str) -> str:
        """The user's name of the module tensor this module holds as `name`."""
        return self._names.get(name, name)

    def forward(self, *inputs: torch.Tensor) -> Any:
        args: list[Any] = [None] * self._n
        for k, v in self._fixed.items():
            args[k] = v
        for k, name in self._params.items():
            args[k] = self._parameters[name]
        for k, x in zip(self._inputs, inputs):
            args[k] = x
        for k, (j, dim) in self._sizes.items():
            args[k] = args[j].size(dim)  # traced as the size it is, so the export keeps it symbolic
        return self._gm(*args)

    def batch_inputs(self) -> tuple[bool, ...]:
        """Per tensor input of `forward`, whether Dynamo made its first dimension a symbolic size (the
        batch the compiled module's one program serves)."""
        sized = {(j, dim) for j, dim in self._sizes.values()}
        return tuple((k, 0) in sized for k in self._inputs)

    def inputs_of(self, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        return tuple(args[k] for k in self._inputs)


def _user_name(node: torch.fx.Node) -> str:
    """A parameter input's name in the user's module, read from where Dynamo found it
    (`L['self']._modules['e']._parameters['weight']`) or from the name Dynamo gave the input
    (`l_self_modules_e_parameters_weight_`): 'e.weight'; else the input's own name."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    keys = re.findall(r"\['([^']*)'\]", str(getattr(source, "name", "") or ""))
    if len(keys) > 1:
        return ".".join(keys[1:])
    path = node.name.removeprefix("l_").split("_modules_")
    for kind in ("_parameters_", "_buffers_"):
        if kind in path[-1] and node.name.endswith("_"):
            module, tensor = path[-1].split(kind, 1)
            return ".".join([*path[1:-1], *([module] if len(path) > 1 else []), tensor[:-1]])
    return node.name


def size_inputs(gm: torch.fx.GraphModule) -> dict[int, tuple[int, int]]:
    """The inputs of a graph Dynamo just captured that are sizes of its tensor inputs (Dynamo's symbolic
    sizes: their source is a `TensorPropertySource` of a tensor input's source), as input -> (tensor input,
    dimension). Read when the backend is handed the graph: Dynamo drops the sources afterwards."""
    from torch._dynamo.source import TensorProperty, TensorPropertySource

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = [getattr(n.meta.get("grapharg"), "source", None) for n in placeholders]
    position = {source: j for j, source in enumerate(sources) if source is not None}
    return {k: (position[source.base], source.idx) for k, source in enumerate(sources)
            if isinstance(source, TensorPropertySource) and source.prop is TensorProperty.SIZE
            and source.idx is not None and source.base in position}


def _updates_in_place(node: torch.fx.Node) -> tuple[torch.fx.Node, str] | None:
    """(the input, how) when `node` writes a graph input in place: a method `x.add_(...)`, an item
    assignment `x[i] = v`, an `inplace=True` function, or a training-mode `torch.batch_norm` on input
    statistics (what `_adopt_batch_norms` left)."""
    first = node.args[0] if node.args else None
    how = ""
    if node.op == "call_method" and str(node.target).endswith("_") and not str(node.target).startswith("__"):
        how = str(node.target)
    elif node.op == "call_function" and node.target is operator.setitem:
        how = "item assignment"
    elif node.op == "call_function" and node.kwargs.get("inplace") is True:
        how = f"{getattr(node.target, '__name__', node.target)}(inplace=True)"
    elif node.op == "call_function" and node.target is torch.batch_norm and _argument(node, 5, "training"):
        first, how = _argument(node, 3, "running_mean"), "batch norm statistics"
    if how and isinstance(first, torch.fx.Node) and first.op == "placeholder":
        return first, how
    return None


def _refuse_input_updates(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        found = _updates_in_place(node)
        if found is not None:
            raise BackendError(f"the captured graph updates its input '{found[0].target}' in place "
                               f"({found[1]}); gradflow's programs do not write their inputs",
                               "keep the update outside the compiled function, or use gradflow.torch.compile")


class _Backend:
    """What Dynamo calls in place of one graph: a `Captured` module and its `CompiledModule` per (integer
    inputs other than sizes, held tensors); the compiled module keys its programs by the tensor inputs'
    shapes itself (one program for every batch size where it can)."""

    def __init__(self, gm: torch.fx.GraphModule, options: CompileOptions) -> None:
        self.gm, self.options = gm, options
        self.size_inputs = size_inputs(gm)
        self.compiled: dict[tuple, tuple[Captured, CompiledModule]] = {}
        self.held: tuple[int, ...] | None = None  # positions of held tensors (the same for every call)
        self.sizes: frozenset[int] = frozenset()  # positions of the sizes of tensor inputs

    def _key(self, args: Sequence[Any]) -> tuple:
        """The values of the non-tensor inputs that are no sizes, and the identity of the tensors a
        `Captured` holds (cached modules keep them alive, so an identity is never reused while it is a key)."""
        values = tuple(a for k, a in enumerate(args) if not isinstance(a, torch.Tensor) and k not in self.sizes)
        return values, tuple(id(args[k]) for k in self.held or ())

    def __call__(self, *args: Any) -> Any:
        key = self._key(args)
        found = self.compiled.get(key)
        if found is None:
            module = Captured(self.gm, args, self.size_inputs)
            if self.held is None:
                self.held, self.sizes = module.held, frozenset(module._sizes)
                key = self._key(args)
            found = self.compiled[key] = (module, CompiledModule(module, module.inputs_of(args), self.options,
                                                                 batch=module.batch_inputs()))
        module, compiled = found
        return compiled(*module.inputs_of(args))


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """The Dynamo backend: `torch.compile(model, backend="gradflow")`, or this function itself as the
    backend (`functools.partial(backend, optimize=False)` passes `gradflow.torch.compile`'s options).
    Each captured graph is compiled by gradflow at its first call with each set of input shapes."""
    del example_inputs  # fake tensors: the first real call decides
    return _Backend(gm, CompileOptions.of(options))


def register() -> None:
    """Make "gradflow" a name `torch.compile` knows (once per process)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "gradflow" not in _COMPILER_FNS:
        register_backend(backend, name="gradflow")


__all__ = ["BackendError", "Captured", "backend", "register"]
