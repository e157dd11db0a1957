"""What an off-policy actor-critic algorithm is: its networks' roles, its two losses, its
target updates and their schedule. How the updates run on the device (optimizers, captured
steps, replay sampling, checkpoints) is the learner's job (``rl_graphstep.learners``)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.distributional import CategoricalSupport
from rl_graphstep.algorithms.targets import PolyakAverage
from rl_graphstep.data.normalizer import REFERENCE_FORM, NormalizationForm
from rl_graphstep.data.rows import CriticTargets
from rl_graphstep.networks.builtin import EnsembleCritic
from rl_graphstep.settings.config import Config

Metrics = dict[str, Tensor]
"""Named 0-dim device tensors a loss reports for the log (``losses/actor``, ...)."""


class JointPrediction(NamedTuple):
    """The critic step's prediction where the critic sees (s, a) and (s', a') in one forward
    (:attr:`OffPolicyAlgorithm.joint_critic_forward`): the Q values at (s, a), (B, E), to
    learn; those at (s', a'), (B, E), detached, for the target; and what the target's next
    value subtracts (SAC's ``alpha log pi(a'|s')``, (B, 1)), or None."""

    q_values: Tensor
    next_q_values: Tensor
    penalty: Tensor | None


class OffPolicyAlgorithm:
    """The base of SAC, TD3 and DDPG.

    A subclass writes what its paper writes: its TD target's next actions
    (:meth:`next_actions`; the targets and the critic loss are shared), :meth:`actor_loss`,
    the actor's optimizer groups, how it explores, and its schedule (:meth:`actor_steps`,
    :meth:`after_critic_step`, :meth:`after_actor_steps`). The schedule takes the update's
    number explicitly and must repeat every :meth:`update_period` updates: the learner records
    one fused update per phase of it.

    With ``seeds`` = K > 1 the networks are K seeds' networks batched (every input and output
    with a leading K dimension) and each loss returns one value per seed, (K,), for the learner
    to sum: each seed's gradient is then its own. With one seed, the losses are scalars.

    With ``--critic-atoms`` the critic is distributional (C51): it returns logits over the
    atoms of :attr:`support`, learns by cross-entropy towards the projected target
    distribution, and the actor's loss reads its expected values where it read Q values.
    """

    name: ClassVar[str]
    actor_kind: ClassVar[str]  # "stochastic" (action, log_prob) or "deterministic" (action)
    num_critics: ClassVar[int] = 2
    # False: no target critic at all (CrossQ): none is built, averaged or saved, and the TD
    # target reads the critic itself (see joint_critic_forward).
    has_target_critic: ClassVar[bool] = True
    # True: the critic step's module passes the replay rows' (s, a) and (s', a') through the
    # critic in one forward (concatenated along the batch, so a batch normalisation sees
    # both), its prediction a JointPrediction; its inputs are then the whole rows.
    joint_critic_forward: ClassVar[bool] = False
    # How --obs-norm normalises: FastTD3's and FastSAC's form (see data.normalizer).
    observation_form: ClassVar[NormalizationForm] = REFERENCE_FORM

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 action_size: int, device: torch.device, seeds: int = 1) -> None:
        self.cfg = cfg
        self.action_size = action_size
        # The shape of a per-seed value (a loss, SAC's temperature): none for a single run.
        self.seed_shape: tuple[int, ...] = () if seeds == 1 else (seeds,)
        self.actor = actor.to(device)
        self.critic = critic.to(device)
        self.target_critic = (copy.deepcopy(self.critic).requires_grad_(False)
                              if self.has_target_critic else None)
        # The atoms of a distributional critic (--critic-atoms); None: Q values.
        self.support = (CategoricalSupport(cfg.critic_atoms, cfg.v_min, cfg.v_max, device)
                        if cfg.critic_atoms else None)
        # Every target network's Polyak average, set by the subclass (None without targets).
        self.polyak: PolyakAverage | None

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def default_critic(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                       cfg: Config) -> nn.Module:
        return EnsembleCritic(observation_space, action_space, cfg.hidden_sizes,
                              num_critics=cls.num_critics, layer_norm=cfg.layer_norm,
                              atoms=cfg.critic_atoms)

    # ------------------------------------------------------------------ what a subclass writes

    def optimizer_settings(self) -> dict[str, Any]:
        """Settings of both optimizers beyond their learning rates (CrossQ's Adam betas)."""
        return {}

    def actor_step_module(self) -> nn.Module:
        """The module the actor step runs: the actor, or the actor in a mode of its own."""
        return self.actor

    def actor_parameter_groups(self) -> list[dict[str, Any]]:
        """The actor optimizer's parameter groups (SAC adds its temperature)."""
        return [{"params": list(self.actor.parameters()), "lr": self.cfg.policy_lr}]

    def next_actions(self, next_observations: Tensor) -> tuple[Tensor, Tensor | None]:
        """The TD target's actions a' at s' (B, A), and what its value subtracts from the
        target critic's at (s', a'), (B, 1) (SAC's ``alpha log pi(a'|s')``), or None."""
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
        return {} if self.target_critic is None else {"target_critic": self.target_critic}

    def after_load(self) -> None:
        """Set again what the config fixes and a loaded checkpoint overwrote (SAC's fixed
        temperature): a resumed run trains with the settings it says it has."""

    # ------------------------------------------------------------------ shared by the losses

    @torch.no_grad()
    def td_target(self, batch: CriticTargets) -> Tensor:
        """r + gamma not_done (min_i Q_target_i(s', a') - penalty), a' and the penalty from
        :meth:`next_actions` (with n-step rows, not_done is gamma^(n-1) or 0)."""
        assert self.target_critic is not None
        next_actions, penalty = self.next_actions(batch.next_observations)
        next_q = self.target_critic(batch.next_observations, next_actions).min(dim=-1,
                                                                                 keepdim=True)
        next_value = next_q.values if penalty is None else next_q.values - penalty
        return batch.rewards + batch.not_dones * self.cfg.gamma * next_value

    @torch.no_grad()
    def target_distribution(self, batch: CriticTargets) -> Tensor:
        """The distributional TD target (B, A): the target critic's distribution at
        (s', a') of the member with the lowest expected value, per row (clipped double Q),
        shifted by r and discounted by gamma not_done, projected onto the atoms. The penalty
        is folded into the reward, ``r - gamma not_done penalty`` (FastSAC's entropy term)."""
        assert self.support is not None and self.target_critic is not None
        next_actions, penalty = self.next_actions(batch.next_observations)
        logits = self.target_critic(batch.next_observations, next_actions)
        discounts = batch.not_dones * self.cfg.gamma
        rewards = batch.rewards if penalty is None else batch.rewards - discounts * penalty
        return self.support.project(self.support.lowest_member(logits), rewards, discounts)

    def joint_prediction(self, observations: Tensor, actions: Tensor,
                         next_observations: Tensor) -> JointPrediction:
        """The critic at (s, a) and at (s', a'), a' from :meth:`next_actions`, in one forward
        over the batch's two halves concatenated (rows are the second to last dimension)."""
        next_actions, penalty = self.next_actions(next_observations)
        q_values = self.critic(torch.cat([observations, next_observations], dim=-2),
                               torch.cat([actions, next_actions], dim=-2))
        current, following = q_values.split(observations.shape[-2], dim=-2)
        return JointPrediction(current, following.detach(), penalty)

    @torch.no_grad()
    def joint_td_target(self, prediction: JointPrediction, batch: CriticTargets) -> Tensor:
        """r + gamma not_done (min_i Q_i(s', a') - penalty), the Q values at (s', a') from the
        joint forward's (detached) second half."""
        next_value = prediction.next_q_values.min(dim=-1, keepdim=True).values
        if prediction.penalty is not None:
            next_value = next_value - prediction.penalty
        return batch.rewards + batch.not_dones * self.cfg.gamma * next_value

    def critic_loss(self, prediction: Tensor | JointPrediction, batch: CriticTargets
                    ) -> tuple[Tensor, Metrics]:
        """The TD loss of the critic's ``prediction`` on a replay batch: Q values (B, E)
        against :meth:`td_target` (a joint forward's against :meth:`joint_td_target`) by
        squared error or, distributional, logits (B, E, A) against
        :meth:`target_distribution` by cross-entropy; each member's mean over the batch,
        summed over the members (per seed)."""
        if isinstance(prediction, JointPrediction):
            return self.mse(prediction.q_values, self.joint_td_target(prediction, batch)), {}
        if self.support is None:
            return self.mse(prediction, self.td_target(batch)), {}
        cross_entropy = self.support.cross_entropy(prediction, self.target_distribution(batch))
        return self.sum_over_members(cross_entropy), {}

    def frozen_critic(self, observations: Tensor, actions: Tensor) -> Tensor:
        """The critic's Q values (B, E) as a function of its inputs alone, for the actor's
        loss (a distributional critic's expected values): its parameters enter detached, so
        the actor's backward computes no critic weight gradients (a compiled backward would
        compute them and throw them away)."""
        detached = {name: t.detach() for name, t in (*self.critic.named_parameters(),
                                                      *self.critic.named_buffers())}
        output = torch.func.functional_call(self.critic, detached, (observations, actions))
        return output if self.support is None else self.support.expected(output)

    def mse(self, q_values: Tensor, td_target: Tensor) -> Tensor:
        """CleanRL's qf1_loss + qf2_loss: each critic member's mean squared error over the
        batch, summed over the members (per seed)."""
        return self.sum_over_members((q_values - td_target).pow(2))

    def sum_over_members(self, per_row: Tensor) -> Tensor:
        """A loss per row and member (B, E): the mean over the batch, summed over the
        members (per seed)."""
        per_member = per_row.mean(dim=-2)
        return per_member.sum() if not self.seed_shape else per_member.sum(dim=-1)

    def batch_mean(self, values: Tensor) -> Tensor:
        """The mean over the batch (the last dimension), per seed."""
        return values.mean() if not self.seed_shape else values.mean(dim=-1)

    def per_seed(self, value: Tensor, like: Tensor) -> Tensor:
        """A per-seed value (SAC's temperature) shaped to broadcast against ``like``."""
        if not self.seed_shape:
            return value
        return value.view(*value.shape, *(1,) * (like.dim() - value.dim()))
