"""PPO and NaN from the environment: one env of one seed returns a NaN reward or observation
once. Nothing non-finite reaches the weights or the env's actions, the seed's update of each
rollout that held the step is skipped and counted, the step counted and warned about as the
off-policy runs do, and the other seed learns as if nothing happened."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_graphstep.run.checkpoint import list_checkpoints, load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import train

# 2 seeds x 2 envs (in one process, made in order: seed 1's envs 0 and 1, then seed 2's),
# rollouts of 16 steps, 2 epochs x 2 minibatches: 4 critic and 4 actor steps per seed and
# rollout, 2 rollouts.
SMALL = ["--algo", "ppo", "--num-seeds", "2", "--num-envs", "2", "--num-steps", "16",
         "--num-minibatches", "2", "--update-epochs", "2", "--hidden-sizes", "8", "8",
         "--vec-env", "sync", "--total-timesteps", "64", "--checkpoint-every", "32",
         "--keep-checkpoints", "5", "--log-interval", "32", "--no-progress"]
POISONED_ENV = 2  # seed 2's env 0


class NaNOnce(gym.Wrapper):
    """An env whose reward or first observation entry is NaN on its ``at``-th step (from 1,
    ``part`` None: never); it counts the non-finite actions it is given."""

    def __init__(self, env: gym.Env, part: str | None, at: int) -> None:
        super().__init__(env)
        self.part, self.at, self.steps, self.nonfinite_actions = part, at, 0, 0

    def step(self, action: Any) -> tuple[Any, ...]:
        self.nonfinite_actions += int(not np.isfinite(action).all())
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps == self.at and self.part == "reward":
            reward = math.nan
        elif self.steps == self.at and self.part == "observation":
            observation = np.array(observation, copy=True)
            observation[0] = math.nan
        return observation, reward, terminated, truncated, info


def register(base: str, part: str | None, at: int) -> tuple[str, list[NaNOnce]]:
    """A fresh env id whose env number ``POISONED_ENV`` (in the order made) is poisoned;
    returns it and the list of the envs it makes."""
    made: list[NaNOnce] = []

    def make(**_: Any) -> NaNOnce:
        env = NaNOnce(gym.make(base), part if len(made) == POISONED_ENV else None, at)
        made.append(env)
        return env

    env_id = f"NaNOnce{base.split('-')[0]}{part}{at}{len(gym.registry)}-v0"
    gym.register(env_id, entry_point=make, max_episode_steps=200)
    return env_id, made


def seed_state(state: dict[str, Any], seed: int) -> list[torch.Tensor]:
    """Seed ``seed``'s (from 0) parameters and Adam moments in a checkpoint's agent."""
    agent = state["agent"]
    tensors = [t[seed] for net in ("actor", "critic") for t in agent[net].values()]
    for name in ("actor_optimizer", "critic_optimizer"):
        for moments in agent[name]["state"].values():
            tensors += [moments["exp_avg"][seed], moments["exp_avg_sq"][seed]]
    return tensors


def run(tmp_path: Path, name: str, env_id: str, *extra: str) -> tuple[dict[str, Any], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(load_config(["--env", env_id, *SMALL, *extra, "--log-dir",
                                     str(tmp_path), "--run-name", name]))
    return summary, [str(w.message) for w in caught if "non-finite" in str(w.message)]


CASES = [("reward", 5, "reward", 1, 4),
         # Transitions 5 (its next observation) and 6 (its observation), both in rollout 1.
         ("observation", 5, "next observation", 2, 4),
         # The rollout's last step: transitions 16 and 17 are in rollouts 1 and 2.
         ("observation", 16, "next observation", 2, 8)]


@pytest.mark.parametrize(("part", "at", "what", "transitions", "skipped"), CASES)
@pytest.mark.parametrize("norm_adv", ["--norm-adv", "--no-norm-adv"])
def test_a_nan_from_one_env_skips_its_seeds_rollout_and_leaves_the_other_seed_be(
        part: str, at: int, what: str, transitions: int, skipped: int, norm_adv: str,
        tmp_path: Path) -> None:
    check_one_nan(tmp_path, part, at, what, transitions, skipped, "--device", "cpu", norm_adv)


@pytest.mark.parametrize(("part", "at", "what", "transitions", "skipped"), CASES[:2])
def test_with_the_normalisers_the_nan_is_never_counted_into_them(
        part: str, at: int, what: str, transitions: int, skipped: int, tmp_path: Path) -> None:
    """--obs-norm and --reward-norm (per-seed statistics): the same counts and skips, seed 1
    as without the NaN, and every statistic finite (a NaN reward's env keeps a NaN running
    return until its episode ends, counted into nothing: the reward normaliser's own rule)."""
    check_one_nan(tmp_path, part, at, what, transitions, skipped, "--device", "cpu",
                  "--obs-norm", "--reward-norm")
    state = load_checkpoint(tmp_path / "poisoned")
    observations, rewards = state["obs_normalizer"], state["reward_normalizer"]
    statistics = [observations[name] for name in ("count", "mean", "var")]
    statistics += [rewards[name] for name in ("count", "mean", "var")]
    assert all(torch.isfinite(t.double()).all() for t in statistics)


def check_one_nan(tmp_path: Path, part: str, at: int, what: str, transitions: int,
                  skipped: int, *args: str) -> None:
    """Seed 2's env 0 returns a NaN ``part`` at its step ``at``: ``transitions`` counted,
    ``skipped`` steps of each kind skipped (all seed 2's, of the rollouts that held one)."""
    env_id, made = register("Pendulum-v1", part, at)
    clean_id, _ = register("Pendulum-v1", None, at)
    summary, said = run(tmp_path, "poisoned", env_id, *args)
    clean, _ = run(tmp_path, "clean", clean_id, *args)

    # Counted and warned about as an off-policy run counts a dropped transition; the seed's
    # 4 steps of each rollout that held it skipped (of 2 rollouts x 4 steps x 2 seeds).
    assert summary["skipped_transitions"] == transitions
    assert summary["updates"] == {"critic": (skipped, 16), "actor": (skipped, 16)}
    assert summary["not_learned"] is None and summary["nonfinite_episodes"] == 0
    assert len(said) == 1 and re.fullmatch(
        rf"{env_id} returned a non-finite {what} \(seed 2, env 0, step {2 * at}\); steps with "
        r"NaN or inf are not learned from \(their seed's update of the rollout is skipped\) "
        r"and counted in charts/nonfinite_transitions \(warned once per run\)", said[0])
    # The policy never saw the NaN: every env was given finite actions.
    assert [env.nonfinite_actions for env in made] == [0, 0, 0, 0]

    poisoned_run = tmp_path / "poisoned"
    first, last = (load_checkpoint(path) for path in list_checkpoints(poisoned_run))
    assert (first["global_step"], last["global_step"]) == (32, 64)
    # By step 32 (each env's step 16), transition 17 was not made yet.
    assert first["nonfinite"][1]["transitions"] == (transitions if at == 5 else 1)
    assert first["nonfinite"][0]["transitions"] == 0
    for state in (first, last):
        assert all(torch.isfinite(t).all() for t in seed_state(state, 0) + seed_state(state, 1))
    # Seed 2's first update was skipped whole: its Adam moments are still zeros at step 32.
    assert all(not t.any() for t in seed_state(first, 1)[-8:])
    assert all(t.any() for t in seed_state(first, 0)[-8:])
    # Seed 1 learned bit for bit as in the run without a NaN.
    for a, b in zip(seed_state(last, 0), seed_state(load_checkpoint(tmp_path / "clean"), 0),
                    strict=True):
        assert torch.equal(a, b)
    assert clean["updates"] == {"critic": (0, 16), "actor": (0, 16)}


def test_a_nan_observation_of_a_discrete_env_acts_on_a_finite_one(tmp_path: Path) -> None:
    """CartPole (the categorical actor): its env is given valid indices throughout."""
    env_id, made = register("CartPole-v1", "observation", 5)
    summary, said = run(tmp_path, "run", env_id, "--device", "cpu")
    assert summary["skipped_transitions"] == 2 and len(said) == 1
    assert [env.nonfinite_actions for env in made] == [0, 0, 0, 0]
    assert summary["updates"]["critic"] == (4, 16)


@pytest.mark.cuda
@pytest.mark.parametrize(("part", "at", "what", "transitions", "skipped"), CASES)
def test_a_captured_run_skips_a_nan_seeds_rollout_alike(
        part: str, at: int, what: str, transitions: int, skipped: int, tmp_path: Path) -> None:
    """The same on the GPU with the minibatch graph: the rows are skipped inside it."""
    check_one_nan(tmp_path, part, at, what, transitions, skipped, "--device", "cuda",
                  "--graph", "on", "--compile", "off")
