"""What reverse mode hands to its users: the forward/backward pair and the names that connect them."""

from __future__ import annotations

from typing import Mapping

import attrs
import dace


@attrs.frozen
class VJPResult:
    """Separate forward and backward SDFGs for a vector-Jacobian product.

    Calling convention (all arrays are DaCe arguments by name; symbols are inferred from shapes):
    - `forward` takes every non-transient array of the original program and computes what it computed.
      In addition it writes each name in `saved` that is not an argument of the original program (a
      transient the backward needs, or a copy taken before an overwrite): these are extra non-transient
      outputs that the caller allocates (shapes/dtypes from `forward.arrays`) and keeps for the backward.
    - `backward` takes, by name: every array in `forwarded` (values from the forward run: original
      arguments as they were *after* the forward ran, plus the extra `saved` outputs), the cotangent
      `cotangents[o]` for each `o` in `of` (read only), and writes the gradient `grads[x]` for each `x` in
      `wrt` (overwritten, need not be zeroed).
    """

    forward: dace.SDFG
    backward: dace.SDFG
    wrt: tuple[str, ...]
    of: tuple[str, ...]
    grads: Mapping[str, str]
    cotangents: Mapping[str, str]
    forwarded: tuple[str, ...]
    saved: tuple[str, ...]
    forwarded_bytes: int = 0
