"""One program for every batch size, and the evidence that a trace may serve them.

`gradflow.torch.compile` also exports a module with the first dimension of its batch inputs symbolic (the
ONNX `dim_param` `BATCH`), so that every batch size other than the example's (a smaller last batch) runs
one program. A TorchScript trace is
the record of one call, though: where Python turned a traced value into a Python value (`int(x.size(0))`,
`range(x.shape[0])`, `x[: x.size(0) // 2]`, `if x.size(0) > 16:`) the value at the example's batch is
frozen into the graph, and the graph is wrong at other batch sizes, mostly silently. So the symbolic
trace serves every batch only when

1. every conversion the trace made (`traced_conversions`) is batch-free: computed from constants, inputs
   and weights of fixed shape, and the sizes of the inputs' fixed dimensions only, by the trace's own
   record of how the value was made
   (`torch._C._get_value_trace`); or it only decides whether to raise (the line after it is a `raise`: a
   shape check, e.g. torch's own), which the eager forward of every new batch size runs for real; and the
   tracer warned of nothing else (a tensor turned into a constant, iterated, ...);
2. the trace at batch B + 1 is the same graph as at B (`structure`), a second check that sees frozen
   values no hook met.

Otherwise the module gets one program per batch size, and a `BatchSpecializationWarning` names the cause.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import warnings
from typing import Any, Iterator, Sequence

import onnx
import torch

#: the ONNX `dim_param` of the symbolic batch dimension
BATCH = "batch"

#: what a trace turned into Python values, where: 'file:line: what' (empty when batch-free)
Conversions = tuple[str, ...]


class BatchSpecializationWarning(UserWarning):
    """`gradflow.torch.compile` builds one program per batch size for a module whose trace depends on it."""


def batch_inputs(shapes: Sequence[tuple[int, ...]]) -> tuple[bool, ...]:
    """Which inputs have the batch as their first dimension: those whose first dimension is the first
    non-scalar input's (a coincidentally equal size only makes the program ask for equal sizes)."""
    first = next((s[0] for s in shapes if s), None)
    return tuple(bool(s) and s[0] == first for s in shapes)


def batch_of(shapes: Sequence[tuple[int, ...]], example: Sequence[tuple[int, ...]],
             batch: Sequence[bool]) -> int | None:
    """The batch size of a call with input `shapes` if the batch program serves it (the example's shapes
    but for one common first dimension of the batch inputs), else None."""
    size = None
    for shape, ex, b in zip(shapes, example, batch):
        if len(shape) != len(ex) or shape[b:] != ex[b:]:
            return None
        if b:
            if size is not None and shape[0] != size:
                return None
            size = shape[0]
    return size


def grown(args: Sequence[torch.Tensor], batch: Sequence[bool]) -> tuple[torch.Tensor, ...]:
    """`args` with one more row in each batch input (a copy of its first)."""
    return tuple(torch.cat([x, x[:1]]) if b else x for x, b in zip(args, batch))


def mask_cols(numels: Sequence[int], grown_numels: Sequence[int], size: int) -> list[int | None] | None:
    """How each dropout mask is laid out in a batch program, from its element counts at batch `size` and
    `size` + 1: None (fixed size: a flat vector) or its columns c when it has size * c elements (rows of the
    batch); None in place of the list when a mask grows otherwise."""
    cols: list[int | None] = []
    for n, m in zip(numels, grown_numels):
        if n == m:
            cols.append(None)
        elif n % size == 0 and m == n // size * (size + 1):
            cols.append(n // size)
        else:
            return None
    return cols


def structure(model: onnx.ModelProto, module_tensors: Sequence[str]) -> tuple:
    """What an exported graph computes, for comparing two traces: its nodes, graph inputs and outputs,
    the values of its constant initializers, and the names, types and shapes of those that are module
    tensors (whose values the compiled module binds at every call)."""
    graph = model.graph
    tensors = set(module_tensors)
    inits = [(t.name, t.data_type, tuple(t.dims)) if t.name in tensors else t.SerializeToString()
             for t in graph.initializer]
    return (tuple(n.SerializeToString() for n in graph.node), tuple(inits),
            tuple(v.SerializeToString() for v in graph.input), tuple(v.SerializeToString() for v in graph.output))


# -- conversions of traced values ----------------------------------------------------------------------------

_CONVERSIONS = ("__index__", "__int__", "__float__", "__bool__")


#: files whose frames stand between a conversion and the code that asks for it: this module, torch's tensor
#: class, and the torch function modes of `stops` and `draws` the export runs under
_BETWEEN = (__file__, torch._tensor.__file__, os.path.join(os.path.dirname(__file__), "stops.py"),
            os.path.join(os.path.dirname(__file__), "draws.py"))


def _where() -> tuple[str, int]:
    """The file and line of the code (outside this module, torch's tensor class and `stops`) that converts."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in _BETWEEN:
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("?", 0)


def _is_guard(filename: str, line: int) -> bool:
    """Whether the statement after `line` raises: the conversion decides a shape check (`if ...: raise`)."""
    for k in range(line + 1, line + 4):
        text = linecache.getline(filename, k).strip()
        if text:
            return text.startswith("raise ")
    return False


def _batch_free(value: Any, dynamic: set[int]) -> bool:
    """Whether the traced `value` is made from constants, fixed-shape inputs and weights, and sizes of the
    inputs' fixed dimensions only: `dynamic` holds the trace ids of the inputs whose first dimension is
    the batch. (A size of a computed tensor is not followed: not batch-free.)"""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        node = v.node()
        kind = node.kind()
        if kind == "prim::Constant":
            continue
        if kind == "aten::size":
            tensor, *dim = list(node.inputs())
            if tensor.node().kind() != "prim::Param" or not dim or dim[0].node().kind() != "prim::Constant":
                return False  # the size of a computed tensor, or all sizes at once: not followed
            d, rank = dim[0].toIValue(), tensor.type().dim()
            if tensor.unique() in dynamic and (d == 0 or d < 0 and (rank is None or d == -rank)):
                return False
            continue
        if kind == "prim::Param":
            if v.unique() in dynamic:
                return False  # data of a batch input
            continue  # a fixed-shape input or weight: its value does not change with the batch size
        stack.extend(node.inputs())
    return True


@contextlib.contextmanager
def traced_conversions(active: bool, dynamic: Sequence[torch.Tensor] = ()) -> Iterator[list[str]]:
    """While a trace runs: collect, as 'file:line: what', each conversion of a traced value to a Python value
    that is not batch-free (module doc; `dynamic`: the inputs whose first dimension is the batch), and
    every other warning of the tracer. Does nothing unless `active`."""
    found: list[str] = []
    if not active:
        yield found
        return
    originals = {name: getattr(torch.Tensor, name) for name in _CONVERSIONS}

    def hooked(name: str):
        original = originals[name]

        def convert(self: torch.Tensor) -> Any:
            if torch._C._get_tracing_state() is not None:
                filename, line = _where()
                try:
                    value = torch._C._get_value_trace(self)
                except RuntimeError:  # no traced value: a constant of the trace, made of no input
                    value = None
                try:
                    free = value is None or _batch_free(value, {torch._C._get_value_trace(x).unique()
                                                                for x in dynamic})
                except RuntimeError:  # an input without a traced value: nothing is known
                    free = False
                if not free and not _is_guard(filename, line):
                    found.append(f"{filename}:{line}: {name.strip('_')}() of a traced value")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                return original(self)
        return convert

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        for name in _CONVERSIONS:
            setattr(torch.Tensor, name, hooked(name))
        try:
            yield found
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
    for w in caught:
        if issubclass(w.category, torch.jit.TracerWarning):
            found.append(f"{w.filename}:{w.lineno}: {str(w.message).split(':')[0]}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
