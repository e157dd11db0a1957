"""TD3 and DDPG: TD targets and losses against hand computations, their delayed actor and
target schedule, exploration, and the algorithm registry."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import CPU, ROWS, FixedDeterministicActor, LinearCritic, buffer_of, built_learner

from rl_graphstep.algorithms import ALGORITHMS, DDPG, SAC, TD3, algorithm_class, check_algorithm
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data.rows import RowLayout
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.flags import build_parser
from rl_graphstep.settings.config import Config

TARGETS = RowLayout.split_targets(ROWS[:, 3:])


def make(kind: type[TD3], members: int, **overrides: object) -> TD3:
    cfg = Config(**{"algo": kind.name, "gamma": 0.9, "tau": 0.1, "policy_frequency": 2,
                    "batch_size": 2, **overrides})
    return kind(FixedDeterministicActor(), LinearCritic(members), cfg, action_size=1,
                device=CPU)


def hand_td_target(row: list[float], noise: float, members: int, gamma: float = 0.9) -> float:
    _, _, _, reward, not_done, n0, n1 = row
    action = min(1.0, max(-1.0, math.tanh(0.5 * n0) + noise))
    base = n0 + n1 + action
    next_q = min(c * base for c in range(1, members + 1))
    return reward + not_done * gamma * next_q


def critic_loss_by_hand(q: torch.Tensor, targets: list[float]) -> float:
    members = q.shape[1]
    return sum(sum((q[b, e].item() - targets[b]) ** 2 for b in range(2)) / 2
               for e in range(members))


def test_td3_critic_loss_with_clipped_smoothing_noise() -> None:
    td3 = make(TD3, 2, policy_noise=0.4, noise_clip=0.3)
    q = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    torch.manual_seed(0)
    loss, metrics = td3.critic_loss(q, TARGETS)
    torch.manual_seed(0)
    noise = (torch.randn(2, 1) * 0.4).clamp(-0.3, 0.3)[:, 0].tolist()
    assert noise[0] == pytest.approx(0.3) and abs(noise[1]) < 0.3  # the clip binds once
    targets = [hand_td_target(row, n, 2) for row, n in zip(ROWS.tolist(), noise, strict=True)]
    assert loss.item() == pytest.approx(critic_loss_by_hand(q, targets), rel=1e-6)
    assert metrics == {}
    torch.manual_seed(0)
    assert td3.td_target(TARGETS)[:, 0].tolist() == pytest.approx(targets, rel=1e-6)


def test_ddpg_critic_loss_has_no_smoothing_and_one_critic() -> None:
    ddpg = make(DDPG, 1, policy_noise=0.4)
    q = torch.tensor([[1.0], [0.0]])
    loss, _ = ddpg.critic_loss(q, TARGETS)
    targets = [hand_td_target(row, 0.0, 1) for row in ROWS.tolist()]
    assert loss.item() == pytest.approx(critic_loss_by_hand(q, targets), rel=1e-6)
    assert ddpg.td_target(TARGETS)[:, 0].tolist() == pytest.approx(targets, rel=1e-6)


@pytest.mark.parametrize(("kind", "members"), [(TD3, 2), (DDPG, 1)])
def test_actor_loss_uses_the_first_critic(kind: type[TD3], members: int) -> None:
    agent = make(kind, members)
    obs = ROWS[:, :2]
    loss, metrics = agent.actor_loss(agent.actor(obs), obs)
    expected = -sum(o0 + o1 + math.tanh(0.5 * o0) for o0, o1 in obs.tolist()) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert set(metrics) == {"losses/actor"}
    assert metrics["losses/actor"].item() == pytest.approx(expected, rel=1e-6)


def test_the_schedule_is_one_actor_step_every_policy_frequency_updates() -> None:
    td3 = make(TD3, 2, policy_frequency=3)
    assert [td3.actor_steps(u) for u in range(7)] == [1, 0, 0, 1, 0, 0, 1]
    assert td3.update_period() == 3


@pytest.mark.parametrize(("kind", "members"), [(TD3, 2), (DDPG, 1)])
def test_actor_and_targets_update_on_the_delay(kind: type[TD3], members: int) -> None:
    agent, sums = make(kind, members), MetricSums()
    learner = built_learner(agent, buffer_of(ROWS), sums)
    target_actor = agent.target_actor.w.detach().clone()
    target_critic = agent.target_critic.c.detach().clone()
    learner.update()  # update 0: critic, actor once, then both targets
    assert learner.actor_optimizer.state[agent.actor.w]["step"].item() == 1
    torch.testing.assert_close(agent.target_actor.w, 0.9 * target_actor + 0.1 * agent.actor.w)
    torch.testing.assert_close(agent.target_critic.c, 0.9 * target_critic + 0.1 * agent.critic.c)
    assert set(sums.take()) == {"losses/critic", "losses/critic_grad_norm", "losses/actor",
                                "losses/actor_grad_norm"}
    targets_after_first = (agent.target_actor.w.clone(), agent.target_critic.c.clone())
    learner.update()  # update 1: critic only, targets untouched
    assert set(sums.take()) == {"losses/critic", "losses/critic_grad_norm"}
    assert learner.actor_optimizer.state[agent.actor.w]["step"].item() == 1
    assert torch.equal(agent.target_actor.w, targets_after_first[0])
    assert torch.equal(agent.target_critic.c, targets_after_first[1])


def test_exploration_noise_is_clipped_to_the_action_range() -> None:
    td3 = make(TD3, 2, exploration_noise=5.0)
    actions = td3.explore(td3.actor, torch.randn(1000, 2))
    assert actions.abs().max() <= 1.0
    assert actions.std() > 0.5  # the noise is really there


@pytest.mark.parametrize("kind", [TD3, DDPG])
def test_exploration_takes_the_standard_normal_noise_it_is_given(kind: type[TD3]) -> None:
    agent = make(kind, 2, exploration_noise=0.3)
    observations, noise = torch.randn(50, 2), torch.randn(50, 1)
    assert agent.exploration_noise_size() == 1
    want = (agent.actor(observations) + noise * 0.3).clamp(-1.0, 1.0)
    assert torch.equal(agent.explore(agent.actor, observations, noise), want)
    torch.manual_seed(2)
    drawn = agent.explore(agent.actor, observations)
    torch.manual_seed(2)
    assert torch.equal(drawn, agent.explore(agent.actor, observations, torch.randn(50, 1)))


def test_exploration_acts_with_the_actor_it_is_given() -> None:
    """The copy that acts beside the updates, not the learned actor."""
    agent = make(TD3, 2, exploration_noise=0.3)
    other = FixedDeterministicActor()
    with torch.no_grad():
        other.w.fill_(-2.0)
    observations, noise = torch.randn(20, 2), torch.randn(20, 1)
    want = (other(observations) + noise * 0.3).clamp(-1.0, 1.0)
    assert torch.equal(agent.explore(other, observations, noise), want)


@pytest.mark.parametrize(("kind", "members"), [(TD3, 2), (DDPG, 1)])
def test_the_learning_state_is_both_targets(kind: type[TD3], members: int) -> None:
    agent = make(kind, members)
    state = agent.learning_state()
    assert set(state) == {"target_critic", "target_actor"}
    assert state["target_actor"] is agent.target_actor
    assert not any(p.requires_grad for p in agent.target_actor.parameters())


def test_every_algorithm_is_an_algo_choice_and_another_name_is_one_line() -> None:
    algo_flag = next(a for a in build_parser()._actions if a.dest == "algo")
    assert algo_flag.metavar == "{sac,td3,ddpg,crossq,ppo}"
    assert algo_flag.help.startswith("algorithm, one of sac, td3, ddpg, crossq, ppo (")
    assert algorithm_class("td3") is TD3
    for name, source, line in [
            ("a2c", None, "--algo must be one of sac, td3, ddpg, crossq, ppo, got 'a2c'"),
            ("SAC", "config file 'a.yaml'",
             "algo must be one of sac, td3, ddpg, crossq, ppo, got 'SAC' in config file 'a.yaml'")]:
        with pytest.raises(ConfigError) as err:
            check_algorithm(name, source)
        assert str(err.value) == line
    assert {name: cls.name for name, cls in ALGORITHMS.items()} == {n: n for n in ALGORITHMS}
    assert (ALGORITHMS["sac"], ALGORITHMS["td3"], ALGORITHMS["ddpg"]) == (SAC, TD3, DDPG)
    assert [cls.num_critics for cls in (SAC, TD3, DDPG)] == [2, 2, 1]


def test_with_seeds_the_losses_are_per_seed_and_each_equals_that_seed_alone() -> None:
    """Two seeds' batches at once: entry k of each loss is what a single run computes on seed
    k's rows (no smoothing noise, so the targets are deterministic)."""

    class AnyShapeActor(FixedDeterministicActor):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.w * obs[..., :1])

    class AnyShapeCritic(LinearCritic):
        def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
            return (obs.sum(-1, keepdim=True) + act.sum(-1, keepdim=True)) * self.c

    cfg = Config(algo="ddpg", gamma=0.9)
    group = DDPG(AnyShapeActor(), AnyShapeCritic(1), cfg, action_size=1, device=CPU, seeds=2)
    rows = torch.stack([ROWS, ROWS * 0.5 - 1.0])
    targets = RowLayout.split_targets(rows[..., 3:])
    q = torch.tensor([[[1.0], [0.0]], [[0.5], [-2.0]]])
    critic_loss, _ = group.critic_loss(q, targets)
    actor_loss, _ = group.actor_loss(group.actor(rows[..., :2]), rows[..., :2])
    assert critic_loss.shape == actor_loss.shape == (2,)
    for k in range(2):
        alone = DDPG(AnyShapeActor(), AnyShapeCritic(1), cfg, action_size=1, device=CPU)
        seed_targets = RowLayout.split_targets(rows[k, :, 3:])
        assert torch.equal(alone.critic_loss(q[k], seed_targets)[0], critic_loss[k])
        loss, _ = alone.actor_loss(alone.actor(rows[k, :, :2]), rows[k, :, :2])
        assert torch.equal(loss, actor_loss[k])
