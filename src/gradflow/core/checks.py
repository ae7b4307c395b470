"""Run-time checks that generated code reports through an error flag instead of crashing.

An index read from data (ONNX Gather, ScatterND, a loss's class labels, ...) can only be checked while the
program runs. Generated code that computes such an index checks it; when it is out of range the code
neither reads nor writes through it, and it records what went wrong in the non-transient int64 array
`ERROR_FLAG` = [site, index, extent]: `site` is the 1-based number of the check in the program's table
of `IndexSite`s (0 = no error). Every gradflow path that runs such a program (an `OnnxProgram` call,
`value_and_grad`, `gradflow.torch.function`) calls `raise_for_flag` after the native call, which turns a
set flag into an `IndexOutOfRangeError` naming the site. The table travels with the program: in
`Graph.meta[SITES]` (kept by every pass) and in `VJPResult.index_sites`.

It lives in `core` because both sides use it: the ONNX frontend, which must not import torch, generates the
checks, and the runtime paths (which do import torch) raise for them.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from gradflow.core.errors import IndexOutOfRangeError

#: The int64[3] array generated code sets when an index is out of range: [site (1-based), index, extent].
ERROR_FLAG = "gradflow_error"

#: Elements of `ERROR_FLAG`.
FLAG_SIZE = 3

#: The `Graph.meta` key holding the program's tuple of `IndexSite`s.
SITES = "index_sites"


@attrs.frozen
class IndexSite:
    """One place where generated code checks an index: `where` names the node (e.g. "ONNX node 'emb'
    (Gather)"), `what` the index (e.g. "indices of input 'W' along axis 0"). `wraps`: negative indices
    count from the end (so the valid range is [-extent, extent - 1])."""

    where: str
    what: str
    wraps: bool = True


def raise_for_flag(flag: Any, sites: Sequence[IndexSite]) -> None:
    """Raise `IndexOutOfRangeError` when `flag` (the `ERROR_FLAG` array after a run, numpy or torch, or
    None when the program has none) reports an index out of range."""
    if flag is None:
        return
    site, index, extent = (int(v) for v in flag.reshape(-1)[:FLAG_SIZE].tolist())
    if site == 0:
        return
    valid = f"[{-extent}, {extent - 1}]" if 0 < site <= len(sites) and sites[site - 1].wraps else f"[0, {extent - 1}]"
    if extent <= 0:
        valid = "none (the axis is empty)"
    if 0 < site <= len(sites):
        place = f"{sites[site - 1].where}: {sites[site - 1].what}"
    else:
        place = f"index check {site} of the program"
    raise IndexOutOfRangeError(
        f"{place}: index {index} is out of range (valid: {valid}); nothing was read or written through it and "
        "the outputs of this call are invalid",
        "fix the index data given to the program",
    )
