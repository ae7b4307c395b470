"""torch's embedding options that its ONNX export drops, found while the module is exported.

The TorchScript exporter writes `nn.Embedding` / `F.embedding` as a plain `Gather`: `padding_idx` (that row
gets no gradient) and `scale_grad_by_freq` (each row's gradient divided by its count in the batch) only
change the backward, so the exported graph computes the same forward and a different gradient; `max_norm`
renormalises the looked-up rows of the weight in place at every call, which the graph does not do at all.
`recorded` watches the embedding calls of one export; `refuse` turns what it saw into a typed error before
a program that would differ from torch is built.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import attrs
import torch

from gradflow.torch.errors import DroppedOptionError


@attrs.frozen
class EmbeddingOption:
    """One embedding lookup's option that the export drops: the module tensor it reads (its `state_dict`
    name), the option as the user wrote it, and whether it changes the forward value too."""

    weight: str
    option: str
    changes_forward: bool


@contextlib.contextmanager
def recorded(tensors: Mapping[str, torch.Tensor]) -> Iterator[list[EmbeddingOption]]:
    """While active, every `torch.embedding` call (what `F.embedding` and `nn.Embedding` end in) and every
    in-place renormalisation of an embedding table is recorded; `tensors` names the module's tensors."""
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
        if padding_idx is not None and padding_idx >= 0:
            found.append(EmbeddingOption(name_of(weight), f"padding_idx={padding_idx}", False))
        if scale_grad_by_freq:
            found.append(EmbeddingOption(name_of(weight), "scale_grad_by_freq=True", False))
        return lookup(weight, indices, padding_idx, scale_grad_by_freq, sparse)

    def embedding_renorm_(weight, indices, max_norm, norm_type):
        # recorded, not done: the export is refused (`refuse`), and the module's table stays as it was
        found.append(EmbeddingOption(name_of(weight), f"max_norm={max_norm}", True))
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


def refuse(options: Sequence[EmbeddingOption], trained: set[str], module: Any) -> None:
    """Raise for an option that changes the forward value, or the gradient of a tensor in `trained`; the
    error names `module` and its tensor as the user knows them (a Dynamo graph's `describe_tensor`)."""
    owner = getattr(module, "owner", type(module).__name__)
    describe = getattr(module, "describe_tensor", lambda name: name)
    for o in options:
        if not (o.changes_forward or o.weight in trained):
            continue
        weight = describe(o.weight)
        if o.changes_forward:
            raise DroppedOptionError(
                f"{owner} looks up {weight} with {o.option}, which renormalises its rows in place at every "
                "call; the ONNX export gradflow.torch.compile traces does not record that, so the compiled "
                "module would compute another value",
                "drop max_norm (or renormalise the table yourself between steps, under torch.no_grad())")
        if o.option.startswith("padding_idx"):
            what = "gives that row no gradient"
            hint = (f"freeze the table ({weight}.requires_grad_(False)), or drop padding_idx and zero the padded "
                    "positions' lookups yourself: `e(idx) * (idx != p).unsqueeze(-1)` gives row p no gradient "
                    "and equals torch's lookup while that row is zero, as nn.Embedding starts it")
        else:
            what = "divides each row's gradient by its count in the batch"
            hint = f"drop {o.option}, or freeze the table ({weight}.requires_grad_(False))"
        raise DroppedOptionError(
            f"{owner} looks up {weight} with {o.option}, which {what} in torch; the ONNX export "
            "gradflow.torch.compile traces writes a plain lookup without it, so training through gradflow "
            "would give another gradient", hint)
