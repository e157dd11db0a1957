"""Sweeps of PPO: trials of ``algo: ppo`` searching PPO's learning rate run on a local Ray, each
training with its value; a sweep file naming a setting PPO does not read, or PPO settings
that cannot cut a rollout into minibatches, is one line before Ray starts."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.sweep import main

# Two trials of two seeds on CartPole: rollouts of 2 envs x 32 steps, 4 of them per seed.
PPO_SWEEP = """
name: ppo
base:
  algo: ppo
  env_id: CartPole-v1
  total_timesteps: 256
  num_envs: 2
  num_steps: 32
  num_minibatches: 2
  update_epochs: 1
  anneal_lr: false
  hidden_sizes: [8]
  device: cpu
  log_interval: 64
  progress: false
search:
  learning_rate: [0.01, 0.0001]
num_seeds: 2
"""


def test_a_ppo_sweep_trains_each_trial_with_its_searched_learning_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.tune")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ppo.yaml").write_text(PPO_SWEEP)
    assert main(["ppo.yaml", "--log-dir", "runs"]) == 0
    sweep = tmp_path / "runs" / "ppo"
    with (sweep / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(row["error"] == "" for row in rows)
    assert {row["learning_rate"] for row in rows} == {"0.01", "0.0001"}
    assert all(row["global_step"] == "256" for row in rows)
    for row in rows:
        state = load_checkpoint(sweep / row["trial"])
        assert state["config"]["algo"] == "ppo" and state["agent"]["updates"] == 4
        assert state["config"]["learning_rate"] == float(row["learning_rate"])
        # The learner's rate, as each seed logged it (constant: --no-anneal-lr).
        for seed in (1, 2):
            events = EventAccumulator(str(sweep / row["trial"] / f"seed_{seed}"))
            events.Reload()
            rates = [e.value for e in events.Scalars("charts/learning_rate")]
            assert rates == pytest.approx([float(row["learning_rate"])] * 4)
    assert "algo: ppo" in (sweep / "best_config.yaml").read_text()


@pytest.mark.parametrize(("change", "line"), [
    # SAC's critic rate searched in a PPO sweep.
    (("learning_rate: [0.01, 0.0001]", "q_lr: [0.01, 0.0001]"),
     "--q-lr is a setting of SAC, TD3, DDPG and CrossQ alone, which --algo ppo does not "
     "read: leave it out (in {file}, with {{'q_lr': 0.01}})"),
    # An off-policy setting in the base.
    (("  progress: false\n", "  progress: false\n  batch_size: 64\n"),
     "--batch-size is a setting of SAC, TD3, DDPG and CrossQ alone, which --algo ppo does "
     "not read: leave it out (in {file}, with {{'learning_rate': 0.01}})"),
    # 3 minibatches of a rollout of 64 steps: no trial could cut it.
    (("learning_rate: [0.01, 0.0001]", "num_minibatches: [2, 3]"),
     "--num-minibatches 3 does not divide a rollout of --num-envs 2 x --num-steps 32 = 64 "
     "steps: every minibatch has one fixed size; choose a divisor of it (in {file}, with "
     "{{'num_minibatches': 3}})"),
])
def test_a_ppo_sweep_that_no_trial_could_train_is_one_line(
        change: tuple[str, str], line: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text(PPO_SWEEP.replace(*change))
    assert main([str(path), "--log-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == f"error: {line.format(file=path)}\n"
    assert not (tmp_path / "runs").exists()  # refused before Ray or a folder
