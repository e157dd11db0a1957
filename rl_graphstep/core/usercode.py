"""Importing the user's code by name: a module from the current directory too, and telling a
file path from a module name in a ``location:Name`` spec."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["import_from_here", "is_file_path"]


def import_from_here(module_name: str) -> Any:
    """Import ``module_name``, also from the current directory: ``python -m`` puts it on
    ``sys.path`` but a console script (``rl-graphstep-train``) does not, and a spec such as
    ``examples.residual_actor:ResidualActor`` should work from either."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        here = os.getcwd()
        if error.name != module_name.split(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # last: never shadows an installed module
        return importlib.import_module(module_name)


def is_file_path(location: str) -> bool:
    """Whether a spec's ``location`` (before its ``:``) is a file: module names have no
    slashes, a file path either has one or ends in .py."""
    return location.endswith(".py") or "/" in location or os.sep in location
