"""The one DaCe warning gradflow silences, and only around the DaCe calls that cause it.

DaCe warns "Using sets for connectors is discouraged" whenever a tasklet or nested SDFG gets its
connectors as a set (their order, hence the generated function's parameter order, may differ between
processes). Two DaCe routines gradflow calls pass sets themselves: its Python frontend (parsing a
`@dace.program`, e.g. for every augmented assignment `m[0] += ...`) and `nest_sdfg_subgraph` (outlining a
checkpointed loop's body). Nothing a user can change causes it, and the values computed do not depend on
that order; gradflow's own code passes ordered connectors. So exactly that message is filtered, there.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

SET_CONNECTORS = "Using sets for connectors is discouraged"


@contextlib.contextmanager
def dace_set_connectors() -> Iterator[None]:
    """Run a DaCe routine that builds nodes with set connectors, without its warning about them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SET_CONNECTORS, category=UserWarning)
        yield
