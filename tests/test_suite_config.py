"""The test suite's own set-up: a plain `pytest` leaves the learning runs out, `-m slow` runs
them, and only tests other than those dump their stack at `faulthandler_timeout`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from processtools import run_python

ROOT = Path(__file__).resolve().parent.parent
TESTS = '''
import time

import pytest


@pytest.mark.slow
def test_learning_run():
    time.sleep(0.6)


def test_quick_check():
    time.sleep(0.6)
'''


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest with this project's pyproject.toml and tests/conftest.py on two stand-in tests
    that outlast a short `faulthandler_timeout`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the conftest imports this rl_graphstep
    return run_python("-m", "pytest", "-p", "no:cacheprovider", "-o",
                      "faulthandler_timeout=0.2", *args, cwd=folder, env=env,
                      capture_output=True, text=True, timeout=120)


def test_slow_tests_run_on_request_only_and_without_the_timeout_dump(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "tests").mkdir()
    for name in ("conftest.py", "processtools.py"):  # the conftest imports processtools
        (tmp_path / "tests" / name).write_text((ROOT / "tests" / name).read_text())
    (tmp_path / "tests" / "test_stand_in.py").write_text(TESTS)

    plain = run_pytest(tmp_path)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "1 passed, 1 deselected" in plain.stdout
    assert "Timeout" in plain.stderr and "in test_quick_check" in plain.stderr

    slow = run_pytest(tmp_path, "-m", "slow")
    assert slow.returncode == 0, slow.stdout + slow.stderr
    assert "1 passed, 1 deselected" in slow.stdout
    assert "Timeout" not in slow.stderr, slow.stderr
