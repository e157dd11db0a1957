"""PPO's --obs-norm and --reward-norm through the training loop on the CPU: the collector
counts each step's observations before acting and stores them normalised in CleanRL's form,
each seed its own statistics; the rewards enter the rollout scaled while the logged returns
stay the env's; checkpoints resume bit for bit; evaluate applies the saved statistics.
(The statistics' arithmetic by hand: tests/data/test_normalizer.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fakes import assert_same_state

from rl_graphstep.data.normalizer import ObservationNormalizer, RewardNormalizer
from rl_graphstep.data.rollout import Rollout
from rl_graphstep.envs.make import make_env
from rl_graphstep.evaluate import evaluate
from rl_graphstep.run import evaluation
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

# 2 envs x 16 steps = rollouts of 32 steps per seed; 2 minibatches of 16, 2 epochs.
SMALL = ["--algo", "ppo", "--device", "cpu", "--num-envs", "2", "--num-steps", "16",
         "--num-minibatches", "2", "--update-epochs", "2", "--hidden-sizes", "8", "8",
         "--no-progress", "--log-interval", "32"]
BOTH = ["--obs-norm", "--reward-norm"]


def cleanrl_form(rows: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """CleanRL's normalisation, in float64: clip((x - mean) / sqrt(var + 1e-8), -10, 10)."""
    return np.clip((rows - mean) / np.sqrt(var + 1e-8), -10.0, 10.0)


def test_two_seeds_count_before_acting_store_normalised_and_keep_their_own_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CartPole, 2 seeds x 2 envs, 128 steps: every step counts the 4 observations it acts on
    (seed k's rows into seed k's statistics) and then adds them to the rollout normalised
    with the statistics that count them; the rollout's rewards are the reward normaliser's,
    while the returns logged are the env's (CartPole's: an episode's length)."""
    counted: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    added: list[torch.Tensor] = []  # the observations each step's row got
    recorded: list[np.ndarray] = []  # the rewards each step's record kept
    scaled: list[tuple[np.ndarray, np.ndarray]] = []
    observe, scale = ObservationNormalizer.observe, RewardNormalizer.scale
    write_acted, record = Rollout.write_acted, Rollout.record

    def counting(self: ObservationNormalizer, rows: np.ndarray, keep: object = None) -> None:
        observe(self, rows, keep)
        counted.append((np.array(rows, dtype=np.float64), self.mean.copy(), self.var.copy()))

    def writing(self: Rollout, observations: torch.Tensor, *rest: torch.Tensor) -> None:
        added.append(observations.clone())
        write_acted(self, observations, *rest)

    def recording(self: Rollout, rewards: np.ndarray, *rest: object) -> None:
        recorded.append(np.array(rewards))
        record(self, rewards, *rest)

    def scaling(self: RewardNormalizer, rewards: np.ndarray, *ends: np.ndarray) -> np.ndarray:
        out = scale(self, rewards, *ends)
        scaled.append((np.array(rewards), out))
        return out

    monkeypatch.setattr(ObservationNormalizer, "observe", counting)
    monkeypatch.setattr(Rollout, "write_acted", writing)
    monkeypatch.setattr(Rollout, "record", recording)
    monkeypatch.setattr(RewardNormalizer, "scale", scaling)
    summary = train(load_config(["--env", "CartPole-v1", *SMALL, *BOTH, "--num-seeds", "2",
                                 "--total-timesteps", "128", "--log-dir", str(tmp_path),
                                 "--run-name", "run"]))
    assert len(counted) == len(added) == len(recorded) == len(scaled) == 64  # 64 vector steps
    for (rows, mean, var), observations in zip(counted, added, strict=True):
        by_seed = rows.reshape(2, 2, 4)  # seed k's envs are rows 2k, 2k + 1
        expected = cleanrl_form(by_seed, mean[:, None], var[:, None])
        np.testing.assert_allclose(observations.numpy(), expected, rtol=1e-5, atol=1e-5)
    for (env_rewards, out), rewards in zip(scaled, recorded, strict=True):
        assert env_rewards.tolist() == [1.0] * 4  # CartPole's reward
        np.testing.assert_array_equal(rewards, out)
    assert not np.allclose(scaled[-1][1], 1.0)  # scaled: the returns' std is not 1

    saved = load_checkpoint(tmp_path / "run")
    stats = saved["obs_normalizer"]
    assert stats["count"].tolist() == [128, 128]  # 64 steps x 2 envs each
    every = np.stack([rows for rows, _, _ in counted]).reshape(64, 2, 2, 4)
    for k in range(2):
        seed_rows = every[:, k].reshape(-1, 4)
        np.testing.assert_allclose(stats["mean"][k].numpy(), seed_rows.mean(0), atol=1e-12)
        np.testing.assert_allclose(stats["var"][k].numpy(), seed_rows.var(0), atol=1e-12)
    assert not np.allclose(stats["mean"][0].numpy(), stats["mean"][1].numpy())
    assert saved["reward_normalizer"]["count"].tolist() == [128, 128]
    assert saved["reward_normalizer"]["returns"].shape == (4,)
    # The logged returns are the env's: reward 1 a step, each a whole number of steps.
    returns = [r for seed in summary["recent_returns"] for r in seed]
    assert returns and all(r == int(r) and r >= 8 for r in returns)


@pytest.mark.parametrize(("env", "seeds"), [("CartPole-v1", "2"), ("Pendulum-v1", "1")])
def test_both_resume_at_a_rollout_boundary_bit_for_bit(env: str, seeds: str,
                                                       tmp_path: Path) -> None:
    """Stopped at a rollout boundary (64) and resumed to 128, a run with both normalisers
    ends as the run straight to 128: learner, observation statistics, return statistics and
    each env's running return (--no-anneal-lr: see tests/test_train_ppo.py)."""
    args = ["--env", env, *SMALL, *BOTH, "--num-seeds", seeds, "--no-anneal-lr",
            "--log-dir", str(tmp_path)]
    train(load_config([*args, "--total-timesteps", "128", "--run-name", "straight"]))
    train(load_config([*args, "--total-timesteps", "64", "--run-name", "halves"]))
    half = load_checkpoint(tmp_path / "halves")
    assert half["obs_normalizer"]["count"].tolist() == [64] * int(seeds)
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "128"]) == 0
    straight, halves = (load_checkpoint(tmp_path / name) for name in ("straight", "halves"))
    assert straight["obs_normalizer"]["count"].tolist() == [128] * int(seeds)
    assert straight["reward_normalizer"]["returns"].any()  # episodes under way carry on
    for key in ("agent", "obs_normalizer", "reward_normalizer", "recent_returns"):
        assert_same_state(straight[key], halves[key], key)


def test_evaluate_applies_the_saved_statistics_in_ppos_form(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor of a PPO --obs-norm run sees clip((x - mean) / sqrt(var + 1e-8), -10, 10)
    with the checkpoint's statistics, frozen (two evaluations return the same)."""
    assert main(["--env", "Pendulum-v1", *SMALL, *BOTH, "--total-timesteps", "64",
                 "--log-dir", str(tmp_path), "--run-name", "n"]) == 0
    seen: list[torch.Tensor] = []
    env_action = evaluation._env_action

    def spying(actor: torch.nn.Module, algorithm: type, observations: torch.Tensor,
               space: object) -> object:
        seen.append(observations.clone())
        return env_action(actor, algorithm, observations, space)

    monkeypatch.setattr(evaluation, "_env_action", spying)
    first = evaluate(tmp_path / "n", episodes=1, seed=5, device="cpu", verbose=False)
    stats = load_checkpoint(tmp_path / "n")["obs_normalizer"]
    env = make_env("Pendulum-v1")
    observation, _ = env.reset(seed=5)
    env.close()
    expected = cleanrl_form(observation.astype(np.float64), stats["mean"][0].numpy(),
                            stats["var"][0].numpy())
    np.testing.assert_allclose(seen[0][0].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(seen[0][0].numpy(), observation, atol=1e-3)
    assert len(seen) == 200
    assert evaluate(tmp_path / "n", episodes=1, seed=5, device="cpu",
                    verbose=False).returns == first.returns


@pytest.mark.parametrize(("given", "line"), [
    ("--reward-norm", "--reward-norm does not match: the resumed run learned from raw "
                      "rewards; drop --reward-norm"),
    ("--no-reward-norm", "--no-reward-norm does not match: the resumed run learned from "
                         "scaled rewards (--reward-norm); drop --no-reward-norm"),
])
def test_reward_norm_cannot_change_on_resume(given: str, line: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    own = "--no-reward-norm" if given == "--reward-norm" else "--reward-norm"
    assert main(["--env", "CartPole-v1", *SMALL, own, "--total-timesteps", "32",
                 "--log-dir", str(tmp_path), "--run-name", "run"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "run"), given, "--total-timesteps", "64"]) == 2
    assert line in capsys.readouterr().err


def test_reward_norm_is_ppos_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--env", "Pendulum-v1", "--algo", "sac", "--reward-norm", "--device",
                 "cpu"]) == 2
    assert ("--reward-norm is a setting of PPO alone, which --algo sac does not read: leave "
            "it out") in capsys.readouterr().err
