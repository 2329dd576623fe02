"""The one `package.module:function` loader (model factories, step kinds, custom losses, `--model` factories).

Rules, the same for every caller: the spec is `module:function` (the module may be dotted; the function is
the part after the last colon), the working directory is importable (a user's own module beside their
config), and any failure while importing the module, or a missing or non-callable attribute, is one
`ConfigError` naming the setting and the cause.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from tfship.core.errors import ConfigError


def import_function(spec: str, what: str) -> Callable:
    """The callable `spec` (`package.module:function`) names.

    Args:
        spec: `module:function`.
        what: how the message names the setting, e.g. `model.factory = 'pkg.mod:build'` or `--model pkg.mod:build`.

    Raises:
        ConfigError: no colon, an empty part, the module fails to import (any exception; the cause is kept),
            the attribute is missing or not callable.
    """
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise ConfigError(f"{what}: expected package.module:function, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except Exception as err:  # a user's module may raise anything while importing
        raise ConfigError(f"{what}: cannot import it: {type(err).__name__}: {err}") from err
    if not callable(function):
        raise ConfigError(f"{what}: {type(function).__name__} is not callable")
    return function
