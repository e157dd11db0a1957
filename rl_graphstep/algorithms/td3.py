"""TD3 (Fujimoto et al., 2018): clipped double Q, target policy smoothing, delayed actor and
target updates, Gaussian exploration."""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import ActorCritic, PolyakAverage
from rl_graphstep.buffer import split_targets
from rl_graphstep.config import Config
from rl_graphstep.networks import DeterministicActor


class TD3(ActorCritic):
    """Twin delayed deep deterministic policy gradient.

    Args:
        actor: maps observations (B, O) to a deterministic action in [-1, 1] (B, A).
        critic: maps (observations, actions) to Q values (B, E), E >= 2 for clipped double Q.
        cfg: the run configuration; ``policy_frequency`` is the policy delay,
            ``policy_noise``/``noise_clip`` the target smoothing, ``exploration_noise`` the
            std of the behaviour noise (all in [-1, 1] action units).
        observation_size, action_size, device, use_graph: as for :class:`SAC`.
    """

    name = "td3"
    actor_kind = "deterministic"
    target_smoothing = True

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 observation_size: int, action_size: int, device: torch.device,
                 use_graph: bool | None = None, compile: bool | None = False) -> None:
        super().__init__(actor, critic, cfg, observation_size=observation_size,
                         action_size=action_size, device=device, use_graph=use_graph,
                         compile=compile)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_optimizer = self.adam(self.actor.parameters(), lr=cfg.policy_lr)
        self.update_targets = PolyakAverage(
            [(self.target_actor, self.actor), (self.target_critic, self.critic)], cfg.tau)

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        return DeterministicActor(observation_space, action_space, cfg.hidden_sizes)

    def target_actions(self, next_observations: Tensor) -> Tensor:
        """The target policy's action, smoothed with clipped noise (drawn on the device)."""
        actions = self.target_actor(next_observations)
        if not self.target_smoothing:
            return actions
        noise = (torch.randn_like(actions) * self.cfg.policy_noise).clamp(
            -self.cfg.noise_clip, self.cfg.noise_clip)
        return (actions + noise).clamp(-1.0, 1.0)

    def critic_loss(self, q_values: Tensor, targets: Tensor) -> Tensor:
        """Clipped double-Q TD loss; targets are packed rows ``[reward | not_done | next_obs]``."""
        rewards, not_dones, next_observations = split_targets(targets)
        with torch.no_grad():
            next_actions = self.target_actions(next_observations)
            next_q = self.target_critic(next_observations, next_actions).min(dim=1, keepdim=True)
            td_target = rewards + not_dones * self.cfg.gamma * next_q.values
        return (q_values - td_target).pow(2).mean(dim=0).sum()

    def actor_loss(self, actions: Tensor, observations: Tensor) -> Tensor:
        """``-Q_1(s, pi(s))``: the first critic only, as published."""
        loss = -self.frozen_critic(observations, actions)[:, 0].mean()
        self.actor_loss_value.copy_(loss.detach())
        return loss

    def after_actor_updates(self) -> None:
        self.update_targets()

    @torch.no_grad()
    def explore(self, observations: Tensor, noise: Tensor | None = None) -> Tensor:
        """The policy's action plus Gaussian noise (``noise`` where given, a standard normal
        draw, scaled by ``exploration_noise``), clipped to [-1, 1]."""
        actions = self.behaviour_actor(observations)
        if noise is None:
            noise = torch.randn_like(actions)
        return (actions + noise * self.cfg.exploration_noise).clamp(-1.0, 1.0)

    def exploration_noise_size(self) -> int:
        return self.action_size
