"""Training with --n-step 3 on Pendulum (CPU): the stored rows are n-step rows of the
pendulum's own dynamics, a resumed run stores exactly what the run straight through stores,
and non-finite steps stay out of every row."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fakes import register_poisoned

from rl_graphstep.data.rows import RowLayout
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

GAMMA = 0.5
ARGS = ["--env", "Pendulum-v1", "--device", "cpu", "--learning-starts", "100",
        "--batch-size", "32", "--hidden-sizes", "16", "16", "--buffer-size", "5000",
        "--log-interval", "100", "--no-progress", "--save-buffer", "--seed", "3",
        "--num-envs", "2", "--n-step", "3", "--gamma", str(GAMMA)]


def pendulum_step(obs: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pendulum-v1's reward and next observation of rows of (cos, sin, speed) and actions in
    [-1, 1] (the torque is 2 x action), as gymnasium computes them."""
    theta, speed = np.arctan2(obs[:, 1], obs[:, 0]), obs[:, 2]
    torque = np.clip(2.0 * action[:, 0], -2.0, 2.0)
    reward = -(theta ** 2 + 0.1 * speed ** 2 + 0.001 * torque ** 2)
    speed = np.clip(speed + (15.0 * np.sin(theta) + 3.0 * torque) * 0.05, -8.0, 8.0)
    theta = theta + speed * 0.05
    return reward, np.stack([np.cos(theta), np.sin(theta), speed], axis=1)


def test_stored_rows_are_n_step_rows_of_the_pendulum(tmp_path: Path) -> None:
    """Each row [s_t, a_t, R, c, s'] with c = 0.5^(k-1) (Pendulum never terminates): R is
    the discounted sum of the rewards of s_t .. s_{t+k-1} and s' is s_{t+k}, following the
    chain through the rows that start at s_{t+1}, s_{t+2} (found by their observation)."""
    train(load_config([*ARGS, "--total-timesteps", "600", "--log-dir", str(tmp_path),
                       "--run-name", "run"]))
    state = load_checkpoint(tmp_path / "run")
    rows = state["buffer"]["storage"].double().numpy()
    layout = RowLayout(3, 1)
    obs, act = rows[:, layout.observations], rows[:, layout.actions]
    returns, c = rows[:, layout.rewards][:, 0], rows[:, layout.not_dones][:, 0]
    # 300 steps of each of 2 envs, 2 pending at the end (the episodes run 200 steps: the
    # 2 truncations end every window, and 2 steps into the new ones none are ready).
    assert len(rows) == 600 - 2 * 2 and state["nstep"]["pending"].tolist() == [2, 2]
    k = np.rint(1 - np.log2(c)).astype(int)  # c = 0.5^(k-1)
    np.testing.assert_array_equal(c, 0.5 ** (k - 1))
    # Each episode's last 2 windows end early, at its truncation: k = 2 and k = 1.
    assert (k == 3).sum() == 600 - 4 - 2 * 2 and (k == 1).sum() == 2
    checked = 0
    for i in range(len(rows)):
        state_i, total, found = obs[i:i + 1], 0.0, True
        for j in range(k[i]):
            match = np.flatnonzero(np.abs(obs - state_i).max(axis=1) < 1e-4)
            if match.size != 1:
                found = False  # the step's own row is not stored yet
                break
            reward, state_i = pendulum_step(obs[match], act[match])
            total += GAMMA ** j * reward[0]
        if found:
            np.testing.assert_allclose(returns[i], total, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(rows[i, layout.next_observations], state_i[0],
                                       atol=1e-4)
            checked += 1
    assert checked >= len(rows) - 2 * 2


@pytest.mark.parametrize("seeds", [1, 2])
def test_a_resumed_run_stores_what_the_straight_run_stores(seeds: int, tmp_path: Path) -> None:
    """300 steps straight and 150 + 150 resumed: the same buffer, windows and learning."""
    args = [*ARGS, "--num-seeds", str(seeds), "--log-dir", str(tmp_path)]
    train(load_config([*args, "--total-timesteps", "300", "--run-name", "straight"]))
    train(load_config([*args, "--total-timesteps", "150", "--run-name", "halves"]))
    half = load_checkpoint(tmp_path / "halves")
    assert half["nstep"]["pending"].any()  # windows under way when it stopped
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "300"]) == 0
    straight, halves = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "halves")
    assert straight["global_step"] == halves["global_step"] == 300
    assert straight["agent"]["updates"] > 0
    assert torch.equal(straight["buffer"]["storage"], halves["buffer"]["storage"])
    assert straight["buffer"].get("sizes", straight["buffer"].get("size")) == \
        halves["buffer"].get("sizes", halves["buffer"].get("size"))
    for name, part in straight["nstep"].items():
        if name != "queues":
            np.testing.assert_array_equal(part, halves["nstep"][name], err_msg=name)
    for name, part in straight["agent"].items():
        if isinstance(part, dict):
            for key, value in part.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, halves["agent"][name][key]), f"{name}/{key}"


def test_non_finite_steps_stay_out_of_the_n_step_rows(tmp_path: Path) -> None:
    env_id = register_poisoned("NStepNanReward", "reward", float("nan"), every=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(load_config([*ARGS, "--env", env_id, "--total-timesteps", "300",
                           "--log-dir", str(tmp_path), "--run-name", "run"]))
    state = load_checkpoint(tmp_path / "run")
    rows = state["buffer"]["storage"]
    assert torch.isfinite(rows).all()
    assert state["nonfinite"]["transitions"] == 2 * (150 // 7)  # each env's every 7th step
    not_dones = rows[:, RowLayout(3, 1).not_dones]
    # Windows cut before a dropped step bootstrap with 0.5^(k-1) for k = 1, 2, 3.
    assert set(not_dones.flatten().tolist()) <= {1.0, 0.5, 0.25}
    assert (not_dones == 1.0).sum() >= 2 * (150 // 7 - 1)
