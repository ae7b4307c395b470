"""The two DaCe warnings gradflow silences: exactly those messages, for reasons stated here.

DaCe warns "Using sets for connectors is discouraged" whenever a tasklet or nested SDFG gets its
connectors as a set (their order, hence the generated function's parameter order, may differ between
processes). Two DaCe routines gradflow calls pass sets themselves: its Python frontend (parsing a
`@dace.program`, e.g. for every augmented assignment `m[0] += ...`) and `nest_sdfg_subgraph` (outlining a
checkpointed loop's body). Nothing a user can change causes it, and the values computed do not depend on
that order; gradflow's own code passes ordered connectors. So exactly that message is filtered, there.

DaCe's validation warns "Use of uninitialized transient X in state S" when a state reads a transient that no
state visited before it wrote. A loop's tape push (`autodiff/tape.py`, states named `push_gradflow_tape_...`)
saves the value an iteration is about to overwrite, so the reverse sweep can put it back; in the first
iteration that value was never written. The slot it fills is restored after the reverse of the first
iteration, when nothing reads the array any more (the forward wrote it before reading it), so the value never
matters. (Where the engine can prove that, `Reversal.first_run_guard`, the first iteration does not push at
all; where it cannot, the push stays and so may the warning.) Every differentiated loop over a temporary
showed the warning on every build; `ignore_tape_pushes` (installed when gradflow is imported) filters the
message for those states only, anywhere: DaCe validates in many places, and a user's own states never have
those names.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

SET_CONNECTORS = "Using sets for connectors is discouraged"
#: the validation warning about a transient read before written, in a tape push state (any level tag)
TAPE_PUSH_READ = r'WARNING: Use of uninitialized transient "[^"]*" in state "[^"]*push_[^"]*gradflow_tape_'


@contextlib.contextmanager
def dace_set_connectors() -> Iterator[None]:
    """Run a DaCe routine that builds nodes with set connectors, without its warning about them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SET_CONNECTORS, category=UserWarning)
        yield


def ignore_tape_pushes() -> None:
    """Filter DaCe's uninitialized-transient warning for gradflow's tape pushes (see the module doc)."""
    warnings.filterwarnings("ignore", message=TAPE_PUSH_READ, category=UserWarning)
