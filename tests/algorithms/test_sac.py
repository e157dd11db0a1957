"""SAC: its TD target and losses against hand computations, its schedule (the delayed actor,
targets moving by tau on the right updates), its exploration and its learning state."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import CPU, ROWS, FixedActor, LinearCritic, NoisyFixedActor, buffer_of, built_learner

from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.data.rows import RowLayout
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.settings.config import Config

TARGETS = RowLayout.split_targets(ROWS[:, 3:])


def make_sac(actor: torch.nn.Module | None = None, **overrides: object) -> SAC:
    cfg = Config(**{"alpha": 0.5, "gamma": 0.9, "tau": 0.1, "policy_frequency": 2,
                    "batch_size": 2, **overrides})
    return SAC(actor or FixedActor(), LinearCritic(), cfg, action_size=1, device=CPU)


def hand_td_target(row: list[float], alpha: float, gamma: float) -> float:
    _, _, _, reward, not_done, n0, n1 = row
    next_action = math.tanh(0.5 * n0)
    next_log_pi = 0.1 * (n0 + n1) * 0.5
    base = n0 + n1 + next_action
    next_q = min(1.0 * base, 2.0 * base)
    return reward + not_done * gamma * (next_q - alpha * next_log_pi)


def test_td_target_matches_a_hand_computation() -> None:
    target = make_sac().td_target(TARGETS)
    assert target.shape == (2, 1) and not target.requires_grad
    expected = [hand_td_target(row, 0.5, 0.9) for row in ROWS.tolist()]
    assert target[:, 0].tolist() == pytest.approx(expected, rel=1e-6)


def test_critic_loss_matches_a_hand_computation() -> None:
    sac = make_sac()
    q = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    loss, metrics = sac.critic_loss(q, TARGETS)
    targets = [hand_td_target(row, 0.5, 0.9) for row in ROWS.tolist()]
    expected = sum(
        sum((q[b, e].item() - targets[b]) ** 2 for b in range(2)) / 2 for e in range(2)
    )
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics == {}


def hand_actor_terms(alpha: float) -> tuple[list[float], list[float]]:
    actor_terms, alpha_terms = [], []
    for o0, o1 in ROWS[:, :2].tolist():
        action = math.tanh(0.5 * o0)
        log_pi = 0.1 * (o0 + o1) * 0.5
        min_q = min(1.0 * (o0 + o1 + action), 2.0 * (o0 + o1 + action))
        actor_terms.append(alpha * log_pi - min_q)
        alpha_terms.append(-alpha * (log_pi - 1.0))  # target entropy -|A| = -1
    return actor_terms, alpha_terms


def test_actor_loss_matches_a_hand_computation() -> None:
    sac = make_sac()
    obs = ROWS[:, :2]
    loss, metrics = sac.actor_loss(sac.actor(obs), obs)
    actor_terms, alpha_terms = hand_actor_terms(0.5)
    assert set(metrics) == {"losses/actor", "charts/alpha", "losses/alpha"}
    assert metrics["losses/actor"].item() == pytest.approx(sum(actor_terms) / 2, rel=1e-6)
    assert metrics["losses/alpha"].item() == pytest.approx(sum(alpha_terms) / 2, rel=1e-6)
    assert metrics["charts/alpha"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx((sum(actor_terms) + sum(alpha_terms)) / 2, rel=1e-6)


def test_actor_loss_with_a_fixed_temperature_has_no_temperature_loss() -> None:
    sac = make_sac(autotune=False)
    obs = ROWS[:, :2]
    loss, metrics = sac.actor_loss(sac.actor(obs), obs)
    actor_terms, _ = hand_actor_terms(0.5)
    assert set(metrics) == {"losses/actor", "charts/alpha"}
    assert loss.item() == pytest.approx(sum(actor_terms) / 2, rel=1e-6)
    assert not sac.log_alpha.requires_grad


def test_the_schedule_compensates_the_delay_and_repeats_with_both_frequencies() -> None:
    sac = make_sac(policy_frequency=2, target_network_frequency=3)
    assert [sac.actor_steps(u) for u in range(6)] == [2, 0, 2, 0, 2, 0]
    assert sac.update_period() == 6
    assert make_sac(policy_frequency=1).update_period() == 1


def test_update_moves_the_target_by_tau_and_delays_the_actor() -> None:
    sac, sums = make_sac(autotune=True), MetricSums()
    learner = built_learner(sac, buffer_of(ROWS), sums)
    target_before = sac.target_critic.c.detach().clone()
    actor_before = sac.actor.w.detach().clone()
    log_alpha_before = sac.log_alpha.detach().clone()
    learner.update()
    # target <- 0.9 target + 0.1 critic (after the critic's update)
    torch.testing.assert_close(sac.target_critic.c, 0.9 * target_before + 0.1 * sac.critic.c)
    actor_state = learner.actor_optimizer.state
    assert actor_state[sac.actor.w]["step"].item() == 2  # 2 delayed updates
    assert not torch.equal(sac.actor.w, actor_before)
    assert not torch.equal(sac.log_alpha, log_alpha_before)
    assert set(sums.take()) == {"losses/critic", "losses/critic_grad_norm", "losses/actor",
                                "losses/actor_grad_norm", "charts/alpha", "losses/alpha"}
    learner.update()  # second update: critic only
    assert set(sums.take()) == {"losses/critic", "losses/critic_grad_norm"}
    assert actor_state[sac.actor.w]["step"].item() == 2
    assert learner.critic_optimizer.state[sac.critic.c]["step"].item() == 2


def test_the_target_moves_on_every_target_network_frequency_th_update_only() -> None:
    sac = make_sac(policy_frequency=1, target_network_frequency=3)
    learner = built_learner(sac, buffer_of(ROWS))
    moved = []
    for _ in range(7):
        before = sac.target_critic.c.detach().clone()
        learner.update()
        moved.append(not torch.equal(sac.target_critic.c, before))
        if moved[-1]:
            torch.testing.assert_close(sac.target_critic.c, 0.9 * before + 0.1 * sac.critic.c)
    assert moved == [True, False, False, True, False, False, True]


def test_fixed_temperature_is_not_learned() -> None:
    sac = make_sac(autotune=False)
    learner = built_learner(sac, buffer_of(ROWS))
    learner.update()
    assert sac.alpha.item() == pytest.approx(0.5)
    assert len(learner.actor_optimizer.param_groups) == 1
    assert len(make_sac(autotune=True).actor_parameter_groups()) == 2


def test_exploration_samples_the_policy_with_the_noise_it_is_given() -> None:
    sac = make_sac(NoisyFixedActor())
    observations, noise = torch.randn(50, 2), torch.randn(50, 1)
    assert sac.exploration_noise_size() == 1
    want = torch.tanh(0.5 * observations[:, :1] + noise)
    assert torch.equal(sac.explore(sac.actor, observations, noise), want)
    torch.manual_seed(2)
    drawn = sac.explore(sac.actor, observations)
    torch.manual_seed(2)
    assert torch.equal(drawn, sac.explore(sac.actor, observations, torch.randn(50, 1)))


def test_an_actor_without_sample_explores_with_its_forward_and_draws_on_the_device() -> None:
    sac = make_sac()  # FixedActor has no sample
    assert sac.exploration_noise_size() == 0
    observations = torch.randn(5, 2)
    assert torch.equal(sac.explore(sac.actor, observations), sac.actor(observations)[0])


def test_the_learning_state_is_the_target_critic_and_the_temperature() -> None:
    sac = make_sac()
    state = sac.learning_state()
    assert set(state) == {"target_critic", "log_alpha"}
    assert state["target_critic"] is sac.target_critic and state["log_alpha"] is sac.log_alpha
    assert sac.log_alpha.item() == pytest.approx(math.log(0.5))
    assert sac.target_entropy.item() == -1.0


class AnyShapeActor(FixedActor):
    """FixedActor on inputs with any leading dimensions (a seed dimension too)."""

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.w * obs[..., :1]), 0.1 * obs.sum(-1) * self.w


class AnyShapeCritic(LinearCritic):
    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return (obs.sum(-1, keepdim=True) + act.sum(-1, keepdim=True)) * self.c


def seed_rows() -> torch.Tensor:
    """(2 seeds, 2 rows, 7): seed 0's rows are ROWS, seed 1's are other values."""
    return torch.stack([ROWS, ROWS.flip(0) * torch.tensor([0.5, -1.0, 0.3, 2.0, 1.0, -0.7, 0.9])])


def test_with_seeds_every_loss_is_per_seed_and_each_equals_that_seed_alone() -> None:
    """Two seeds with their own temperature: the losses come back (2,), and entry k is the
    loss a single run with seed k's temperature computes on seed k's rows."""
    cfg = Config(alpha=0.5, gamma=0.9, batch_size=2)
    group = SAC(AnyShapeActor(), AnyShapeCritic(), cfg, action_size=1, device=CPU, seeds=2)
    assert group.log_alpha.shape == (2,)
    with torch.no_grad():
        group.log_alpha[1] = math.log(0.2)
    rows = seed_rows()
    targets = RowLayout.split_targets(rows[..., 3:])
    q = torch.tensor([[[1.0, 2.0], [0.0, -1.0]], [[0.5, 0.1], [-2.0, 3.0]]])
    critic_loss, _ = group.critic_loss(q, targets)
    actions, log_pi = group.actor(rows[..., :2])
    actor_loss, metrics = group.actor_loss((actions, log_pi), rows[..., :2])
    assert critic_loss.shape == actor_loss.shape == metrics["losses/alpha"].shape == (2,)
    for k, alpha in enumerate((0.5, 0.2)):
        alone = make_sac(AnyShapeActor(), alpha=alpha)
        alone.critic, alone.target_critic = AnyShapeCritic(), AnyShapeCritic()
        seed_targets = RowLayout.split_targets(rows[k, :, 3:])
        assert torch.equal(alone.td_target(seed_targets), group.td_target(targets)[k])
        assert torch.equal(alone.critic_loss(q[k], seed_targets)[0], critic_loss[k])
        seed_actions, seed_log_pi = alone.actor(rows[k, :, :2])
        loss, seed_metrics = alone.actor_loss((seed_actions, seed_log_pi), rows[k, :, :2])
        assert torch.allclose(loss, actor_loss[k], rtol=1e-6, atol=1e-7)
        for name, value in seed_metrics.items():
            assert torch.allclose(value, metrics[name][k], rtol=1e-6, atol=1e-7), name
