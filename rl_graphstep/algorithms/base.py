"""What an off-policy actor-critic algorithm is: its networks' roles, its two losses, its
target updates and their schedule. How the updates run on the device (optimizers, captured
steps, replay sampling, checkpoints) is the learner's job (``rl_graphstep.learners``)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.targets import PolyakAverage
from rl_graphstep.data.rows import CriticTargets
from rl_graphstep.networks.builtin import EnsembleCritic
from rl_graphstep.settings.config import Config

Metrics = dict[str, Tensor]
"""Named 0-dim device tensors a loss reports for the log (``losses/actor``, ...)."""


class OffPolicyAlgorithm:
    """The base of SAC, TD3 and DDPG.

    A subclass writes what its paper writes: :meth:`critic_loss` (with its TD target),
    :meth:`actor_loss`, the actor's optimizer groups, how it explores, and its schedule
    (:meth:`actor_steps`, :meth:`after_critic_step`, :meth:`after_actor_steps`). The schedule
    takes the update's number explicitly and must repeat every :meth:`update_period` updates:
    the learner records one fused update per phase of it.

    With ``seeds`` = K > 1 the networks are K seeds' networks batched (every input and output
    with a leading K dimension) and each loss returns one value per seed, (K,), for the learner
    to sum: each seed's gradient is then its own. With one seed, the losses are scalars.
    """

    name: ClassVar[str]
    actor_kind: ClassVar[str]  # "stochastic" (action, log_prob) or "deterministic" (action)
    num_critics: ClassVar[int] = 2

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 action_size: int, device: torch.device, seeds: int = 1) -> None:
        self.cfg = cfg
        self.action_size = action_size
        # The shape of a per-seed value (a loss, SAC's temperature): none for a single run.
        self.seed_shape: tuple[int, ...] = () if seeds == 1 else (seeds,)
        self.actor = actor.to(device)
        self.critic = critic.to(device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        # Every target network's Polyak average, set by the subclass.
        self.polyak: PolyakAverage

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def default_critic(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                       cfg: Config) -> nn.Module:
        return EnsembleCritic(observation_space, action_space, cfg.hidden_sizes,
                              num_critics=cls.num_critics, layer_norm=cfg.layer_norm)

    # ------------------------------------------------------------------ what a subclass writes

    def actor_parameter_groups(self) -> list[dict[str, Any]]:
        """The actor optimizer's parameter groups (SAC adds its temperature)."""
        return [{"params": list(self.actor.parameters()), "lr": self.cfg.policy_lr}]

    def critic_loss(self, q_values: Tensor, batch: CriticTargets) -> tuple[Tensor, Metrics]:
        """The TD loss of the critic's ``q_values`` (B, E) on a replay batch."""
        raise NotImplementedError

    def actor_loss(self, prediction: Any, observations: Tensor) -> tuple[Tensor, Metrics]:
        """The policy loss of the actor's ``prediction`` on ``observations``."""
        raise NotImplementedError

    def actor_steps(self, update: int) -> int:
        """How many actor steps follow critic step number ``update`` (0: the actor waits)."""
        raise NotImplementedError

    def after_critic_step(self, update: int) -> None:
        """Run after critic step number ``update`` (e.g. a target update)."""

    def after_actor_steps(self, update: int) -> None:
        """Run after the actor steps that followed critic step ``update``."""

    def update_period(self) -> int:
        """The schedule repeats every this many updates."""
        return self.cfg.policy_frequency

    def explore(self, actor: nn.Module, observations: Tensor, noise: Tensor | None = None
                ) -> Tensor:
        """Actions in [-1, 1] to take while learning, from ``actor`` (the learned actor or
        the copy that acts beside the updates). ``noise`` (B, :meth:`exploration_noise_size`),
        a standard normal draw made on the host, replaces the one made on the device."""
        raise NotImplementedError

    def exploration_noise_size(self) -> int:
        """Columns of host noise :meth:`explore` can take; 0 when it draws its own."""
        return 0

    def learning_state(self) -> dict[str, nn.Module | Tensor]:
        """What the algorithm learns beside the actor and the critic, by checkpoint name."""
        return {"target_critic": self.target_critic}

    def after_load(self) -> None:
        """Set again what the config fixes and a loaded checkpoint overwrote (SAC's fixed
        temperature): a resumed run trains with the settings it says it has."""

    # ------------------------------------------------------------------ shared by the losses

    def frozen_critic(self, observations: Tensor, actions: Tensor) -> Tensor:
        """The critic as a function of its inputs alone, for the actor's loss: its parameters
        enter detached, so the actor's backward computes no critic weight gradients (a
        compiled backward would compute them and throw them away)."""
        detached = {name: t.detach() for name, t in (*self.critic.named_parameters(),
                                                      *self.critic.named_buffers())}
        return torch.func.functional_call(self.critic, detached, (observations, actions))

    def mse(self, q_values: Tensor, td_target: Tensor) -> Tensor:
        """CleanRL's qf1_loss + qf2_loss: each critic member's mean squared error over the
        batch, summed over the members (per seed)."""
        per_member = (q_values - td_target).pow(2).mean(dim=-2)
        return per_member.sum() if not self.seed_shape else per_member.sum(dim=-1)

    def batch_mean(self, values: Tensor) -> Tensor:
        """The mean over the batch (the last dimension), per seed."""
        return values.mean() if not self.seed_shape else values.mean(dim=-1)

    def per_seed(self, value: Tensor, like: Tensor) -> Tensor:
        """A per-seed value (SAC's temperature) shaped to broadcast against ``like``."""
        if not self.seed_shape:
            return value
        return value.view(*value.shape, *(1,) * (like.dim() - value.dim()))
