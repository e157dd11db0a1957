"""What the config tests share: a YAML file in a test's folder, and the one-line error a command
line gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.run.flags import load_config


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def one_line_error(argv: list[str], match: str) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        load_config(argv)
    message = str(info.value)
    assert "\n" not in message
    return message
