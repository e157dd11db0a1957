"""CrossQ: the joint forward's TD target against a hand computation, the normalisation modes
of each use of the networks, no target network (built, averaged or saved), the schedule, the
optimizers' betas, the learner's update through the joint forward, and the one-line refusals
of critics and settings it cannot use."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import CPU, built_learner, counting_buffer, cpu_plan

from rl_graphstep.algorithms import check_settings
from rl_graphstep.algorithms.base import JointPrediction
from rl_graphstep.algorithms.crossq import CrossQ, check_critic_normalizes
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.rows import CriticTargets
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.networks.batchrenorm import BatchRenorm
from rl_graphstep.networks.builtin import EnsembleCritic
from rl_graphstep.networks.seeds import stack_pairs
from rl_graphstep.settings.config import Config

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def make_crossq(seeds: int = 1, **overrides: object) -> CrossQ:
    cfg = Config(**{"algo": "crossq", "alpha": 0.5, "gamma": 0.9, "policy_frequency": 3,
                    "batch_size": 8, "hidden_sizes": (8,), "critic_hidden_sizes": (16,),
                    "batch_renorm_warmup": 2, "num_seeds": seeds, **overrides})
    torch.manual_seed(0)
    if seeds == 1:
        actor = CrossQ.default_actor(OBS, ACT, cfg)
        critic = CrossQ.default_critic(OBS, ACT, cfg)
    else:
        actor, critic = stack_pairs(lambda _: (CrossQ.default_actor(OBS, ACT, cfg),
                                               CrossQ.default_critic(OBS, ACT, cfg)),
                                    range(seeds))
    return CrossQ(actor, critic, cfg, action_size=1, device=CPU, seeds=seeds)


def renorm_steps(module: torch.nn.Module) -> list[int]:
    return [m.steps.item() for m in module.modules() if isinstance(m, BatchRenorm)]


def batch(seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    obs, next_obs = torch.randn(8, 2, generator=g), torch.randn(8, 2, generator=g)
    actions = torch.rand(8, 1, generator=g) * 2 - 1
    rewards, not_dones = torch.randn(8, 1, generator=g), (torch.rand(8, 1, generator=g) > 0.2)
    return obs, actions, next_obs, rewards, not_dones.float()


def test_the_joint_forward_target_matches_a_hand_computation() -> None:
    crossq = make_crossq()
    actor, critic = copy.deepcopy(crossq.actor), copy.deepcopy(crossq.critic)
    obs, actions, next_obs, rewards, not_dones = batch()

    torch.manual_seed(5)
    prediction = crossq.joint_prediction(obs, actions, next_obs)
    target = crossq.joint_td_target(prediction, CriticTargets(rewards, not_dones, next_obs))

    # By hand: a' from the actor in inference mode (same draw), the critic in training mode
    # on the 16 rows [s; s'], [a; a'], its second half's min minus alpha log pi(a'|s').
    torch.manual_seed(5)
    with torch.no_grad():
        next_actions, next_log_pi = actor(next_obs)
    critic.train()
    q = critic(torch.cat([obs, next_obs]), torch.cat([actions, next_actions]))
    expected = rewards + not_dones * 0.9 * (q[8:].min(dim=1, keepdim=True).values
                                            - 0.5 * next_log_pi.unsqueeze(1))
    assert isinstance(prediction, JointPrediction)
    torch.testing.assert_close(prediction.q_values, q[:8])
    assert prediction.q_values.requires_grad and not prediction.next_q_values.requires_grad
    torch.testing.assert_close(target, expected.detach())
    # The critic's running statistics moved on once, from the 16 rows; the actor's did not.
    assert renorm_steps(crossq.critic) == [1, 1] and renorm_steps(crossq.actor) == [0, 0]
    torch.testing.assert_close(crossq.critic.input_renorm.running_mean[0],
                               0.01 * torch.cat([torch.cat([obs, next_obs]),
                                                 torch.cat([actions, next_actions])],
                                                dim=1).mean(0))
    assert not crossq.critic.training and not crossq.actor.training


def test_the_critic_loss_is_half_the_summed_mse_against_that_target() -> None:
    crossq = make_crossq()
    obs, actions, next_obs, rewards, not_dones = batch()
    prediction = crossq.joint_prediction(obs, actions, next_obs)
    targets = CriticTargets(rewards, not_dones, next_obs)
    loss, _ = crossq.critic_loss(prediction, targets)
    y = crossq.joint_td_target(prediction, targets)
    expected = 0.5 * ((prediction.q_values - y) ** 2).mean(0).sum()
    torch.testing.assert_close(loss, expected)


def test_the_actor_learns_in_training_mode_against_the_critic_in_inference_mode() -> None:
    crossq = make_crossq()
    critic_state = copy.deepcopy(crossq.critic.state_dict())
    obs = batch()[0]
    prediction = crossq.actor_step_module()(obs)
    loss, _ = crossq.actor_loss(prediction, obs)
    loss.backward()
    assert renorm_steps(crossq.actor) == [1, 1] and not crossq.actor.training
    # The critic was read with its running statistics: nothing of it moved.
    for name, value in crossq.critic.state_dict().items():
        assert torch.equal(value, critic_state[name]), name


def test_there_is_no_target_network() -> None:
    crossq = make_crossq()
    assert crossq.target_critic is None and crossq.polyak is None
    assert "target_critic" not in crossq.learning_state()
    learner = built_learner(crossq, counting_buffer())
    for _ in range(4):
        learner.update()
    assert set(learner.state_dict()) == {"actor", "critic", "log_alpha", "actor_optimizer",
                                         "critic_optimizer", "updates"}
    # Four critic updates moved the critic's statistics; one actor update (the third) the actor's.
    assert renorm_steps(crossq.critic) == [4, 4] and renorm_steps(crossq.actor) == [1, 1]


def test_one_actor_step_follows_every_third_critic_step() -> None:
    crossq = make_crossq()
    assert [crossq.actor_steps(u) for u in range(7)] == [0, 0, 1, 0, 0, 1, 0]
    assert crossq.update_period() == 3


def test_adam_has_the_papers_betas_and_the_temperature_the_default_ones() -> None:
    learner = built_learner(make_crossq(), counting_buffer())
    assert [g["betas"] for g in learner.critic_optimizer.param_groups] == [(0.5, 0.999)]
    assert [g["betas"] for g in learner.actor_optimizer.param_groups] == [(0.5, 0.999),
                                                                          (0.9, 0.999)]


def test_the_default_networks_are_wide_renormalised_and_in_inference_mode() -> None:
    crossq = make_crossq()
    assert crossq.critic.weights[0].shape == (2, 3, 16)  # --critic-hidden-sizes 16
    assert crossq.critic.input_renorm.running_mean.shape == (2, 3)  # per member
    assert crossq.critic.hidden_renorms[0].running_var.shape == (2, 16)
    assert crossq.critic.normalization == "batch_renorm"
    assert crossq.actor.trunk[0].running_mean.shape == (2,)
    assert crossq.actor.trunk[1].weight.shape == (8, 2)  # --hidden-sizes 8


def test_stacked_seeds_update_through_the_joint_forward() -> None:
    crossq = make_crossq(seeds=2)
    buffer = ReplayBuffer(40, 2, 1, CPU, seeds=2)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(40, 2)), rng.uniform(-1, 1, (40, 1)), rng.normal(size=40),
               rng.normal(size=(40, 2)), rng.random(40) < 0.1)
    learner = OffPolicyLearner(crossq, buffer, crossq.cfg, cpu_plan())
    learner.build(MetricSums(shape=(2,)))
    for _ in range(3):
        learner.update()
    state = crossq.critic.state_dict()
    assert state["stacked.input_renorm.steps"].tolist() == [3, 3]
    assert state["stacked.input_renorm.running_mean"].shape == (2, 2, 3)
    assert crossq.actor.state_dict()["stacked.trunk.0.steps"].tolist() == [1, 1]


class PlainCritic(torch.nn.Module):
    num_critics = 2

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return obs[:, :2] + actions


@pytest.mark.parametrize(("critic", "said"), [
    (PlainCritic(), "critic PlainCritic does not say how it normalises"),
    (EnsembleCritic(OBS, ACT, (4,), layer_norm=True),
     "critic EnsembleCritic says normalization = 'layer_norm'"),
])
def test_a_critic_that_does_not_normalise_over_the_batch_is_refused_in_one_line(
        critic: torch.nn.Module, said: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_critic_normalizes(critic)
    message = str(error.value)
    assert "\n" not in message and said in message
    assert message.startswith("--algo crossq needs a critic that normalises over the batch")


@pytest.mark.parametrize(("settings", "line"), [
    ({"algo": "sac", "batch_renorm_warmup": 5},
     "--batch-renorm-warmup is a setting of CrossQ alone, which --algo sac does not read: "
     "leave it out"),
    ({"algo": "td3", "critic_hidden_sizes": (64,)},
     "--critic-hidden-sizes is a setting of CrossQ alone, which --algo td3 does not read: "
     "leave it out"),
])
def test_crossq_settings_are_refused_by_the_other_algorithms(settings: dict, line: str) -> None:
    with pytest.raises(ConfigError, match="^" + line.replace("(", r"\(") + "$"):
        check_settings(Config(**settings))


@pytest.mark.parametrize(("setting", "line"), [
    ({"tau": 0.01}, "--tau is a setting of SAC, TD3 and DDPG alone"),
    ({"target_network_frequency": 2}, "--target-network-frequency is a setting of SAC alone"),
    ({"layer_norm": True}, "--layer-norm is a setting of SAC, TD3 and DDPG alone"),
    ({"critic_atoms": 51, "v_min": -10.0, "v_max": 0.0},
     "--critic-atoms is a setting of SAC, TD3 and DDPG alone"),
])
def test_target_network_layer_norm_and_c51_settings_are_refused_in_one_line(
        setting: dict, line: str) -> None:
    """CrossQ has no target network, normalises by batch renormalisation and its TD target
    reads Q values from the joint forward: each setting of those is one line, from
    wherever it comes (flag, YAML, Config, sweep: all go through check_settings)."""
    with pytest.raises(ConfigError) as error:
        check_settings(Config(algo="crossq", **setting))
    assert str(error.value) == f"{line}, which --algo crossq does not read: leave it out"


def test_td3_and_ddpg_refuse_the_target_network_frequency_they_do_not_read() -> None:
    """They move their targets with each delayed actor update (--policy-frequency)."""
    for algo in ("td3", "ddpg"):
        with pytest.raises(ConfigError, match=f"which --algo {algo} does not read"):
            check_settings(Config(algo=algo, target_network_frequency=2))
    check_settings(Config(algo="sac", target_network_frequency=2))


@pytest.mark.parametrize(("name", "value", "line"), [
    ("batch_renorm_momentum", 0.0, "--batch-renorm-momentum must be in (0, 1], got 0.0"),
    ("batch_renorm_warmup", -1, "--batch-renorm-warmup must be >= 0, got -1"),
    ("critic_hidden_sizes", (0,), "--critic-hidden-sizes must be one or more positive ints "
                                  "(or None: --hidden-sizes), got [0]"),
])
def test_bad_batch_renorm_values_are_one_line(name: str, value: object, line: str) -> None:
    with pytest.raises(ConfigError) as error:
        Config(algo="crossq", **{name: value})
    assert str(error.value) == line
