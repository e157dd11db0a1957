"""What the custom-network tests share: the spaces and sizes of the example batch, the
examples folder made importable, and a module of networks each wrong in one way."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rl_graphstep.networks.custom import build_network

ROOT = Path(__file__).resolve().parents[1]
# `examples` is a folder of the repository, not of the installed package: make it importable
# however pytest was started (`python -m pytest` adds the current directory, `pytest` does not).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
ACT_SPACE = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
CPU = torch.device("cpu")
SIZES = {"observation_size": 5, "action_size": 3, "device": CPU}
RESIDUAL_ACTOR = "examples.residual_actor:ResidualActor"
LAYERNORM_CRITIC_FILE = ROOT / "examples" / "layernorm_critic.py"

# A module of small networks, each wrong in one way; `write_bad_networks` puts it in a tmp file.
BAD_NETWORKS = """
import torch
from torch import nn


class Base(nn.Module):
    def __init__(self, observation_space, action_space, scale=1.0):
        super().__init__()
        self.linear = nn.Linear(observation_space.shape[0], action_space.shape[0])
        self.scale = scale

    def action(self, obs):
        return torch.tanh(self.linear(obs)) * self.scale


class WrongShape(Base):
    def forward(self, obs):
        return self.action(obs)[:, :1], torch.zeros(obs.shape[0])


class NoTuple(Base):
    def forward(self, obs):
        return self.action(obs)


class TupleOfThree(Base):
    def forward(self, obs):
        a = self.action(obs)
        return a, a.sum(-1), a


class OutOfRange(Base):
    def forward(self, obs):
        return self.linear(obs) * 100 + 50, torch.zeros(obs.shape[0])


class NaNs(Base):
    def forward(self, obs):
        a = self.action(obs)
        return a, torch.full((obs.shape[0],), float("nan"))


class Float64(Base):
    def forward(self, obs):
        return self.action(obs).double(), torch.zeros(obs.shape[0])


class KeepDimLogProb(Base):
    def forward(self, obs):
        a = self.action(obs)
        return a, torch.zeros(obs.shape[0], 1)


class Crashes(Base):
    def forward(self, obs):
        return self.linear(obs[:, :2])  # CRASH-LINE


class FakeSync(Base):
    def forward(self, obs):
        raise RuntimeError("called a synchronizing CUDA operation")  # SYNC-LINE


class DeterministicTuple(Base):
    def forward(self, obs):
        return self.action(obs), torch.zeros(obs.shape[0])


class DeterministicWide(Base):
    def forward(self, obs):
        return torch.cat([self.action(obs), self.action(obs)], dim=1)


class DrawsNoise(Base):
    def forward(self, obs):
        a = torch.tanh(self.linear(obs) + torch.randn(obs.shape[0], 3))
        return a, torch.randn(obs.shape[0])


class OneQ(nn.Module):
    def __init__(self, observation_space, action_space):
        super().__init__()
        self.q = nn.Linear(observation_space.shape[0] + action_space.shape[0], 1)

    def forward(self, obs, act):
        return self.q(torch.cat([obs, act], -1))


class FlatQ(OneQ):
    def forward(self, obs, act):
        return super().forward(obs, act)[:, 0]


class InfQ(OneQ):
    def forward(self, obs, act):
        q = super().forward(obs, act)
        return torch.cat([q, q + float("inf")], dim=1)


class LiesAboutMembers(OneQ):
    num_critics = 3

    def forward(self, obs, act):
        q = super().forward(obs, act)
        return torch.cat([q, q], dim=1)


class NoSpaces(nn.Module):
    def __init__(self, width):
        super().__init__()


def not_a_class():
    return None


class NotAModule:
    pass
"""


def write_bad_networks(tmp_path: Path) -> Path:
    """BAD_NETWORKS as ``bad_networks.py`` in ``tmp_path``."""
    path = tmp_path / "bad_networks.py"
    path.write_text(textwrap.dedent(BAD_NETWORKS))
    return path


def build(spec: str, **kwargs: object) -> nn.Module:
    return build_network(spec, OBS_SPACE, ACT_SPACE, kwargs, role="actor")


def line_of(path: Path, marker: str) -> int:
    """1-based number of the line of `path` holding `marker`."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if marker in line)
