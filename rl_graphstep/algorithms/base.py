"""What every off-policy actor-critic shares: the two adaptation steps, their optimizers and
clipping, the target critic, the delayed actor schedule and the capture fallback.

An algorithm subclasses :class:`ActorCritic` and supplies its two losses, how it explores,
and what happens after each critic and actor update (target updates).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.config import Config
from rl_graphstep.errors import CaptureError
from rl_graphstep.graphstep import AdaptationStep, clip_grad_norm, make_adaptation_step
from rl_graphstep.networks import EnsembleCritic, StateActionInput


def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place (the target is never re-created)."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


class ActorCritic:
    """The shared machinery of SAC, TD3 and DDPG.

    Each ``update(rows)`` runs one critic step on a replay sample and, every
    ``policy_frequency`` updates, ``actor_updates_per_delay`` actor steps. The steps are
    captured (or wrapped eagerly) on the first update, from that first sample; with
    ``use_graph=None`` a step that cannot be captured falls back to eager with a warning.

    Subclasses set ``actor_optimizer`` before calling ``update`` and implement
    ``critic_loss``, ``actor_loss``, ``explore`` and the two hooks.
    """

    name: ClassVar[str]
    actor_kind: ClassVar[str]  # "stochastic" (action, log_prob) or "deterministic" (action)
    num_critics: ClassVar[int] = 2
    actor_updates_per_delay: ClassVar[int] = 1

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
        self.capturable = device.type == "cuda"

        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.q_lr,
                                                 capturable=self.capturable)
        self.actor_optimizer: torch.optim.Optimizer
        self.critic_clip = clip_grad_norm(self.critic.parameters(), cfg.critic_max_grad_norm)
        self.actor_clip = clip_grad_norm(self.actor.parameters(), cfg.actor_max_grad_norm)
        # Written in place by actor_loss (inside a graph, too), read by the logger.
        self.actor_loss_value = torch.zeros((), device=device)
        self.critic_step: AdaptationStep | None = None
        self.actor_step: AdaptationStep | None = None
        self.updates = 0

    @classmethod
    def default_critic(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                       cfg: Config) -> nn.Module:
        return EnsembleCritic(observation_space, action_space, cfg.hidden_sizes,
                              num_critics=cls.num_critics)

    # ---------------------------------------------------------------- what subclasses supply

    def critic_loss(self, q_values: Tensor, targets: Tensor) -> Tensor:
        """The TD loss; ``targets`` are packed rows ``[reward | not_done | next_obs]``."""
        raise NotImplementedError

    def actor_loss(self, prediction: Tensor | tuple[Tensor, Tensor], observations: Tensor
                   ) -> Tensor:
        raise NotImplementedError

    def explore(self, observations: Tensor) -> Tensor:
        """Actions in [-1, 1] to take in the environment while learning."""
        raise NotImplementedError

    def after_critic_update(self) -> None:
        """Called after every critic step (e.g. a target update)."""

    def after_actor_updates(self) -> None:
        """Called after each round of delayed actor steps (e.g. target updates)."""

    def actor_metrics(self) -> dict[str, Tensor]:
        return {"losses/actor": self.actor_loss_value,
                "losses/actor_grad_norm": self.actor_clip.norm}

    # ---------------------------------------------------------------- the shared update

    def _make_steps(self, rows: Tensor, use_graph: bool) -> None:
        split = self.observation_size + self.action_size
        observations = rows[:, : self.observation_size]
        self.critic_step = make_adaptation_step(
            StateActionInput(self.critic, self.observation_size), self.critic_optimizer,
            rows[:, :split], rows[:, split:], self.critic_loss,
            use_graph=use_graph, gradient_transform=self.critic_clip, skip_nonfinite=True,
        )
        self.actor_step = make_adaptation_step(
            self.actor, self.actor_optimizer, observations, observations, self.actor_loss,
            use_graph=use_graph, gradient_transform=self.actor_clip, skip_nonfinite=True,
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
        """One critic step on ``rows`` (packed replay rows) and, every ``policy_frequency``
        updates, the delayed actor steps. Returns device tensors to log; no host sync."""
        if self.critic_step is None or self.actor_step is None:
            self.capture(rows)
        assert self.critic_step is not None and self.actor_step is not None
        split = self.observation_size + self.action_size
        metrics = {
            "losses/critic": self.critic_step(rows[:, :split], rows[:, split:]),
            "losses/critic_grad_norm": self.critic_clip.norm,
        }
        self.after_critic_update()
        # The delay is a host-side counter: a skipped actor step costs nothing, where a
        # device-side mask would run (and discard) the whole actor update every iteration.
        if self.updates % self.cfg.policy_frequency == 0:
            observations = rows[:, : self.observation_size]
            for _ in range(self.actor_updates_per_delay):
                self.actor_step(observations, observations)
            self.after_actor_updates()
            metrics.update(self.actor_metrics())
        self.updates += 1
        return metrics

    # ---------------------------------------------------------------- checkpoints

    def checkpointed(self) -> dict[str, Any]:
        """Everything that defines the agent's learning state, by name."""
        parts: dict[str, Any] = {
            "actor": self.actor, "critic": self.critic, "target_critic": self.target_critic,
            "actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
        }
        for name in ("target_actor", "log_alpha"):
            if hasattr(self, name):
                parts[name] = getattr(self, name)
        return parts

    def state_dict(self) -> dict[str, Any]:
        state = {name: part.detach().clone() if isinstance(part, Tensor) else part.state_dict()
                 for name, part in self.checkpointed().items()}
        return {**state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load before the first update: the steps are captured after it, from these values
        (a captured optimizer must never be given new state tensors)."""
        if self.critic_step is not None or self.actor_step is not None:
            raise RuntimeError("load the agent's state before its steps are built")
        for name, part in self.checkpointed().items():
            if isinstance(part, Tensor):
                with torch.no_grad():
                    part.copy_(state[name])
            else:
                part.load_state_dict(state[name])
        self.updates = int(state["updates"])

    def skipped_updates(self) -> tuple[Tensor, Tensor]:
        """(total, longest current run) of updates skipped for non-finite values, on the
        device; zeros before the steps exist."""
        guards = [s.guard for s in (self.critic_step, self.actor_step)
                  if s is not None and s.guard is not None]
        if not guards:
            zero = torch.zeros((), dtype=torch.int64, device=self.device)
            return zero, zero
        return (torch.stack([g.skipped for g in guards]).sum(),
                torch.stack([g.consecutive for g in guards]).max())

    @torch.no_grad()
    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The policy's action without exploration, in [-1, 1] (for evaluation)."""
        return self.actor.deterministic_action(observations)
