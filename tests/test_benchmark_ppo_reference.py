"""benchmarks/ppo_reference.py: CleanRL's PPO as a reference run (short CPU runs on Pendulum:
episodes recorded, the two clips told apart, bad input refused in one line)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ppo_reference  # noqa: E402


def test_a_run_writes_its_episodes_and_their_means(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "episodes.csv"
    assert ppo_reference.main(["--env", "Pendulum-v1", "--iterations", "2", "--num-steps",
                               "256", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2  # 512 steps: two 200-step episodes, truncated, not terminated
    assert [row["terminated"] for row in rows] == ["0", "0"]
    returns = [float(row["return"]) for row in rows]
    assert all(-2000 < r < 0 for r in returns)  # Pendulum's rewards are in [-16.3, 0]
    line = capsys.readouterr().out.strip()
    assert line == (f"Pendulum-v1 seed 1, clip joint: 2 episodes, mean of the last 10 "
                    f"{sum(returns) / 2:.1f}, of the last 100 {sum(returns) / 2:.1f}")


def test_the_clips_differ_after_the_first_update() -> None:
    """The first episode ends before any update: alike; the second spans the first update."""
    joint, separate = (ppo_reference.train("Pendulum-v1", 3, clip, 2, 256)
                       for clip in ("joint", "separate"))
    assert joint[0] == separate[0]
    assert joint[1] != separate[1]
    assert ppo_reference.train("Pendulum-v1", 3, "joint", 2, 256) == joint  # seeded


def test_bad_settings_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ppo_reference.main(["--num-steps", "100"])
    assert exit_info.value.code == 2
    assert ("--iterations takes 1 or more and --num-steps a multiple of 32 (its 32 "
            "minibatches); got 488 and 100") in capsys.readouterr().err



@pytest.mark.parametrize(("argv", "expected"), [
    (["--env", "Nope-v1"], "Nope-v1"),
    (["--env", "CartPole-v1"], "takes a Box of actions and a flat Box of observations"),
    (["--num-steps", "32"], "--num-steps takes 64 or more: each of its 32 minibatches needs "
     "two rows for the advantages' standard deviation; got 32"),
    (["--env", "Pendulum-v1", "--out", "/no-such-folder/episodes.csv"],
     "--out takes a file in a folder that exists"),
])
def test_bad_input_is_one_line_before_any_training(argv: list[str], expected: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = ppo_reference.main([*argv, "--iterations", "1"])
    except SystemExit as stop:  # argparse's refusal, where the parser checks
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err
