"""TD3 (Fujimoto et al., 2018): clipped double Q, target policy smoothing, delayed actor and
target updates, Gaussian exploration."""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import Metrics, OffPolicyAlgorithm
from rl_graphstep.algorithms.targets import PolyakAverage
from rl_graphstep.networks.builtin import DeterministicActor
from rl_graphstep.settings.config import Config


class TD3(OffPolicyAlgorithm):
    """Twin delayed deep deterministic policy gradient.

    Args:
        actor: maps observations (B, O) to a deterministic action in [-1, 1] (B, A).
        critic: maps (observations, actions) to Q values (B, E), E >= 2 for clipped double Q
            (distributional: logits (B, E, atoms)).
        cfg: ``policy_frequency`` is the policy delay, ``policy_noise``/``noise_clip`` the
            target smoothing, ``exploration_noise`` the std of the behaviour noise (all in
            [-1, 1] action units).
        action_size, device: as for :class:`SAC`.
    """

    name = "td3"
    actor_kind = "deterministic"
    target_smoothing = True

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 action_size: int, device: torch.device, seeds: int = 1) -> None:
        super().__init__(actor, critic, cfg, action_size=action_size, device=device,
                         seeds=seeds)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.polyak = PolyakAverage(
            [(self.target_actor, self.actor), (self.target_critic, self.critic)], cfg.tau)

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        return DeterministicActor(observation_space, action_space, cfg.hidden_sizes,
                                  layer_norm=cfg.layer_norm)

    def target_actions(self, next_observations: Tensor) -> Tensor:
        """The target policy's action, smoothed with clipped noise (drawn on the device)."""
        actions = self.target_actor(next_observations)
        if not self.target_smoothing:
            return actions
        noise = (torch.randn_like(actions) * self.cfg.policy_noise).clamp(
            -self.cfg.noise_clip, self.cfg.noise_clip)
        return (actions + noise).clamp(-1.0, 1.0)

    @torch.no_grad()
    def next_actions(self, next_observations: Tensor) -> tuple[Tensor, None]:
        """The smoothed target action a': the target is r + gamma (1 - d) min_i
        Q_target_i(s', a')."""
        return self.target_actions(next_observations), None

    def actor_loss(self, actions: Tensor, observations: Tensor) -> tuple[Tensor, Metrics]:
        """``-Q_1(s, pi(s))``: the first critic only, as published (its expected value,
        distributional)."""
        loss = -self.batch_mean(self.frozen_critic(observations, actions)[..., 0])
        return loss, {"losses/actor": loss}

    def actor_steps(self, update: int) -> int:
        """One actor step every ``policy_frequency`` critic steps (the policy delay)."""
        return 1 if update % self.cfg.policy_frequency == 0 else 0

    def after_actor_steps(self, update: int) -> None:
        """The targets move with each delayed actor step."""
        self.polyak()

    def learning_state(self) -> dict[str, nn.Module | Tensor]:
        return {**super().learning_state(), "target_actor": self.target_actor}

    @torch.no_grad()
    def explore(self, actor: nn.Module, observations: Tensor, noise: Tensor | None = None
                ) -> Tensor:
        """The policy's action plus Gaussian noise (``noise`` where given, a standard normal
        draw, scaled by ``exploration_noise``), clipped to [-1, 1]."""
        actions = actor(observations)
        if noise is None:
            noise = torch.randn_like(actions)
        return (actions + noise * self.cfg.exploration_noise).clamp(-1.0, 1.0)

    def exploration_noise_size(self) -> int:
        return self.action_size
