"""Tiny deterministic networks whose losses can be computed by hand, and environments that
return NaN or inf now and then."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import OffPolicyAlgorithm
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.settings.plan import RunPlan


class FixedActor(nn.Module):
    """SAC-style: action = tanh(w * obs[:, :1]); log_pi = 0.1 * w * obs.sum(1)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return torch.tanh(self.w * obs[:, :1]), 0.1 * obs.sum(1) * self.w


class FixedDeterministicActor(nn.Module):
    """TD3-style: action = tanh(w * obs[:, :1])."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.w * obs[:, :1])


class LinearCritic(nn.Module):
    """Q_e(o, a) = c_e * (o.sum() + a.sum()), with c = (1, 2, ...)[:members]."""

    def __init__(self, members: int = 2) -> None:
        super().__init__()
        self.c = nn.Parameter(torch.arange(1.0, members + 1.0))

    def forward(self, obs: Tensor, act: Tensor) -> Tensor:
        return (obs.sum(1, keepdim=True) + act.sum(1, keepdim=True)) * self.c


# Two transitions, packed as [obs(2) | act(1) | reward | not_done | next_obs(2)].
ROWS = torch.tensor([
    [1.0, 2.0, 0.5, 1.0, 1.0, 0.2, -0.4],
    [-1.0, 0.5, -0.3, -2.0, 0.0, 1.5, 1.0],
])


class NoisyFixedActor(FixedActor):
    """FixedActor with a ``sample`` that takes its standard normal noise from the caller:
    tanh(w * obs[:, :1] + noise)."""

    def sample(self, obs: Tensor, noise: Tensor | None = None) -> Tensor:
        noise = torch.randn(len(obs), 1) if noise is None else noise
        return torch.tanh(self.w * obs[:, :1] + noise)


CPU = torch.device("cpu")


def cpu_plan(**overrides: Any) -> RunPlan:
    """The plan of an eager, uncompiled run on the CPU."""
    return RunPlan(**{"device": CPU, "graphs": False, "compile": False, "action_stream": False,
                      "vec_env": "sync", "tf32": False, **overrides})


def buffer_of(rows: Tensor, capacity: int | None = None) -> ReplayBuffer:
    """A CPU replay buffer holding packed ``rows`` (observation size 2, action size 1)."""
    buffer = ReplayBuffer(capacity or len(rows), 2, 1, CPU)
    buffer.add(rows[:, :2], rows[:, 2:3], rows[:, 3], rows[:, 5:], 1 - rows[:, 4])
    return buffer


def counting_buffer(rows: int = 50) -> ReplayBuffer:
    """``rows`` distinct transitions, row i's first observation entry being i."""
    buffer = ReplayBuffer(100, 2, 1, CPU)
    index = np.arange(rows, dtype=np.float32)
    buffer.add(np.stack([index, -index], 1), index[:, None] / 100, index, np.stack(
        [index + 0.5, index - 0.5], 1), index % 7 == 0)
    return buffer


def built_learner(algorithm: OffPolicyAlgorithm, buffer: ReplayBuffer,
                  sums: MetricSums | None = None, plan: RunPlan | None = None
                  ) -> OffPolicyLearner:
    """A learner of ``algorithm`` (with its config) from ``buffer``, built on ``plan``."""
    learner = OffPolicyLearner(algorithm, buffer, algorithm.cfg, plan or cpu_plan())
    learner.build(MetricSums() if sums is None else sums)
    return learner


def assert_same_learning_state(actual: OffPolicyLearner, expected: OffPolicyLearner, *,
                               rtol: float = 0.0, atol: float = 0.0) -> None:
    """Two learners' checkpointed parts (networks, targets, optimizers, temperature, update
    count) equal to the bit (or within ``rtol``/``atol``), each named on a mismatch."""
    mine, theirs = actual.state_dict(), expected.state_dict()
    assert mine.keys() == theirs.keys()
    for name, part in theirs.items():
        torch.testing.assert_close(mine[name], part, rtol=rtol, atol=atol, msg=name)


def assert_same_state(a: object, b: object, path: str = "") -> None:
    """Bitwise equality of nested dicts/lists of tensors and numbers."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same_state(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


class PoisonedPendulum(gym.Wrapper):
    """Pendulum whose reward (``part="reward"``) or first observation entry
    (``part="observation"``) is ``value`` on every ``every``-th step, counted across episodes.
    It also counts the non-finite actions it was given (a policy fed NaN acts NaN)."""

    def __init__(self, env: gym.Env, part: str, value: float, every: int) -> None:
        super().__init__(env)
        self.part, self.value, self.every, self.steps = part, value, every, 0
        self.nonfinite_actions = 0

    def step(self, action: np.ndarray) -> tuple[Any, ...]:
        self.nonfinite_actions += int(not np.isfinite(action).all())
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps % self.every == 0:
            if self.part == "reward":
                reward = self.value
            else:
                obs = np.array(obs, copy=True)
                obs[0] = self.value
        return obs, reward, terminated, truncated, info


POISONED: list[PoisonedPendulum] = []
"""Every ``PoisonedPendulum`` a registered id made, newest last (to read its counts)."""


def register_poisoned(name: str, part: str, value: float, every: int) -> str:
    """Register ``name-v0``: a ``PoisonedPendulum`` with 200-step episodes."""

    def make(**_: Any) -> PoisonedPendulum:
        env = PoisonedPendulum(gym.make("Pendulum-v1"), part, value, every)
        POISONED.append(env)
        return env

    env_id = f"{name}-v0"
    gym.register(env_id, entry_point=make, max_episode_steps=200)
    return env_id


def flat_state(learner: OffPolicyLearner) -> dict[str, torch.Tensor]:
    """Every tensor of the learning state by name: parameters (K, ...) and optimizer state."""
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}", item)

    walk("", learner.state_dict())
    return flat


class SpaceBreaker(gym.Env):
    """A 3-entry observation, 1-entry action env whose reset or step breaks its own spaces as
    ``fault`` says (see ``SPACE_FAULTS``); from step ``after`` on, for a fault that comes late.
    Episodes end (terminated) every 20 steps. Its action spaces vary with ``action_space``."""

    def __init__(self, fault: str = "none", after: int = 0,
                 action_space: gym.spaces.Space | None = None) -> None:
        self.fault, self.after, self.steps, self.t = fault, after, 0, 0
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = action_space or gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.actions: list[np.ndarray] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        observation = np.zeros(3, np.float32)
        if self.fault == "reset_shape":
            observation = np.zeros(5, np.float32)
        if self.fault == "reset_not_tuple":
            return observation
        return observation, {}

    def step(self, action: np.ndarray) -> Any:
        self.actions.append(np.array(action, copy=True))
        self.steps += 1
        self.t += 1
        fault = self.fault if self.steps > self.after else "none"
        observation: Any = np.full(3, 0.1, np.float32)
        reward: Any = -float(np.square(action).sum())
        terminated: Any = self.t >= 20
        info: Any = {}
        if fault == "step_raises":
            raise ValueError("the simulator blew up")
        if fault == "step_shape":
            observation = np.zeros(5, np.float32)
        elif fault == "step_none":
            observation = None
        elif fault == "reward_vector":
            reward = np.array([reward, 0.0])
        elif fault == "terminated_none":
            terminated = None
        elif fault == "info_list":
            info = []
        elif fault == "step_4":
            return observation, reward, terminated, info
        return observation, reward, terminated, False, info

    def close(self) -> None:
        if self.fault == "close_raises":
            raise RuntimeError("close boom")
        if self.fault == "close_hangs":
            time.sleep(10_000)


SPACE_FAULTS = {
    "reset_shape": "reset returned an observation of shape (5,) and dtype float32, but its "
                   "observation space is Box(-1.0, 1.0, (3,), float32)",
    "reset_not_tuple": "reset returned an array of shape (3,) and dtype float32, but "
                       "gymnasium's reset returns 2: (observation, info)",
    "step_shape": "step returned an observation of shape (5,) and dtype float32, but its "
                  "observation space is Box(-1.0, 1.0, (3,), float32)",
    "step_none": "step returned an observation None, but its observation space is "
                 "Box(-1.0, 1.0, (3,), float32)",
    "reward_vector": "step returned a reward of shape (2,) and dtype float64, but a reward "
                     "must be one number",
    "terminated_none": "step returned terminated None, but terminated must be a bool",
    "info_list": "step returned info [] (type list), but info must be a dict",
    "step_4": "step returned 4 values, but gymnasium's step returns 5: (observation, reward, "
              "terminated, truncated, info)",
}
"""What each fault's env returns, as the one line after ``environment 'ID': `` says it."""

for _fault in ("none", "step_raises", "close_raises", "close_hangs", *SPACE_FAULTS):
    # Registered on import, so that fakes:Breaks_<fault>-v0 makes them in a training
    # subprocess too. BreaksLate comes after 150 good steps, which took the check's fast path.
    gym.register(f"Breaks_{_fault}-v0", entry_point=SpaceBreaker, kwargs={"fault": _fault},
                 max_episode_steps=100)
gym.register("BreaksLate_step_shape-v0", entry_point=SpaceBreaker,
             kwargs={"fault": "step_shape", "after": 150}, max_episode_steps=100)
gym.register("IntActions-v0", entry_point=SpaceBreaker,
             kwargs={"action_space": gym.spaces.Box(-5, 5, (2,), np.int64)})
gym.register("NoActions-v0", entry_point=SpaceBreaker,
             kwargs={"action_space": gym.spaces.Box(-1.0, 1.0, (0,), np.float32)})


class HangingStep(SpaceBreaker):
    """From its step ``after`` on, a step that never returns (a simulator that hung), having
    first made the file that ``HANGING_STEP_MARKER`` names, so a test knows it hangs."""

    def step(self, action: np.ndarray) -> Any:
        if self.steps >= self.after:
            marker = os.environ.get("HANGING_STEP_MARKER")
            if marker:
                Path(marker).touch()
            time.sleep(10_000)
        return super().step(action)


gym.register("HangsLate-v0", entry_point=HangingStep, kwargs={"after": 150},
             max_episode_steps=100)
