"""`gradflow.torch.batch`: which inputs carry the batch, which calls the batch program serves, how masks
grow, and what the trace-conversion check calls batch-free (no compilation here)."""

from __future__ import annotations

import io

import pytest
import torch

from gradflow.torch.batch import batch_inputs, batch_of, grown, mask_cols, traced_conversions


def test_batch_inputs_share_the_first_inputs_first_dimension():
    assert batch_inputs([(32, 4), (32,), (7, 3), ()]) == (True, True, False, False)
    assert batch_inputs([(), (5, 2)]) == (False, True)  # the first non-scalar input decides


def test_a_call_is_served_when_only_the_common_batch_differs():
    example, flags = [(32, 4), (32,), (7, 3)], (True, True, False)
    assert batch_of([(7, 4), (7,), (7, 3)], example, flags) == 7
    assert batch_of([(7, 4), (6,), (7, 3)], example, flags) is None  # the batch inputs disagree
    assert batch_of([(7, 5), (7,), (7, 3)], example, flags) is None  # another fixed dimension
    assert batch_of([(7, 4), (7,), (8, 3)], example, flags) is None  # a fixed input's first dimension
    assert batch_of([(7, 4, 1), (7,), (7, 3)], example, flags) is None  # another rank


def test_grown_adds_one_row_to_the_batch_inputs_only():
    x, w = torch.arange(6.0).reshape(3, 2), torch.ones(2, 2)
    bx, bw = grown([x, w], (True, False))
    assert bx.shape == (4, 2) and torch.equal(bx[3], x[0]) and bw is w


def test_masks_grow_by_rows_of_the_batch_or_not_at_all():
    assert mask_cols([32 * 12, 40], [33 * 12, 40], 32) == [12, None]
    assert mask_cols([32 * 32], [33 * 33], 32) is None  # a (batch, batch) mask is not rows of the batch


class _Forward(torch.nn.Module):
    def __init__(self, body) -> None:
        super().__init__()
        self.body = body

    def forward(self, x, w):
        return self.body(x, w)


def _found(body, x, w) -> list[str]:
    with traced_conversions(True, [x]) as found:
        torch.onnx.export(_Forward(body), (x, w), io.BytesIO(), dynamo=False, input_names=["x", "w"],
                          dynamic_axes={"x": {0: "batch"}})
    return found


def _guarded(x, w):
    if x.size(0) > 1000:
        raise ValueError("too large")
    return x * 2


@pytest.mark.parametrize("body, free", [
    (lambda x, w: x * x.size(1), True),                          # a fixed dimension, kept symbolic anyway
    (lambda x, w: sum(x[:, k] for k in range(x.shape[1])), True),  # a loop over a fixed dimension
    (lambda x, w: x[:, : w.shape[0]], True),                       # a fixed-shape input's size
    (_guarded, True),                                             # a shape check that raises
    (lambda x, w: x[: x.shape[0] // 2], False),                    # a slice by the batch size
    (lambda x, w: x.sum() / int(x.size(0)), False),                # int() of the batch size
    (lambda x, w: x * (2 if x.size(0) > 4 else 1), False),         # a branch on the batch size
    (lambda x, w: x * float(x.sum()), False),                      # data of a batch input
])
def test_conversions_are_batch_free_only_when_made_of_fixed_sizes(body, free):
    found = _found(body, torch.randn(6, 3), torch.randn(2))
    assert (found == []) == free, found
