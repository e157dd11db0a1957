"""Tests for reading a config value as its field's type: YAML 1.1 numbers, bools, switches,
strings, mappings and lists of ints, and the one-line error naming what was expected."""

from __future__ import annotations

from typing import Any

import pytest

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.settings.fieldtypes import typed_value


@pytest.mark.parametrize(("kind", "value", "typed"), [
    (int, "1e6", 1_000_000), (int, 1.0e6, 1_000_000), (int, 7, 7),
    (float, "3e-4", 3e-4), (float, 2, 2.0),
    (bool, False, False),
    (str | None, None, None), (str, "x", "x"),
    (tuple[int, ...], [256, 256], (256, 256)), (tuple[int, ...] | None, None, None),
    (tuple[int, ...] | None, ["3", 5.0], (3, 5)),
    (dict[str, Any], {"width": 128}, {"width": 128}),
])
def test_values_become_their_fields_type(kind: Any, value: Any, typed: Any) -> None:
    result = typed_value("f", kind, value)
    assert result == typed and type(result) is type(typed)


def test_a_switch_reads_a_bool_as_on_or_off_and_a_mapping_is_copied() -> None:
    assert typed_value("graph", str, True, switch=True) == "on"
    assert typed_value("graph", str, False, switch=True) == "off"
    given = {"width": 128}
    copy = typed_value("actor_kwargs", dict[str, Any], given)
    given["width"] = 1
    assert copy == {"width": 128}


@pytest.mark.parametrize(("kind", "value", "message"), [
    (int, True, "f must be an int, got True"),
    (int, 2.5, "f must be an int, got 2.5"),
    (float, "fast", "f must be a number, got 'fast'"),
    (bool, "yes", "f must be true or false, got 'yes'"),
    (str, None, "f must be a string, got None"),
    (str | None, 3, "f must be a string or null, got 3"),
    (tuple[int, ...], 3, "f must be a list of ints, got 3"),
    (tuple[int, ...] | None, [1.5], r"f must be a list of ints or null, got \[1.5\]"),
    (dict[str, Any], {1: 2}, "f must be a mapping of keyword arguments"),
])
def test_a_value_of_another_type_is_one_line(kind: Any, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        typed_value("f", kind, value)
