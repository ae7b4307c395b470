"""Forward mode on every library case (`verify/corpus/library.py`): the tangent at drawn sizes equals
`torch.func.jvp` of the case's torch reference (float64, rtol 1e-9). Library nodes with a tangent rule
(products, reductions, transposes) stay whole; the others are expanded into maps first."""

from __future__ import annotations

import numpy as np
import pytest

from gradflow.verify import _stable_seed, library, tangents


@pytest.mark.parametrize("name", library.names())
def test_library_jvp_equals_torch(name):
    rng = np.random.default_rng(_stable_seed(name))
    tangents.check_library_jvp(name, library.sizes_for(name, rng), 7)
