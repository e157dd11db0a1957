"""benchmarks/throughput.py --update-flags: its flags are checked as the trainer checks them
before anything is built, in one line, and without CUDA it says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize(("flags", "says"), [
    ("--batch-size 0", "throughput.py: error: --update-flags: --batch-size must be a positive int, "
                       "got 0"),
    ("--config nope", "throughput.py: error: --update-flags: config file 'nope' does not exist"),
    ("--batch-size '4", "throughput.py: error: --update-flags: No closing quotation in "
                        "\"--batch-size '4\""),
])
def test_bad_update_flags_are_one_line(flags: str, says: str) -> None:
    result = run("--update-flags", flags)
    assert result.returncode == 2
    assert result.stderr.startswith(says) and result.stderr.count("\n") == 1
    assert result.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the line a machine without CUDA gets")
def test_update_flags_without_cuda_say_what_they_need() -> None:
    result = run("--update-flags", "--config sac_mujoco_parallel --num-seeds 2")
    assert result.returncode == 2
    assert result.stderr == ("throughput.py: error: --update-flags times the update on the GPU: it "
                             "needs CUDA\n")
