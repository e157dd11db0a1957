"""Soft actor-critic (Haarnoja et al., 2018): twin critics, a squashed-Gaussian actor and an
automatically tuned entropy temperature.

The temperature and the target entropy are device tensors, so a captured step reads their
current values on every replay; the temperature loss is written in place from inside the actor
loss, which is how a captured graph reports it.
"""

from __future__ import annotations

import inspect
import math

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import ActorCritic, PolyakAverage
from rl_graphstep.buffer import split_targets
from rl_graphstep.config import Config
from rl_graphstep.networks import SquashedGaussianActor


class SAC(ActorCritic):
    """Soft actor-critic.

    Args:
        actor: maps observations (B, O) to an action in [-1, 1] (B, A) and its log-probability
            (B,), drawing its noise on the device.
        critic: maps (observations, actions) to one Q value per ensemble member, (B, E).
        cfg: the run configuration (gamma, tau, learning rates, frequencies, clipping, alpha).
        observation_size, action_size: O and A; the target entropy is -A.
        device: where the networks, optimizers and steps live.
        use_graph: capture the updates as CUDA graphs; ``None``: on CUDA, falling back to
            eager when a step cannot be captured.
        compile: ``torch.compile`` the step bodies (fused kernels); ``None``: compiled,
            falling back to uncompiled when compiling fails.
    """

    name = "sac"
    actor_kind = "stochastic"

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 observation_size: int, action_size: int, device: torch.device,
                 use_graph: bool | None = None, compile: bool | None = False) -> None:
        super().__init__(actor, critic, cfg, observation_size=observation_size,
                         action_size=action_size, device=device, use_graph=use_graph,
                         compile=compile)
        # CleanRL's compensation for the delay: policy_frequency actor steps every
        # policy_frequency critic steps.
        self.actor_updates_per_delay = cfg.policy_frequency
        self.log_alpha = torch.full((), math.log(cfg.alpha), device=device,
                                    requires_grad=cfg.autotune)
        self.target_entropy = torch.full((), -float(action_size), device=device)
        groups = [{"params": list(self.actor.parameters()), "lr": cfg.policy_lr}]
        if cfg.autotune:
            groups.append({"params": [self.log_alpha], "lr": cfg.q_lr})
        self.actor_optimizer = self.adam(groups)
        self.alpha_loss_value = torch.zeros((), device=device)
        # The temperature each actor update used, written in place like the losses.
        self.alpha_value = self.alpha.clone()
        self.update_target = PolyakAverage([(self.target_critic, self.critic)], cfg.tau)

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        return SquashedGaussianActor(observation_space, action_space, cfg.hidden_sizes)

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()

    def critic_loss(self, q_values: Tensor, targets: Tensor) -> Tensor:
        """Twin-critic soft TD loss; targets are packed rows ``[reward | not_done | next_obs]``."""
        rewards, not_dones, next_observations = split_targets(targets)
        with torch.no_grad():
            next_actions, next_log_pi = self.actor(next_observations)
            next_q = self.target_critic(next_observations, next_actions).min(dim=1, keepdim=True)
            soft_value = next_q.values - self.alpha * next_log_pi.unsqueeze(1)
            td_target = rewards + not_dones * self.cfg.gamma * soft_value
        # CleanRL's qf1_loss + qf2_loss: the mean squared error of each member, summed.
        return (q_values - td_target).pow(2).mean(dim=0).sum()

    def actor_loss(self, prediction: tuple[Tensor, Tensor], observations: Tensor) -> Tensor:
        """``alpha * log_pi - min Q`` plus, with autotune, the temperature loss."""
        actions, log_pi = prediction
        min_q = self.frozen_critic(observations, actions).min(dim=1).values
        alpha = self.alpha
        self.alpha_value.copy_(alpha)
        actor_loss = (alpha * log_pi - min_q).mean()
        self.actor_loss_value.copy_(actor_loss.detach())
        if not self.cfg.autotune:
            return actor_loss
        alpha_loss = (-self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)).mean()
        self.alpha_loss_value.copy_(alpha_loss.detach())
        return actor_loss + alpha_loss

    def after_critic_update(self) -> None:
        if self.updates % self.cfg.target_network_frequency == 0:
            self.update_target()

    def actor_metrics(self) -> dict[str, Tensor]:
        metrics = {**super().actor_metrics(), "charts/alpha": self.alpha_value}
        if self.cfg.autotune:
            metrics["losses/alpha"] = self.alpha_loss_value
        return metrics

    @torch.no_grad()
    def explore(self, observations: Tensor, noise: Tensor | None = None) -> Tensor:
        """A sample of the stochastic policy, in [-1, 1] (the actor's ``sample`` where it has
        one: the same draw without the log-probability's kernels), with ``noise`` as its
        standard normal draw where given."""
        actor = self.behaviour_actor
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
