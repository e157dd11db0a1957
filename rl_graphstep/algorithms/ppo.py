"""Proximal policy optimisation (Schulman et al., 2017) as CleanRL's ppo_continuous_action.py
and ppo.py write it: the clipped surrogate, the (optionally clipped) value loss, the entropy
bonus, advantages normalised per minibatch, the learning rate annealed over the rollouts.

The actor and the critic are separate networks with separate losses, each stepped by its own
optimizer and clip (the on-policy learner's job, ``rl_graphstep.learners.onpolicy``). CleanRL
sums ``pg_loss - ent_coef * entropy + vf_coef * v_loss`` into one loss over one optimizer;
since the policy and entropy terms reach only the actor and the value term only the critic,
each network's gradient is the same here, and ``vf_coef`` scales the critic's loss.

Every loss takes the minibatch on its last dimension and a leading seed dimension when K > 1,
reducing over the minibatch alone: a scalar for one seed, (K,) for K (each seed's gradient
is then its own).
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import Metrics
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data.normalizer import CLEANRL_FORM, NormalizationForm
from rl_graphstep.data.rollout import PolicyTargets, ValueTargets
from rl_graphstep.networks.policies import CategoricalActor, GaussianActor, ValueNetwork
from rl_graphstep.settings.config import Config


def check_ppo_config(cfg: Config) -> None:
    """One ConfigError line where PPO's settings cannot make fixed-size minibatches or a
    single rollout."""
    batch = cfg.num_envs * cfg.num_steps
    if batch % cfg.num_minibatches:
        raise ConfigError(
            f"--num-minibatches {cfg.num_minibatches} does not divide a rollout of --num-envs "
            f"{cfg.num_envs} x --num-steps {cfg.num_steps} = {batch} steps: every minibatch "
            "has one fixed size; choose a divisor of it")
    if cfg.total_timesteps < batch:
        raise ConfigError(
            f"--total-timesteps {cfg.total_timesteps} is below one rollout of --num-envs "
            f"{cfg.num_envs} x --num-steps {cfg.num_steps} = {batch} steps: the run would end "
            "before its first update; raise --total-timesteps or lower --num-steps")


class PPO:
    """PPO's losses and schedule.

    Args:
        actor: a PPO actor (``networks.policies``' protocol), K seeds stacked when K > 1.
        critic: a value network, observations (…, B, O) to values (…, B, 1).
        cfg: clip_coef, clip_vloss, norm_adv, ent_coef, vf_coef, learning_rate, anneal_lr and
            the rollout's size.
        device: where the networks live.
        seeds: K.
    """

    name: ClassVar[str] = "ppo"
    # How --obs-norm normalises: CleanRL's form, clipped to +-10 (see data.normalizer).
    observation_form: ClassVar[NormalizationForm] = CLEANRL_FORM

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 device: torch.device, seeds: int = 1) -> None:
        check_ppo_config(cfg)
        self.cfg = cfg
        self.seeds = seeds
        self.actor = actor.to(device)
        self.critic = critic.to(device)
        # CleanRL's num_iterations: the rollouts of the run, over which the rate anneals.
        self.num_iterations = cfg.total_timesteps // (cfg.num_envs * cfg.num_steps)

    @classmethod
    def default_actor(cls, observation_space: gym.Space, action_space: gym.Space,
                      cfg: Config) -> nn.Module:
        """A Gaussian actor for a Box action space, a categorical one for a Discrete one."""
        if isinstance(action_space, gym.spaces.Discrete):
            return CategoricalActor(observation_space, action_space, cfg.hidden_sizes)
        return GaussianActor(observation_space, action_space, cfg.hidden_sizes)

    @classmethod
    def default_critic(cls, observation_space: gym.Space, action_space: gym.Space,
                       cfg: Config) -> nn.Module:
        return ValueNetwork(observation_space, action_space, hidden_sizes=cfg.hidden_sizes)

    # ------------------------------------------------------------------ the losses

    def normalized(self, advantages: Tensor) -> Tensor:
        """(A - mean) / (std + 1e-8) over the minibatch (per seed), the sample std as
        CleanRL's ``.std()``."""
        mean = advantages.mean(dim=-1, keepdim=True)
        return (advantages - mean) / (advantages.std(dim=-1, keepdim=True) + 1e-8)

    def policy_loss(self, prediction: tuple[Tensor, Tensor], targets: PolicyTargets
                    ) -> tuple[Tensor, Metrics]:
        """The clipped surrogate minus ``ent_coef`` times the entropy.

        ``prediction``: the actor's (log-probabilities, entropies) of the rollout's actions,
        each (…, M). With r = pi(a|s) / pi_old(a|s) and A the (normalised) advantages:
        ``mean(max(-A r, -A clip(r, 1 - eps, 1 + eps)))``. The metrics are CleanRL's:
        approx_kl = mean((r - 1) - log r), old_approx_kl = mean(-log r), clipfrac = the
        fraction with |r - 1| > eps.
        """
        new_log_probs, entropy = prediction
        eps = self.cfg.clip_coef
        log_ratio = new_log_probs - targets.log_probs
        ratio = log_ratio.exp()
        with torch.no_grad():
            old_approx_kl = (-log_ratio).mean(dim=-1)
            approx_kl = ((ratio - 1) - log_ratio).mean(dim=-1)
            clipfrac = ((ratio - 1).abs() > eps).float().mean(dim=-1)
        advantages = targets.advantages
        if self.cfg.norm_adv:
            advantages = self.normalized(advantages)
        pg_loss = torch.max(-advantages * ratio,
                            -advantages * torch.clamp(ratio, 1 - eps, 1 + eps)).mean(dim=-1)
        entropy_loss = entropy.mean(dim=-1)
        loss = pg_loss - self.cfg.ent_coef * entropy_loss
        return loss, {"losses/policy_loss": pg_loss, "losses/entropy": entropy_loss,
                      "losses/old_approx_kl": old_approx_kl, "losses/approx_kl": approx_kl,
                      "losses/clipfrac": clipfrac}

    def value_loss(self, new_values: Tensor, targets: ValueTargets) -> tuple[Tensor, Metrics]:
        """``vf_coef`` times 0.5 mean((V - R)^2), or with ``clip_vloss`` 0.5 mean(max((V - R)^2,
        (V_clipped - R)^2)) where V_clipped = V_old + clip(V - V_old, -eps, eps).
        ``new_values``: the critic's (…, M, 1); logged is the loss before ``vf_coef``, as
        CleanRL logs it."""
        values = new_values.squeeze(-1)
        squared_error = (values - targets.returns).pow(2)
        if self.cfg.clip_vloss:
            eps = self.cfg.clip_coef
            clipped = targets.values + torch.clamp(values - targets.values, -eps, eps)
            squared_error = torch.max(squared_error, (clipped - targets.returns).pow(2))
        v_loss = 0.5 * squared_error.mean(dim=-1)
        return self.cfg.vf_coef * v_loss, {"losses/value_loss": v_loss}

    @staticmethod
    @torch.no_grad()
    def explained_variance(values: Tensor, returns: Tensor) -> Tensor:
        """CleanRL's diagnostic of the critic, once per rollout: 1 - Var(R - V) / Var(R) over
        the last dimension (population variances, as numpy's), NaN where the returns do not
        vary; on the device, one value per seed."""
        var_returns = returns.var(dim=-1, correction=0)
        unexplained = (returns - values).var(dim=-1, correction=0)
        return torch.where(var_returns == 0, torch.full_like(var_returns, torch.nan),
                           1 - unexplained / var_returns)

    # ------------------------------------------------------------------ the schedule

    def learning_rate(self, update: int) -> float:
        """The rate of rollout number ``update`` (from 0): ``learning_rate`` annealed linearly,
        CleanRL's ``(1 - (iteration - 1) / num_iterations) * learning_rate``, or constant."""
        if not self.cfg.anneal_lr:
            return self.cfg.learning_rate
        return (1.0 - update / self.num_iterations) * self.cfg.learning_rate
