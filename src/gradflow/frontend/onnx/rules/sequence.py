"""Sequence ops whose sequences are known while lowering: a sequence is the tuple of tensors it holds.

The exporter writes `torch.chunk` / `Tensor.split` (as in an unrolled `nn.LSTMCell`) as `SplitToSequence`
followed by `SequenceAt` with constant positions. Resolving the positions while lowering turns them into
plain slices, so the AD engine sees ordinary dataflow. A position computed from data, or a sequence that
leaves the graph, is not supported.
"""

from __future__ import annotations

import numpy as np

from gradflow.frontend.onnx.builder import InvalidNode, Lowering, RuleUnsupported, norm_axis, params
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, onnx_rule


@onnx_rule("SplitToSequence", opsets=(11, LATEST_OPSET))
def split_to_sequence(lw: Lowering, node: Node) -> None:
    """Pieces of `split` elements along `axis` (the last one smaller), or of the given sizes, or (without
    `split`) of one element each, the axis dropped unless `keepdims`."""
    x = lw.get(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), x.rank)
    d = x.shape[axis]
    if not isinstance(d, int):
        raise RuleUnsupported("splitting a symbolic dimension into a sequence")
    keep = True
    if node.input(1):
        split = np.asarray(lw.value(node.input(1)))
        if split.ndim == 0:
            chunk = int(split.reshape(-1)[0])
            if chunk <= 0:
                raise InvalidNode(f"split size {chunk} must be positive")
            sizes = [min(chunk, d - k) for k in range(0, d, chunk)]
        else:
            sizes = [int(v) for v in split.reshape(-1)]
            if any(v < 0 for v in sizes) or sum(sizes) != d:
                raise InvalidNode(f"split sizes {sizes} do not add up to the extent {d} of axis {axis}")
    else:
        sizes = [1] * d
        keep = bool(node.attr("keepdims", 1))
    pieces, offset = [], 0
    for size in sizes:
        shape = list(x.shape)
        shape[axis] = size
        if not keep:
            del shape[axis]
        piece = lw.temp(shape, x.dtype, "piece")
        p = params("p", piece.rank)
        src = list(p)
        if keep:
            src[axis] = f"{p[axis]} + {offset}"
        else:
            src.insert(axis, str(offset))
        lw.copy_indexed(node.label, x, piece, src, p)
        pieces.append(piece)
        offset += size
    lw.set_sequence(node.outputs[0], pieces)


@onnx_rule("SequenceAt", opsets=(11, LATEST_OPSET))
def sequence_at(lw: Lowering, node: Node) -> None:
    """The element at a position known while lowering (negative positions count from the end)."""
    elements = lw.sequence(node.inputs[0])
    position = np.asarray(lw.value(node.inputs[1])).reshape(-1)
    if position.size != 1:
        raise InvalidNode(f"position '{node.inputs[1]}' must hold one value, it has {position.size}")
    k = int(position[0])
    n = len(elements)
    if not -n <= k < n:
        raise InvalidNode(f"position {k} is out of range for a sequence of {n} tensors (valid: [{-n}, {n - 1}])")
    lw.set(node.outputs[0], elements[k])
