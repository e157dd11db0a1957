"""PPO through the training loop on the CPU: CartPole-v1 (discrete) and Pendulum-v1
(continuous) train a few rollouts end to end, log CleanRL's diagnostics, checkpoint at rollout
boundaries, resume exactly and evaluate; a stop mid-rollout says what it drops."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fakes import assert_same_state
from resumetools import straight_and_halves
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep.core.errors import TrainingInterrupted
from rl_graphstep.evaluate import evaluate
from rl_graphstep.run.checkpoint import list_checkpoints, load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

# 2 envs x 16 steps = rollouts of 32 steps per seed; 2 minibatches of 16, 2 epochs.
SMALL = ["--algo", "ppo", "--device", "cpu", "--num-envs", "2", "--num-steps", "16",
         "--num-minibatches", "2", "--update-epochs", "2", "--hidden-sizes", "8", "8",
         "--no-progress", "--log-interval", "32"]
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DIAGNOSTICS = {"losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
               "losses/old_approx_kl", "losses/clipfrac", "losses/explained_variance",
               "charts/learning_rate"}


def scalars(folder: Path) -> EventAccumulator:
    events = EventAccumulator(str(folder))
    events.Reload()
    return events


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_two_seeds_train_log_checkpoint_and_evaluate(env: str, tmp_path: Path) -> None:
    cfg = load_config(["--env", env, *SMALL, "--num-seeds", "2", "--total-timesteps", "128",
                       "--log-dir", str(tmp_path), "--run-name", "run", "--learning-rate",
                       "0.01"])
    summary = train(cfg)
    assert summary["global_step"] == 128 and summary["seeds"] == (1, 2)
    # 4 rollouts, each 2 epochs x 2 minibatches: 8 critic and 8 actor steps per seed.
    assert summary["updates"] == {"critic": (0, 32), "actor": (0, 32)}
    assert summary["not_learned"] is None and summary["action_stream"] is False
    state = load_checkpoint(tmp_path / "run")
    assert state["agent"]["updates"] == 4 and state["buffer"] is None
    first = next(iter(state["agent"]["actor"].values()))
    assert first.shape[0] == 2  # the seeds' stacked actor
    for seed in (1, 2):
        events = scalars(tmp_path / "run" / f"seed_{seed}")
        assert set(events.Tags()["scalars"]) >= DIAGNOSTICS
        # Logged at every log interval (32 steps: one rollout), the annealed rate at the
        # start of each rollout: 0.01 x (1 - u / 4) for u = 0 .. 3.
        rates = [e.value for e in events.Scalars("charts/learning_rate")]
        np.testing.assert_allclose(rates, [0.01, 0.0075, 0.005, 0.0025], rtol=1e-6)
        assert [e.step for e in events.Scalars("losses/value_loss")] == [32, 64, 96, 128]
        clipfrac = [e.value for e in events.Scalars("losses/clipfrac")]
        assert all(0.0 <= c <= 1.0 for c in clipfrac)
    group = evaluate(tmp_path / "run", episodes=2, verbose=False)
    assert group.seeds == (1, 2)
    for result in group.results:
        assert len(result.returns) == 2
        # CartPole: at least 8 steps of reward 1; Pendulum: 200 steps of at most 0.
        assert (result.mean >= 8) if env == "CartPole-v1" else (-2000 < result.mean <= 0)


def test_the_command_line_trains_and_evaluates_a_single_run(tmp_path: Path) -> None:
    assert main(["--env", "CartPole-v1", *SMALL, "--total-timesteps", "64", "--log-dir",
                 str(tmp_path), "--run-name", "one"]) == 0
    state = load_checkpoint(tmp_path / "one")
    assert state["agent"]["updates"] == 2 and state["config"]["algo"] == "ppo"
    # Deterministic actions: two evaluations of the same episodes return the same.
    assert evaluate(tmp_path / "one", episodes=2, verbose=False) == evaluate(
        tmp_path / "one", episodes=2, verbose=False)


def test_checkpoints_wait_for_a_rollout_boundary(tmp_path: Path) -> None:
    """Rollouts of 32 steps, --checkpoint-every 50: the first boundary at or after each
    multiple of 50 (64 for 50, 128 for 100, 160 for 150), and the end (the run's last step,
    170, mid-rollout: the learner of the 5 updates made)."""
    train(load_config(["--env", "CartPole-v1", *SMALL, "--total-timesteps", "170",
                       "--checkpoint-every", "50", "--keep-checkpoints", "10",
                       "--log-dir", str(tmp_path), "--run-name", "run"]))
    saved = [load_checkpoint(path) for path in list_checkpoints(tmp_path / "run")]
    assert [s["global_step"] for s in saved] == [64, 128, 160, 170]
    assert [s["agent"]["updates"] for s in saved] == [2, 4, 5, 5]


@pytest.mark.parametrize(("env", "seeds"), [("CartPole-v1", "2"), ("Pendulum-v1", "1")])
def test_resume_at_a_rollout_boundary_continues_bit_for_bit(env: str, seeds: str,
                                                            tmp_path: Path) -> None:
    """Stopped at a rollout boundary (its end at step 64) and resumed to 128, a run ends as
    the run straight to 128 does: learner, optimizers, returns. --no-anneal-lr: an annealed
    rate follows the run's --total-timesteps, which the two halves' first part had lower."""
    args = ["--env", env, *SMALL, "--num-seeds", seeds, "--no-anneal-lr", "--log-dir",
            str(tmp_path)]
    straight, halves = straight_and_halves(tmp_path, args, 128, 64)
    assert straight["global_step"] == halves["global_step"] == 128
    assert straight["agent"]["updates"] == 4
    assert_same_state(straight["agent"], halves["agent"])
    assert_same_state(straight["recent_returns"], halves["recent_returns"])
    assert_same_state(straight["observations"].tolist(), halves["observations"].tolist())


def test_a_stop_mid_rollout_saves_the_last_update_and_says_what_it_drops(
        tmp_path: Path) -> None:
    """A stop at step 48 (half-way through the second rollout of 32 steps) saves the
    learner of the one update made and the envs at step 48; the line says the 8 steps of
    each env in the rollout under way are not learned from. Resumed to 128, the run makes
    fresh rollouts from step 48: 2 more updates (at 80 and 112), and 16 steps at the end."""
    cfg = load_config(["--env", "CartPole-v1", *SMALL, "--total-timesteps", "128",
                       "--log-interval", "16", "--log-dir", str(tmp_path), "--run-name", "r"])

    def stop_at_48(step: int, _recent: list[list[float]]) -> None:
        if step == 48:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs before the loop's next check

    with pytest.raises(TrainingInterrupted) as info:
        train(cfg, report=stop_at_48)
    assert "SIGINT at step 48" in str(info.value)
    assert ("(mid-rollout: the last 8 steps of each env are not learned from; the resumed "
            "run starts a new rollout)") in str(info.value)
    saved = load_checkpoint(tmp_path / "r")
    assert (saved["global_step"], saved["agent"]["updates"]) == (48, 1)
    assert main(["--resume", str(tmp_path / "r")]) == 0
    final = load_checkpoint(tmp_path / "r")
    assert (final["global_step"], final["agent"]["updates"]) == (128, 3)


def test_rollout_collector_clips_gaussian_actions_and_passes_discrete_indices() -> None:
    from rl_graphstep.run.rollouts import RolloutCollector

    collector = RolloutCollector.__new__(RolloutCollector)
    collector.seeds, collector.num_envs = 1, 3
    collector.discrete, collector._dtype = False, np.dtype(np.float32)
    collector._low, collector._high = np.array([-2.0], np.float32), np.array([2.0], np.float32)
    env_actions = collector._env_actions(np.array([[-5.0], [0.5], [3.0]], np.float32))
    np.testing.assert_array_equal(env_actions, [[-2.0], [0.5], [2.0]])
    assert env_actions.dtype == np.float32
    collector.discrete, collector._dtype = True, np.dtype(np.int64)
    indices = collector._env_actions(np.array([[1.0], [0.0], [1.0]], np.float32))
    assert indices.tolist() == [1, 0, 1] and indices.dtype == np.int64


def test_the_rollout_keeps_the_unclipped_sample(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide Gaussian on Pendulum (bounds +-2): the envs get clipped actions, the rollout
    stores samples beyond the bounds, whose log-probabilities the policy loss compares."""
    from rl_graphstep.run import rollouts

    seen: list[np.ndarray] = []
    stored: list[np.ndarray] = []
    original = rollouts.RolloutCollector._env_actions

    def spying_env_actions(self: rollouts.RolloutCollector, actions: np.ndarray
                           ) -> np.ndarray:
        with torch.no_grad():  # from the first action on: samples mostly beyond +-2
            self.learner.algorithm.actor.log_std.fill_(float(np.log(10.0)))
        stored.append(actions.copy())  # the learner's buffer, overwritten by the next step
        seen.append(original(self, actions))
        return seen[-1]

    monkeypatch.setattr(rollouts.RolloutCollector, "_env_actions", spying_env_actions)
    train(load_config(["--env", "Pendulum-v1", *SMALL, "--total-timesteps", "32",
                       "--log-dir", str(tmp_path)]))
    samples = np.concatenate(stored)
    clipped = np.concatenate(seen)
    assert np.abs(samples).max() > 2.0 and np.abs(clipped).max() <= 2.0
    np.testing.assert_array_equal(clipped, np.clip(samples, -2.0, 2.0))


@pytest.mark.slow
def test_ppo_learns_cartpole_on_the_cpu(tmp_path: Path) -> None:
    """CleanRL's ppo.py settings (configs/ppo_classic.yaml) on CartPole-v1 for 100k steps:
    the last 10 episodes' mean return passes 200 (379.5 measured, 23 s on this 2-CPU machine;
    CleanRL reaches ~490 by 500k)."""
    summary = train(load_config([
        "--env", "CartPole-v1", "--algo", "ppo", "--config", str(CONFIGS / "ppo_classic.yaml"),
        "--total-timesteps", "100000", "--device", "cpu", "--no-progress",
        "--log-dir", str(tmp_path)]))
    assert summary["mean_return_last_10"] > 200


def test_the_next_steps_acting_is_queued_before_the_steps_bookkeeping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a rollout, each step queues the next step's acting before it records its own
    rewards (the host's bookkeeping runs while the device acts); the step that fills the
    rollout updates first, and the next acting comes after that update."""
    from rl_graphstep.data.rollout import Rollout
    from rl_graphstep.learners.onpolicy import OnPolicyLearner

    calls: list[str] = []
    for cls, name in ((OnPolicyLearner, "start_acting"), (OnPolicyLearner, "update"),
                      (Rollout, "record")):
        original = getattr(cls, name)

        def spy(self: object, *args: object, _name: str = name, _original=original) -> object:
            calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(cls, name, spy)
    train(load_config(["--env", "Pendulum-v1", *SMALL, "--total-timesteps", "64",
                       "--log-dir", str(tmp_path)]))
    # 2 rollouts of 16 steps: the first acting, then per step (acting ahead, record), but
    # the 16th step records and updates before the next rollout's first acting.
    rollout = ["start_acting"] + ["start_acting", "record"] * 15 + ["record", "update"]
    assert calls == rollout * 2
