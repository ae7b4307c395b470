"""torch's embedding options that its ONNX export drops, written into the export or refused.

The TorchScript exporter writes `nn.Embedding` / `F.embedding` as a plain `Gather`: `padding_idx` (that row
gets no gradient) and `scale_grad_by_freq` (each row's gradient divided by its count in the batch) only
change the backward, so the exported graph computed the same forward and a different gradient (the
exporter itself refuses `scale_grad_by_freq` in training mode); `max_norm` renormalises the looked-up rows
of the weight in place at every call, which the graph does not do at all. While the module is traced and
exported, `recorded` writes the first two into the lookup with gradflow's stop of the gradient
(`stops.stopped`, exported as `StopGradient`): the padding row's lookups are stopped, and each lookup
passes on 1/count of its gradient (`held + (rows - held) / count`, the value `rows` exactly); torch's
gradient. `max_norm` is recorded, and `refuse` turns it into a typed error before anything is built.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import attrs
import torch

from gradflow.torch import stops
from gradflow.torch.errors import DroppedOptionError


@attrs.frozen
class EmbeddingOption:
    """One embedding lookup's option that the export cannot express: the module tensor it reads (its
    `state_dict` name) and the option as the user wrote it."""

    weight: str
    option: str


@contextlib.contextmanager
def recorded(tensors: Mapping[str, torch.Tensor]) -> Iterator[list[EmbeddingOption]]:
    """While active, every `torch.embedding` call (what `F.embedding` and `nn.Embedding` end in) computes
    the lookup with its `padding_idx` and `scale_grad_by_freq` written out (module doc), and every in-place
    renormalisation of an embedding table is recorded, not done; `tensors` names the module's tensors."""
    names: dict[object, str] = {}
    for name, t in tensors.items():  # by the tensor, and by its storage (the renorm is given a detached view)
        names.setdefault(id(t), name)
        if _storage(t) is not None:
            names.setdefault(_storage(t), name)
    found: list[EmbeddingOption] = []
    lookup, renorm = torch.embedding, torch.embedding_renorm_

    def name_of(weight: torch.Tensor) -> str:
        where = _storage(weight)
        return names.get(id(weight)) or (names.get(where) if where is not None else None) or "an embedding table"

    def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        rows = lookup(weight, indices, -1, False, sparse)  # the options change no value: they are below
        if scale_grad_by_freq:
            # torch divides each row's gradient by the row's count in the batch: each lookup passes on that
            # share of its gradient, `held + (rows - held) * share` (the value is `rows`, exactly)
            flat = indices.reshape(-1)
            counts = torch.zeros(weight.shape[0], dtype=weight.dtype).scatter_add(
                0, flat, torch.ones_like(flat, dtype=weight.dtype))
            held = stops.stopped(rows)
            rows = held + (rows - held) * (1.0 / counts[indices]).unsqueeze(-1)
        if padding_idx is not None and padding_idx >= 0:  # (F.embedding made a negative one positive)
            # torch gives row padding_idx no gradient: the lookups of that row are stopped (the same value;
            # the export writes the stop as gradflow's StopGradient), so only they would have given it one
            rows = torch.where((indices == padding_idx).unsqueeze(-1), stops.stopped(rows), rows)
        return rows

    def embedding_renorm_(weight, indices, max_norm, norm_type):
        # recorded, not done: the export is refused (`refuse`), and the module's table stays as it was
        found.append(EmbeddingOption(name_of(weight), f"max_norm={max_norm}"))
        return weight

    torch.embedding, torch.embedding_renorm_ = embedding, embedding_renorm_
    try:
        yield found
    finally:
        torch.embedding, torch.embedding_renorm_ = lookup, renorm


def _storage(t: torch.Tensor) -> tuple | None:
    """Where a tensor's elements live and its shape (a traced size is a tensor, hence `int`); None for a
    tensor without storage (an uninitialized parameter)."""
    try:
        return t.data_ptr(), tuple(map(int, t.shape))
    except (RuntimeError, ValueError):
        return None


def refuse(options: Sequence[EmbeddingOption], module: Any) -> None:
    """Raise for the first of `options` (a `max_norm`, which changes the forward value); the error names
    `module` and its tensor as the user knows them (a Dynamo graph's `describe_tensor`)."""
    owner = getattr(module, "owner", type(module).__name__)
    describe = getattr(module, "describe_tensor", lambda name: name)
    for o in options:
        raise DroppedOptionError(
            f"{owner} looks up {describe(o.weight)} with {o.option}, which renormalises its rows in place at "
            "every call; the ONNX export gradflow.torch.compile traces does not record that, so the compiled "
            "module would compute another value",
            "drop max_norm (or renormalise the table yourself between steps, under torch.no_grad())")
