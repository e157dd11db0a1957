"""Soft actor-critic (Haarnoja et al., 2018): twin critics, a squashed-Gaussian actor and an
automatically tuned entropy temperature, with CleanRL's delayed actor.

The temperature and the target entropy are device tensors, so a captured update reads their
current values on every replay.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import Metrics, OffPolicyAlgorithm
from rl_graphstep.algorithms.targets import PolyakAverage
from rl_graphstep.networks.builtin import SquashedGaussianActor
from rl_graphstep.settings.config import Config


class SAC(OffPolicyAlgorithm):
    """Soft actor-critic.

    Args:
        actor: maps observations (B, O) to an action in [-1, 1] (B, A) and its log-probability
            (B,), drawing its noise on the device.
        critic: maps (observations, actions) to one Q value per ensemble member, (B, E)
            (distributional: logits (B, E, atoms)).
        cfg: gamma, tau, learning rates, frequencies, alpha and autotune.
        action_size: A; the target entropy is -A.
        device: where the networks and the temperature live.
    """

    name = "sac"
    actor_kind = "stochastic"

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 action_size: int, device: torch.device, seeds: int = 1) -> None:
        super().__init__(actor, critic, cfg, action_size=action_size, device=device,
                         seeds=seeds)
        self.log_alpha = torch.full(self.seed_shape, math.log(cfg.alpha), device=device,
                                    requires_grad=cfg.autotune)
        self.target_entropy = torch.full((), -float(action_size), device=device)
        self.polyak = (PolyakAverage([(self.target_critic, self.critic)], cfg.tau)
                       if self.target_critic is not None else None)

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        return SquashedGaussianActor(observation_space, action_space, cfg.hidden_sizes,
                                     layer_norm=cfg.layer_norm)

    def actor_parameter_groups(self) -> list[dict[str, Any]]:
        """The actor at ``policy_lr`` and, with autotune, the temperature at ``q_lr``
        (CleanRL's)."""
        groups = super().actor_parameter_groups()
        if self.cfg.autotune:
            # Never decayed (--weight-decay): the temperature is no network weight, and
            # AdamW's decay would pull log(alpha) towards 0, alpha towards 1.
            groups.append({"params": [self.log_alpha], "lr": self.cfg.q_lr,
                           "weight_decay": 0.0})
        return groups

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()

    @torch.no_grad()
    def next_actions(self, next_observations: Tensor) -> tuple[Tensor, Tensor]:
        """a' ~ pi(s') and the entropy term ``alpha log pi(a'|s')`` (B, 1): the soft value
        is ``min_i Q_target_i(s', a') - alpha log pi(a'|s')``."""
        next_actions, next_log_pi = self.actor(next_observations)
        next_log_pi = next_log_pi.unsqueeze(-1)
        return next_actions, self.per_seed(self.alpha, next_log_pi) * next_log_pi

    def actor_loss(self, prediction: tuple[Tensor, Tensor], observations: Tensor
                   ) -> tuple[Tensor, Metrics]:
        """``alpha log pi - min Q`` (expected values of a distributional critic) plus, with
        autotune, the temperature loss
        ``-log_alpha.exp() (log pi + target entropy)``."""
        actions, log_pi = prediction
        min_q = self.frozen_critic(observations, actions).min(dim=-1).values
        alpha = self.alpha
        actor_loss = self.batch_mean(self.per_seed(alpha, log_pi) * log_pi - min_q)
        metrics = {"losses/actor": actor_loss, "charts/alpha": alpha}
        if not self.cfg.autotune:
            return actor_loss, metrics
        alpha_loss = self.batch_mean(-self.per_seed(self.log_alpha.exp(), log_pi)
                                     * (log_pi.detach() + self.target_entropy))
        return actor_loss + alpha_loss, {**metrics, "losses/alpha": alpha_loss}

    def actor_steps(self, update: int) -> int:
        """CleanRL's compensation for the delay: ``policy_frequency`` actor steps every
        ``policy_frequency`` critic steps."""
        frequency = self.cfg.policy_frequency
        return frequency if update % frequency == 0 else 0

    def after_critic_step(self, update: int) -> None:
        if self.polyak is not None and update % self.cfg.target_network_frequency == 0:
            self.polyak()

    def update_period(self) -> int:
        return math.lcm(self.cfg.policy_frequency, self.cfg.target_network_frequency)

    def learning_state(self) -> dict[str, nn.Module | Tensor]:
        return {**super().learning_state(), "log_alpha": self.log_alpha}

    @torch.no_grad()
    def after_load(self) -> None:
        """Without autotune the temperature is ``--alpha``, not the checkpoint's: a resume
        may change it."""
        if not self.cfg.autotune:
            self.log_alpha.fill_(math.log(self.cfg.alpha))

    @torch.no_grad()
    def explore(self, actor: nn.Module, observations: Tensor, noise: Tensor | None = None
                ) -> Tensor:
        """A sample of the policy (the actor's ``sample`` where it has one: the same draw
        without the log-probability's kernels), with ``noise`` as its standard normal draw
        where given."""
        if noise is not None:
            return actor.sample(observations, noise=noise)
        sample = getattr(actor, "sample", None)
        if callable(sample):
            return sample(observations)
        actions, _ = actor(observations)
        return actions

    def exploration_noise_size(self) -> int:
        """The action size where the actor's ``sample`` takes a ``noise`` argument."""
        sample = getattr(self.actor, "sample", None)
        try:
            takes_noise = callable(sample) and "noise" in inspect.signature(sample).parameters
        except (TypeError, ValueError):  # no signature to read
            takes_noise = False
        return self.action_size if takes_noise else 0
