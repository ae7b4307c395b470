"""Switches read from the environment: one place that checks them, so a misspelt value is an error that
names the variable and its choices, never a silent fallback."""

from __future__ import annotations

import os

from gradflow.core.errors import InvalidArgumentError


def env_choice(variable: str, choices: tuple[str, ...], default: str) -> str:
    """The value of `variable` (`default` when unset); one outside `choices` is an `InvalidArgumentError`."""
    choice = os.environ.get(variable, default)
    if choice not in choices:
        raise InvalidArgumentError(f"the environment variable {variable} is {choice!r}; it takes one of "
                                   f"{', '.join(map(repr, choices))}", f"unset it for the default ({default!r})")
    return choice
