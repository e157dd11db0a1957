"""Checks of a built PPO actor or value network on an example batch: the built-in networks and
the example pass, each way of being wrong is one exact line naming the class and what would
be right, and the run's random stream is left as it was."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.ppocheck import check_ppo_actor, check_value_network
from rl_graphstep.networks.builtin import EnsembleCritic, SquashedGaussianActor
from rl_graphstep.networks.policies import CategoricalActor, GaussianActor, ValueNetwork

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `examples` is a folder of the repository
    sys.path.insert(0, str(ROOT))

from examples.ppo_actor import LayerNormCategoricalActor, LayerNormGaussianActor  # noqa: E402

OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
CPU = torch.device("cpu")
ON_BOX = {"observation_size": 5, "action_size": 2, "num_actions": 0, "device": CPU}
ON_DISCRETE = {"observation_size": 5, "action_size": 1, "num_actions": 3, "device": CPU}
PROTOCOL = ("a PPO actor has forward(observations) -> (actions, log_probs), "
            "log_prob_and_entropy(observations, actions) -> (log_probs, entropy) and "
            "deterministic_action(observations) -> actions (see "
            "rl_graphstep/networks/policies.py)")


def refused(line: str) -> pytest.RaisesContext:
    """pytest.raises for a ConfigError whose text is exactly ``line``."""
    return pytest.raises(ConfigError, match=f"^{re.escape(line)}$")


# ------------------------------------------------------------------ what passes


def test_the_built_in_networks_and_the_examples_pass() -> None:
    check_ppo_actor(GaussianActor(OBS, BOX, (8,)), **ON_BOX)
    check_ppo_actor(LayerNormGaussianActor(OBS, BOX, width=8), **ON_BOX)
    check_ppo_actor(CategoricalActor(OBS, DISCRETE, (8,)), **ON_DISCRETE)
    check_ppo_actor(LayerNormCategoricalActor(OBS, DISCRETE, width=8, depth=1), **ON_DISCRETE)
    check_value_network(ValueNetwork(OBS, hidden_sizes=(8,)), observation_size=5, device=CPU)


def test_the_checks_draw_nothing_from_the_runs_random_stream() -> None:
    actor, critic = GaussianActor(OBS, BOX, (8,)), ValueNetwork(OBS)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check_ppo_actor(actor, **ON_BOX)
    check_value_network(critic, observation_size=5, device=CPU)
    assert torch.equal(torch.rand(3), expected)


def test_the_example_keeps_the_built_in_head_on_a_torso_of_its_own() -> None:
    actor = LayerNormGaussianActor(OBS, BOX, width=8, depth=2)
    # Linear 5->8, LayerNorm, SiLU, Linear 8->8, LayerNorm, SiLU, Linear 8->2.
    assert [type(m).__name__ for m in actor.mean] == [
        "Linear", "LayerNorm", "SiLU", "Linear", "LayerNorm", "SiLU", "Linear"]
    assert actor.mean[-1].weight.shape == (2, 8) and actor.log_std.shape == (2,)
    observations = torch.randn(4, 5)
    torch.testing.assert_close(actor.deterministic_action(observations),
                               actor.mean(observations))


# ------------------------------------------------------------------ missing methods


class SampleOnly(nn.Module):
    """forward alone: PPO's other two methods missing."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = GaussianActor(OBS, BOX, (8,))

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner(observations)


def test_a_missing_method_is_named_with_the_protocol() -> None:
    with refused(f"SampleOnly has no log_prob_and_entropy and no deterministic_action: "
                 f"{PROTOCOL}"):
        check_ppo_actor(SampleOnly(), **ON_BOX)
    # A SAC actor has deterministic_action but not PPO's log-probability of a given action.
    with refused(f"SquashedGaussianActor has no log_prob_and_entropy: {PROTOCOL}"):
        check_ppo_actor(SquashedGaussianActor(OBS, BOX, (8,)), **ON_BOX)


# ------------------------------------------------------------------ wrong returns


class Misbehaving(GaussianActor):
    """A GaussianActor with one thing wrong, chosen by ``fault``."""

    def __init__(self, fault: str) -> None:
        super().__init__(OBS, BOX, (8,))
        self.fault = fault

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor] | Tensor:
        actions, log_probs = super().forward(observations)
        if self.fault == "action only":
            return actions
        if self.fault == "keepdim":
            return actions, log_probs.unsqueeze(-1)
        if self.fault == "shifted":
            return actions, log_probs + 1.0
        if self.fault == "whole numbers":
            return actions.round(), log_probs
        return actions, log_probs

    def log_prob_and_entropy(self, observations: Tensor, actions: Tensor
                             ) -> tuple[Tensor, Tensor] | Tensor:
        log_probs, entropy = super().log_prob_and_entropy(observations, actions)
        if self.fault == "log_probs only":
            return log_probs
        if self.fault == "entropy per action":
            return log_probs, entropy.unsqueeze(-1).expand(-1, 2)
        return log_probs, entropy

    def deterministic_action(self, observations: Tensor) -> Tensor:
        action = super().deterministic_action(observations)
        return action[:, :1] if self.fault == "narrow mean" else action


@pytest.mark.parametrize(("fault", "line"), [
    ("action only", "Misbehaving.forward returned a Tensor, expected a tuple "
                    "(actions, log_probs)"),
    ("keepdim", "Misbehaving.forward returned log_prob shape (256, 1), expected (256,) (sum "
                "the log-probabilities over the action dimension)"),
    ("log_probs only", "Misbehaving.log_prob_and_entropy returned a Tensor, expected a tuple "
                       "(log_probs, entropy)"),
    ("entropy per action", "Misbehaving.log_prob_and_entropy returned entropy shape (256, 2), "
                           "expected (256,) (one value per row, summed over the action "
                           "dimension)"),
    ("narrow mean", "Misbehaving.deterministic_action returned shape (256, 1), expected "
                    "(256, 2) (a Box action space of 2: a Gaussian actor's samples)"),
    ("shifted", "Misbehaving.log_prob_and_entropy gives the actions forward sampled "
                "log-probabilities up to 1 from those forward returned with them: both must "
                "be the log-probability of the action forward returns (the unclipped "
                "sample), since PPO's ratio pi / pi_old starts at 1"),
    ("whole numbers", "Misbehaving.forward returned only whole-number actions, as a "
                      "categorical actor's indices, but the action space is a Box of 2, whose "
                      "actions are continuous: give a Gaussian actor (as "
                      "rl_graphstep.networks.policies:GaussianActor); a categorical one is "
                      "for a Discrete action space"),
])
def test_each_wrong_return_is_one_line(fault: str, line: str) -> None:
    with refused(line):
        check_ppo_actor(Misbehaving(fault), **ON_BOX)


# ------------------------------------------------------------------ the action space's kind


class GaussianIndices(GaussianActor):
    """A Gaussian over one dimension, offered for a Discrete space (its constructor is
    given a Box, as a user's own class might make one)."""

    def __init__(self) -> None:
        super().__init__(OBS, gym.spaces.Box(-1.0, 1.0, (1,), np.float32), (8,))


class ShiftedIndices(CategoricalActor):
    """Indices from 1 to n: one past the space's last."""

    def __init__(self) -> None:
        super().__init__(OBS, DISCRETE, (8,))

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        index, log_probs = super().forward(observations)
        return index + 1, log_probs


def test_a_gaussian_actor_for_a_discrete_space_is_told_to_be_categorical() -> None:
    # The line names one of the samples (a random one: not hand-computable, so matched).
    with pytest.raises(ConfigError, match=(
            r"^GaussianIndices.forward returned actions that are not whole numbers \(e.g. "
            r"-?[0-9.e-]+\), but the action space is Discrete\(3\), whose actions are "
            r"indices: give a categorical actor \(as rl_graphstep.networks.policies:"
            r"CategoricalActor\); a Gaussian one is for a Box action space$")):
        check_ppo_actor(GaussianIndices(), **ON_DISCRETE)


def test_a_box_actor_of_several_dimensions_for_a_discrete_space_is_a_shape_line() -> None:
    with refused("GaussianActor.forward returned action shape (256, 2), expected (256, 1) "
                 "(a Discrete(3) action is its index as a float, (B, 1): a categorical "
                 "actor's)"):
        check_ppo_actor(GaussianActor(OBS, BOX, (8,)), **ON_DISCRETE)


def test_indices_beyond_the_space_are_named() -> None:
    with refused("ShiftedIndices.forward returned action indices in [1, 3], expected 0 .. 2 "
                 "for the Discrete(3) action space"):
        check_ppo_actor(ShiftedIndices(), **ON_DISCRETE)


# ------------------------------------------------------------------ the value network


class FlatValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ValueNetwork(OBS, hidden_sizes=(8,))

    def forward(self, observations: Tensor) -> Tensor:
        return self.inner(observations).squeeze(-1)


def test_a_value_network_of_the_wrong_shape_or_kind_is_one_line() -> None:
    with refused("FlatValues.forward returned shape (256,), expected (256, 1) (a PPO critic "
                 "is a value network, forward(observations) -> values (B, 1))"):
        check_value_network(FlatValues(), observation_size=5, device=CPU)
    with refused("EnsembleCritic.forward takes (observations, actions), as an off-policy Q "
                 "critic's does: a PPO critic is a value network, forward(observations) -> "
                 "values (B, 1)"):
        check_value_network(EnsembleCritic(OBS, BOX, (8,)), observation_size=5, device=CPU)


def test_the_value_network_is_built_as_every_network_is() -> None:
    """``Class(observation_space, action_space, **kwargs)``: 5 -> 3 -> 1 with kwargs."""
    critic = ValueNetwork(OBS, BOX, hidden_sizes=(3,))
    assert [tuple(p.shape) for p in critic.parameters()] == [(3, 5), (3,), (1, 3), (1,)]
    with pytest.raises(TypeError):
        ValueNetwork(OBS, BOX, (3,))  # type: ignore[misc]  # widths are keyword-only


class DetachedLogProbs(GaussianActor):
    def __init__(self) -> None:
        super().__init__(OBS, BOX, (8,))

    def log_prob_and_entropy(self, observations: Tensor, actions: Tensor
                             ) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            return super().log_prob_and_entropy(observations, actions)


class DetachedValues(ValueNetwork):
    def __init__(self) -> None:
        super().__init__(OBS, hidden_sizes=(8,))

    def forward(self, observations: Tensor) -> Tensor:
        return super().forward(observations).detach()


def test_outputs_the_losses_cannot_differentiate_are_one_line() -> None:
    """The step's backward would fail inside the update, with a traceback, where the check
    names them at start-up."""
    with refused("DetachedLogProbs.log_prob_and_entropy returned log_probs without a "
                 "gradient: the policy loss differentiates them with respect to the "
                 "network's parameters; compute them outside torch.no_grad() and without "
                 ".detach()"):
        check_ppo_actor(DetachedLogProbs(), **ON_BOX)
    with refused("DetachedValues.forward returned values without a gradient: the value loss "
                 "differentiates them with respect to the network's parameters; compute "
                 "them outside torch.no_grad() and without .detach()"):
        check_value_network(DetachedValues(), observation_size=5, device=CPU)
