"""What reverse mode hands to its users: the forward/backward pair and the names that connect them."""

from __future__ import annotations

from typing import Mapping

import attrs
import dace

from gradflow.autodiff.spec import ForwardingPlan


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
    forwarded_bytes: int = 0  # bytes of `saved` when their sizes are constants (see `saved_bytes`)
    saved_sizes: Mapping[str, object] = attrs.field(factory=dict)  # saved array -> size in bytes (symbolic)
    #: the index checks the forward reports in `gradflow.core.checks.ERROR_FLAG` (when it has that array)
    index_sites: tuple = ()
    #: how values reach the backward (`gradflow.autodiff.spec.ForwardingPlan`), as the reverse pass built it
    forwarding_plan: ForwardingPlan | None = None
    #: the loops the forward checks (`gradflow.autodiff.spec.LoopLimit`), reporting a breach through its
    #: output `gradflow_overflow` (nonzero: the gradients of that run are invalid; `spec.check_loop_bounds`)
    bounded_loops: tuple = ()

    def saved_bytes(self, symbols: Mapping[str, int] | None = None) -> int:
        """Bytes the forward keeps for the backward beyond the program's own arguments (its transients
        and the tape), with symbolic sizes evaluated at `symbols`."""
        values = {dace.symbolic.symbol(k): v for k, v in (symbols or {}).items()}
        total = 0
        for name, size in self.saved_sizes.items():
            size = dace.symbolic.pystr_to_symbolic(str(size)).subs(values)
            if getattr(size, "free_symbols", None):
                raise ValueError(f"size of '{name}' depends on {sorted(map(str, size.free_symbols))}; pass symbols=")
            total += int(size)
        return total
