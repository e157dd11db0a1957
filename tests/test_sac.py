"""SAC losses against a hand-computed case, and the update's bookkeeping, on the CPU."""

from __future__ import annotations

import math

import pytest
import torch
from fakes import ROWS, FixedActor, LinearCritic

from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.config import Config


def make_sac(**overrides: object) -> SAC:
    cfg = Config(**{"alpha": 0.5, "gamma": 0.9, "tau": 0.1, "policy_frequency": 2, **overrides})
    return SAC(FixedActor(), LinearCritic(), cfg, observation_size=2, action_size=1,
               device=torch.device("cpu"))


def hand_td_target(row: list[float], alpha: float, gamma: float) -> float:
    _, _, _, reward, not_done, n0, n1 = row
    next_action = math.tanh(0.5 * n0)
    next_log_pi = 0.1 * (n0 + n1) * 0.5
    base = n0 + n1 + next_action
    next_q = min(1.0 * base, 2.0 * base)
    return reward + not_done * gamma * (next_q - alpha * next_log_pi)


def test_critic_loss_matches_a_hand_computation() -> None:
    sac = make_sac()
    q = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    loss = sac.critic_loss(q, ROWS[:, 3:])
    targets = [hand_td_target(row, 0.5, 0.9) for row in ROWS.tolist()]
    expected = sum(
        sum((q[b, e].item() - targets[b]) ** 2 for b in range(2)) / 2 for e in range(2)
    )
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_actor_loss_matches_a_hand_computation() -> None:
    sac = make_sac()
    obs = ROWS[:, :2]
    loss = sac.actor_loss(sac.actor(obs), obs)
    actor_terms, alpha_terms = [], []
    for o0, o1 in obs.tolist():
        action = math.tanh(0.5 * o0)
        log_pi = 0.1 * (o0 + o1) * 0.5
        min_q = min(1.0 * (o0 + o1 + action), 2.0 * (o0 + o1 + action))
        actor_terms.append(0.5 * log_pi - min_q)
        alpha_terms.append(-0.5 * (log_pi - 1.0))  # target entropy -|A| = -1
    assert sac.actor_loss_value.item() == pytest.approx(sum(actor_terms) / 2, rel=1e-6)
    assert sac.alpha_loss_value.item() == pytest.approx(sum(alpha_terms) / 2, rel=1e-6)
    assert loss.item() == pytest.approx((sum(actor_terms) + sum(alpha_terms)) / 2, rel=1e-6)


def test_update_moves_the_target_by_tau_and_delays_the_actor() -> None:
    sac = make_sac(autotune=True)
    target_before = sac.target_critic.c.detach().clone()
    actor_before = sac.actor.w.detach().clone()
    log_alpha_before = sac.log_alpha.detach().clone()
    metrics = sac.update(ROWS)
    # target <- 0.9 target + 0.1 critic (after the critic's update)
    torch.testing.assert_close(sac.target_critic.c, 0.9 * target_before + 0.1 * sac.critic.c)
    assert sac.actor_optimizer.state[sac.actor.w]["step"].item() == 2  # 2 delayed updates
    assert not torch.equal(sac.actor.w, actor_before)
    assert not torch.equal(sac.log_alpha, log_alpha_before)
    assert set(metrics) == {"losses/critic", "losses/critic_grad_norm", "losses/actor",
                            "losses/actor_grad_norm", "charts/alpha", "losses/alpha"}
    metrics = sac.update(ROWS)  # second update: critic only
    assert "losses/actor" not in metrics
    assert sac.actor_optimizer.state[sac.actor.w]["step"].item() == 2
    assert sac.critic_optimizer.state[sac.critic.c]["step"].item() == 2


def test_fixed_temperature_is_not_learned() -> None:
    sac = make_sac(autotune=False)
    sac.update(ROWS)
    assert sac.alpha.item() == pytest.approx(0.5)
    assert len(sac.actor_optimizer.param_groups) == 1


def test_critic_gets_no_gradient_from_the_actor_update() -> None:
    sac = make_sac()
    sac.update(ROWS)
    critic_grad = sac.critic.c.grad.clone()
    sac.actor_step(ROWS[:, :2], ROWS[:, :2])
    assert torch.equal(sac.critic.c.grad, critic_grad)
