"""Soft actor-critic: the critic and actor losses and the wiring of their two adaptation steps.

Everything a step reads (the temperature, the target entropy, the target critic) is a device
tensor, so a captured step sees its current value on every replay and nothing syncs with the
host. Side results (the actor and temperature losses, alpha) are written in place into
preallocated tensors from inside the losses, which is how a captured graph can report them.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import Tensor, nn

from rl_graphstep.config import Config
from rl_graphstep.errors import CaptureError
from rl_graphstep.graphstep import AdaptationStep, clip_grad_norm, make_adaptation_step
from rl_graphstep.networks import StateActionInput


def polyak_update(target: list[Tensor], source: list[Tensor], tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place (the target is never re-created)."""
    torch._foreach_lerp_(target, source, tau)


class SAC:
    """Soft actor-critic (Haarnoja et al., 2018) with twin critics and automatic temperature.

    Args:
        actor: maps observations (B, O) to an action in [-1, 1] (B, A) and its log-probability
            (B,), drawing its noise on the device.
        critic: maps (observations, actions) to one Q value per ensemble member, (B, E).
        cfg: the run configuration (gamma, tau, learning rates, frequencies, clipping).
        action_size: A, for the target entropy -A.
        use_graph: capture the two updates as CUDA graphs (``None``: when on CUDA).
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        cfg: Config,
        *,
        observation_size: int,
        action_size: int,
        device: torch.device,
        use_graph: bool | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.observation_size = observation_size
        self.action_size = action_size
        self.actor = actor.to(device)
        self.critic = critic.to(device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.use_graph = device.type == "cuda" if use_graph is None else use_graph
        self.graph_fallback = use_graph is None

        capturable = device.type == "cuda"
        self.log_alpha = torch.full((), math.log(cfg.alpha), device=device,
                                    requires_grad=cfg.autotune)
        self.target_entropy = torch.full((), -float(action_size), device=device)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.q_lr,
                                                 capturable=capturable)
        actor_groups = [{"params": list(self.actor.parameters()), "lr": cfg.policy_lr}]
        if cfg.autotune:
            actor_groups.append({"params": [self.log_alpha], "lr": cfg.q_lr})
        self.actor_optimizer = torch.optim.Adam(actor_groups, capturable=capturable)
        self.critic_clip = clip_grad_norm(self.critic.parameters(), cfg.critic_max_grad_norm)
        self.actor_clip = clip_grad_norm(self.actor.parameters(), cfg.actor_max_grad_norm)

        # Written in place by the losses, read by the logger.
        self.actor_loss_value = torch.zeros((), device=device)
        self.alpha_loss_value = torch.zeros((), device=device)
        self.critic_step: AdaptationStep | None = None
        self.actor_step: AdaptationStep | None = None
        self.updates = 0

    # ----------------------------------------------------------------------------------------
    # Losses
    # ----------------------------------------------------------------------------------------

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()

    def critic_loss(self, q_values: Tensor, targets: Tensor) -> Tensor:
        """Twin-critic TD loss; targets are packed rows ``[reward | not_done | next_obs]``."""
        rewards, not_dones, next_observations = targets[:, :1], targets[:, 1:2], targets[:, 2:]
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
        min_q = self.critic(observations, actions).min(dim=1).values
        actor_loss = (self.alpha * log_pi - min_q).mean()
        self.actor_loss_value.copy_(actor_loss.detach())
        if not self.cfg.autotune:
            return actor_loss
        alpha_loss = (-self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)).mean()
        self.alpha_loss_value.copy_(alpha_loss.detach())
        return actor_loss + alpha_loss

    # ----------------------------------------------------------------------------------------
    # Steps
    # ----------------------------------------------------------------------------------------

    def _make_steps(self, rows: Tensor, use_graph: bool) -> None:
        split = self.observation_size + self.action_size
        observations = rows[:, : self.observation_size]
        self.critic_step = make_adaptation_step(
            StateActionInput(self.critic, self.observation_size), self.critic_optimizer,
            rows[:, :split], rows[:, split:], self.critic_loss,
            use_graph=use_graph, gradient_transform=self.critic_clip,
        )
        self.actor_step = make_adaptation_step(
            self.actor, self.actor_optimizer, observations, observations, self.actor_loss,
            use_graph=use_graph, gradient_transform=self.actor_clip,
            pool=getattr(self.critic_step, "pool", None),
        )

    def capture(self, rows: Tensor) -> None:
        """Build both steps from an example batch; with ``graph auto`` fall back to eager."""
        try:
            self._make_steps(rows, self.use_graph)
        except CaptureError as error:
            if not (self.use_graph and self.graph_fallback):
                raise
            warnings.warn(f"{error}; running the updates eagerly instead", stacklevel=2)
            self.use_graph = False
            self._make_steps(rows, use_graph=False)

    def update(self, rows: Tensor) -> dict[str, Tensor]:
        """One critic update on ``rows`` (packed replay rows) and, every ``policy_frequency``
        updates, ``policy_frequency`` actor updates (CleanRL's delayed-actor compensation).
        Returns device tensors to log; nothing here syncs with the host."""
        if self.critic_step is None or self.actor_step is None:
            self.capture(rows)
        assert self.critic_step is not None and self.actor_step is not None
        split = self.critic_step.static_inputs.shape[1]
        metrics = {
            "losses/critic": self.critic_step(rows[:, :split], rows[:, split:]),
            "losses/critic_grad_norm": self.critic_clip.norm,
        }
        if self.updates % self.cfg.target_network_frequency == 0:
            polyak_update(list(self.target_critic.parameters()), list(self.critic.parameters()),
                          self.cfg.tau)
        if self.updates % self.cfg.policy_frequency == 0:
            observations = rows[:, : self.observation_size]
            for _ in range(self.cfg.policy_frequency):
                self.actor_step(observations, observations)
            metrics["losses/actor"] = self.actor_loss_value
            metrics["losses/actor_grad_norm"] = self.actor_clip.norm
            metrics["charts/alpha"] = self.alpha
            if self.cfg.autotune:
                metrics["losses/alpha"] = self.alpha_loss_value
        self.updates += 1
        return metrics

    @torch.no_grad()
    def act(self, observations: Tensor) -> Tensor:
        """A stochastic action in [-1, 1] for each observation."""
        actions, _ = self.actor(observations)
        return actions
