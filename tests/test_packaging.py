"""What an installed (not editable) package holds: pyproject.toml lists its packages by hand,
so a folder added to rl_graphstep/ but not to that list would be missing from a wheel while
every test, run from the checkout, still passed."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_in_the_wheel() -> None:
    folders = {".".join(path.parent.relative_to(ROOT).parts)
               for path in (ROOT / "rl_graphstep").rglob("__init__.py")
               if "__pycache__" not in path.parts}
    listed = set(_setuptools()["packages"])
    assert folders <= listed, f"add to pyproject.toml's packages: {sorted(folders - listed)}"
    assert listed - folders == {"rl_graphstep.configs"}  # configs/, mapped by package-dir


def test_every_python_file_is_in_a_listed_package() -> None:
    """A module in a folder without __init__.py would not be packaged either."""
    listed = set(_setuptools()["packages"])
    for path in (ROOT / "rl_graphstep").rglob("*.py"):
        package = ".".join(path.parent.relative_to(ROOT).parts)
        assert package in listed, f"{path.relative_to(ROOT)} is in no listed package"


def test_the_shipped_configs_are_package_data() -> None:
    settings = _setuptools()
    assert settings["package-dir"]["rl_graphstep.configs"] == "configs"
    patterns = settings["package-data"]["rl_graphstep.configs"]
    shipped = sorted(p.name for p in (ROOT / "configs").iterdir() if p.suffix == ".yaml")
    assert shipped and all(any(Path(name).match(p) for p in patterns) for name in shipped)
