"""benchmarks/timeline.py on the CPU: the host's parts of an iteration are marked, each is
reported, and together with what no part marks they make up the iteration's time."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import timeline  # noqa: E402

NUMBER = r"(-?[\d,]+\.\d)"


def test_the_host_parts_add_up_to_the_iteration(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--env", "Pendulum-v1", "--num-seeds", "2", "--num-envs", "3", "--total-timesteps",
            "900", "--learning-starts", "300", "--batch-size", "32", "--hidden-sizes", "16",
            "16", "--device", "cpu", "--no-progress", "--log-dir", str(tmp_path),
            "--log-interval", "150"]
    prof, _ = timeline.profiled_loop(args, skip=20, window=60)
    timeline.report(prof, window=60, top=3)
    out = capsys.readouterr().out
    total = float(re.search(NUMBER + r" µs per iteration", out).group(1).replace(",", ""))
    parts_line = next(line for line in out.splitlines() if "host µs per iteration:" in line)
    parts = {label.strip(): float(us.replace(",", "")) for label, us in
             re.findall(r"([a-z ]+) " + NUMBER, parts_line.split(":", 1)[1])}
    # Every part this loop goes through is seen (a log every 150 steps of 3 envs: in the
    # window of 60 iterations, 180 steps, at least one).
    assert {"action request", "action wait", "store", "env start", "update launch",
            "env wait", "log"} <= set(parts)
    assert all(us > 0 for us in parts.values())
    inside, outside = (float(x.replace(",", "")) for x in re.search(
        r"in the collector's step, unmarked: " + NUMBER + r"; in the loop outside it, "
        r"unmarked: " + NUMBER, out).groups())
    assert inside >= 0 and outside >= 0
    # The parts and the unmarked rest are the iteration (each figure rounded to 0.1 µs).
    assert sum(parts.values()) + inside + outside == pytest.approx(total, abs=1.0)
