"""benchmarks/ppo_split.py: a PPO rollout's wall time split into its steps and its update (a
short CPU run; the figures mean nothing here, their shape does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ppo_split  # noqa: E402

SMALL = "--num-steps 32 --num-minibatches 2 --update-epochs 2 --hidden-sizes 8 8"


def test_every_rollout_is_split_into_its_steps_and_its_update(tmp_path: Path) -> None:
    parts = ppo_split.split_rollouts(
        ["--algo", "ppo", "--env", "Pendulum-v1", "--device", "cpu", "--no-progress",
         "--total-timesteps", "96", "--log-dir", str(tmp_path), *SMALL.split()],
        ppo_split.torch.device("cpu"))
    assert len(parts) == 3  # 96 steps of rollouts of 32
    assert all(steps > 0 and update > 0 for steps, update in parts)


def test_the_table_has_both_parts_and_their_shares(capsys: pytest.CaptureFixture[str]) -> None:
    assert ppo_split.main(["--env", "Pendulum-v1", "--rollouts", "3", "--burn-in", "1",
                           "--device", "cpu", "--flags", SMALL]) == 0
    out = capsys.readouterr().out
    rollout_table, parts_table = out.split("| step part |")
    rows = [line.split(" | ") for line in rollout_table.splitlines() if line.startswith("| ")
            and not line.startswith("| part")]
    assert [row[0] for row in rows] == ["| env steps (acting, envs, bookkeeping)",
                                        "| update (GAE, minibatches)"]
    shares = [int(row[3].strip(" |%")) for row in rows]
    assert 99 <= sum(shares) <= 101
    assert "medians of rollouts 2-3" in out and "4 a rollout" in out
    # The steps' host parts, each once, in the order a step calls them; the envs and the
    # acting take time on every step, and the parts with "other" make the step's µs.
    step_us = float(rows[0][2].replace(",", ""))
    parts = {line.split(" | ")[0][2:]: float(line.split(" | ")[1].strip(" |").replace(",", ""))
             for line in parts_table.splitlines()[2:] if line.startswith("| ")}
    assert list(parts) == ["acting wait", "envs", "bootstrap values",
                           "observation statistics", "acting launch", "non-finite checks",
                           "reward scaling", "rollout row", "episode ended", "log",
                           "other (the loop's and the collector's own lines)"]
    assert parts["envs"] > 0 and parts["acting launch"] > 0
    assert sum(parts.values()) == pytest.approx(step_us, abs=0.6)  # each row rounded


def test_a_burn_in_past_the_rollouts_is_refused() -> None:
    with pytest.raises(SystemExit) as exit_info:
        ppo_split.main(["--rollouts", "2", "--burn-in", "2", "--device", "cpu"])
    assert exit_info.value.code == 2
