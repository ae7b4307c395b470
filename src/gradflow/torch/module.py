"""`gradflow.torch.Module`: an `nn.Module` drop-in whose parameters are some named inputs of a program."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from gradflow.core.errors import ArgumentError, InvalidArgumentError, describe
from gradflow.torch.function import Function, bind_inputs, function


class Module(torch.nn.Module):
    """`Module(program, parameters={"W": w0}, inputs=[...], outputs=[...])`.

    The inputs named in `parameters` become `nn.Parameter`s of the module (registered under the same names,
    initialised with copies of the given values); `forward` takes the remaining inputs positionally, in
    `inputs` order. Other keyword arguments go to `gradflow.torch.function`.
    """

    def __init__(
        self,
        program: Any,
        parameters: Mapping[str, Any],
        inputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if not isinstance(parameters, Mapping):
            raise InvalidArgumentError(f"parameters must map input names to initial values, got "
                                       f"{describe(parameters)}", "e.g. parameters={'W': torch.zeros(4)}")
        fn = program if isinstance(program, Function) else function(program, inputs, outputs, **options)
        names = list(fn.inputs)
        for name in parameters:
            if name not in names:
                raise InvalidArgumentError(f"parameter {name!r} is not an input of the program",
                                           f"inputs: {', '.join(names)}")
        self.function = fn
        self._slots = tuple((n, n in parameters) for n in names)
        self._n_args = sum(1 for _, is_param in self._slots if not is_param)
        for name, value in parameters.items():
            try:
                tensor = torch.as_tensor(value).detach().clone()
            except (TypeError, RuntimeError, ValueError) as exc:  # what torch raises for a non-numeric value
                raise InvalidArgumentError(
                    f"parameter '{name}': {describe(value)} cannot be made a tensor ({exc})") from exc
            self.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        expected = [n for n, is_param in self._slots if not is_param]
        if kwargs:  # inputs by name (the parameters are the module's own)
            args = bind_inputs(type(self).__name__, expected, args, kwargs)
        if len(args) != self._n_args:
            raise ArgumentError(f"{type(self).__name__} takes {self._n_args} inputs ({', '.join(expected)}), "
                                f"got {len(args)}")
        it = iter(args)
        full = [getattr(self, n) if is_param else next(it) for n, is_param in self._slots]
        return self.function(*full)

    def extra_repr(self) -> str:
        return repr(self.function)
