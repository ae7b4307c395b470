"""Optimization of forward and backward SDFGs: pure passes, composed into `OPTIMIZE`.

`gradflow.grad`, `vjp`, `value_and_grad` and the torch dispatchers apply `OPTIMIZE` to what they compile
unless called with `optimize=False` (or another pipeline). Every pass keeps the program's results: the
test suite compares optimized and unoptimized gradients on every corpus program.
"""

from gradflow.core.passes import Pipeline
from gradflow.optimize.schedules import ChooseSchedules

#: The default optimization pipeline.
OPTIMIZE = Pipeline((ChooseSchedules(),))

__all__ = ["OPTIMIZE", "ChooseSchedules"]
