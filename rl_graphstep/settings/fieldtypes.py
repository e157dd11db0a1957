"""Reading a config value as its field's type: ints and floats as YAML 1.1 writes them (1e6
and 3e-4 are strings there), bools, strings, keyword-argument mappings and lists of ints (a
number or a list that may be null too); and a path as the user wrote it (``~`` expanded)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_graphstep.core.errors import ConfigError

__all__ = ["typed_value", "user_path"]


def _as_int(value: Any) -> int:
    # bool is an int subclass, but `batch_size: true` is a mistake, not 1.
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        return value
    # PyYAML follows YAML 1.1, where 1e6 is a string and 1.0e+6 a float: accept both when whole.
    number = float(value) if isinstance(value, (str, float)) else math.nan
    if not number.is_integer():
        raise TypeError
    return int(number)


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
        return float(value)
    raise TypeError


def typed_value(name: str, kind: Any, value: Any, *, switch: bool = False) -> Any:
    """One YAML, flag or Python value of the field ``name`` as its type ``kind`` (a resolved
    annotation); ``switch``: an auto/on/off field, where a bool means on or off. A value that
    is not of the type is a ConfigError naming what was expected."""
    expected = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
    try:
        if kind is int:
            return _as_int(value)
        if kind is float:
            return _as_float(value)
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if switch and isinstance(value, bool):
            return "on" if value else "off"
        if kind in (str, str | None):
            if value is None and kind is not str:
                return None
            if not isinstance(value, str):
                raise TypeError
            return value
        if kind == float | None:
            return None if value is None else _as_float(value)
        if kind == dict[str, Any]:
            # A copy, so later changes to the caller's dict do not reach the frozen Config.
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise TypeError
            return dict(value)
        # tuple[int, ...], or None where the field allows it
        if value is None and kind != tuple[int, ...]:
            return None
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return tuple(_as_int(v) for v in value)
    except (TypeError, ValueError):
        if kind == dict[str, Any]:
            what = "a mapping of keyword arguments (string keys), e.g. {width: 128}"
        else:
            fallback = {str | None: "a string or null", float | None: "a number or null",
                        tuple[int, ...] | None: "a list of ints or null"}.get(
                            kind, "a list of ints")
            what = expected.get(kind, fallback)
        raise ConfigError(f"{name} must be {what}, got {value!r}") from None


def user_path(path: str | os.PathLike[str]) -> Path:
    """A path the user gave, with a leading ``~`` or ``~user`` made their home folder as a
    shell makes it: ``--log-dir=~/runs``, a quoted ``'~/runs'`` and a YAML ``log_dir: ~/runs``
    reach the program unexpanded, and would otherwise make a folder named ``~`` here."""
    return Path(os.path.expanduser(path))
