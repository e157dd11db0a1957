"""benchmarks/algos.py: each arm's update timed alone and its loop run, one table row each
with the settings its algorithm's YAML file for the task gives (a short CPU run; speed means nothing
here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import algos  # noqa: E402


def test_each_algorithm_gets_a_row_with_its_shipped_settings(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = algos.main(["--env", "Pendulum-v1", "--arm", "sac=--algo sac", "--arm",
                       "crossq=--algo crossq --tf32", "--steps", "300",
                       "--learning-starts", "280", "--updates", "3", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines()
            if line.startswith(("| sac ", "| crossq "))}
    # Pendulum's files: SAC's twin 256-256 critics over 3 + 1 inputs are 2 x (4*256 + 256 +
    # 256*256 + 256 + 256 + 1) = 134,658 parameters; SAC's actor every 2nd update, CrossQ's
    # every 3rd; both batch 256.
    assert rows["sac"][1:4] == ["134,658", "256", "2"]
    assert rows["crossq"][2:4] == ["256", "3"]
    for row in rows.values():
        assert float(row[4].replace(",", "")) > 0 and float(row[5].replace(",", "")) > 0
    assert rows["sac"][6].strip(" |") == "1.00x"
