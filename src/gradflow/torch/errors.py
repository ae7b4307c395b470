"""The errors of exporting a torch module for `gradflow.torch.compile` (shared by `export` and `dropout`)."""

from __future__ import annotations

import attrs

from gradflow.core.errors import GradflowError


@attrs.frozen(eq=False)
class ExportError(GradflowError):
    """A module could not be exported to ONNX as `gradflow.torch.compile` needs it."""


@attrs.frozen(eq=False)
class LostParameterError(ExportError):
    """The ONNX model does not hold a parameter or buffer of the module as an initializer of the same name
    and shape (folded, merged, transposed or renamed by the export): training it would train another model."""


@attrs.frozen(eq=False)
class DroppedOptionError(ExportError):
    """The module uses an option of a torch operation that changes its gradient (or its forward value) but
    that the ONNX export does not record: compiling it would train another model."""
