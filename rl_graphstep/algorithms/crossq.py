"""CrossQ (Bhatt, Palenicek et al., ICLR 2024, "CrossQ: Batch Normalization in Deep
Reinforcement Learning for Greater Sample Efficiency and Simplicity"): SAC without target
networks, with batch renormalisation in the critic and the actor, the current and next
state-action pairs passed through the critic in one joint forward so that its normalisation
sees both, Adam with beta1 = 0.5, one actor step every third critic step and a wide critic.

Where the paper is silent this follows its original implementation (``adityab/CrossQ``,
``sbx/sac/sac.py`` and ``train.py``); sb3-contrib's ``crossq`` agrees on every mode below.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from rl_graphstep.algorithms.base import JointPrediction
from rl_graphstep.algorithms.sac import SAC
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.networks.batchrenorm import BatchRenormSettings, InTrainingMode, training_mode
from rl_graphstep.networks.builtin import EnsembleCritic, SquashedGaussianActor
from rl_graphstep.settings.config import Config

# The critics that CrossQ can train: they normalise over the batch in training mode and with
# running statistics in inference mode (the learner switches the modes).
BATCH_NORMALIZATIONS = ("batch_renorm", "batch_norm")

# Adam's betas, the paper's (Section 4, and the original's `adam_b1 = 0.5`): the moment
# estimates must follow the critic as fast as the batch statistics move.
ADAM_BETAS = (0.5, 0.999)
# The temperature's own Adam is the default one in the original (sbx's `optax.adam`).
TEMPERATURE_BETAS = (0.9, 0.999)


def batch_renorm_settings(cfg: Config) -> BatchRenormSettings:
    """The run's batch renormalisation: ``--batch-renorm-momentum`` and ``-warmup``, the
    paper's clip limits (r_max 3, d_max 5) and Flax's eps."""
    return BatchRenormSettings(momentum=cfg.batch_renorm_momentum,
                               warmup=cfg.batch_renorm_warmup)


class CrossQ(SAC):
    """SAC without target networks, its critic's TD target read from the critic itself.

    The networks stay in inference mode (running statistics) wherever they are only read:
    acting, evaluating, the next actions a' of the TD target and the critic inside the
    actor's loss. Two places use the batch statistics (training mode) and move the running
    ones on: the critic's joint forward over (s, a) and (s', a') in its update, and the
    actor's forward in its update. The original does exactly this: ``update_critic`` samples
    a' with ``train=False`` and calls the critic on the concatenated batch with
    ``train=True``; ``update_actor`` calls the actor with ``train=True`` and the critic with
    ``train=False`` (``sbx/sac/sac.py``), as sb3-contrib's ``CrossQ.train`` does with
    ``set_bn_training_mode``.

    Arguments as :class:`~rl_graphstep.algorithms.sac.SAC`'s; the critic must say how it
    normalises (``normalization``, one of ``batch_renorm`` or ``batch_norm``).
    """

    name = "crossq"
    has_target_critic = False
    joint_critic_forward = True

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: Config, *,
                 action_size: int, device: torch.device, seeds: int = 1) -> None:
        check_critic_normalizes(critic)
        super().__init__(actor, critic, cfg, action_size=action_size, device=device,
                         seeds=seeds)
        self.actor.eval()
        self.critic.eval()

    @classmethod
    def default_actor(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                      cfg: Config) -> nn.Module:
        """SAC's actor with batch renormalisation of its input and hidden layers (the
        original's default ``brn_actor`` mode), in inference mode."""
        return SquashedGaussianActor(observation_space, action_space, cfg.hidden_sizes,
                                     batch_renorm=batch_renorm_settings(cfg)).eval()

    @classmethod
    def default_critic(cls, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                       cfg: Config) -> nn.Module:
        """Twin critics of ``--critic-hidden-sizes`` (the paper's 2048 units), each with its
        own batch renormalisation of its input and hidden layers, in inference mode."""
        return EnsembleCritic(observation_space, action_space,
                              cfg.critic_hidden_sizes or cfg.hidden_sizes,
                              num_critics=cls.num_critics,
                              batch_renorm=batch_renorm_settings(cfg)).eval()

    # ------------------------------------------------------------------ the optimizers

    def optimizer_settings(self) -> dict[str, Any]:
        return {"betas": ADAM_BETAS}

    def actor_parameter_groups(self) -> list[dict[str, Any]]:
        groups = super().actor_parameter_groups()
        for group in groups[1:]:  # the temperature's
            group["betas"] = TEMPERATURE_BETAS
        return groups

    # ------------------------------------------------------------------ the two updates

    def next_actions(self, next_observations: Tensor) -> tuple[Tensor, Tensor]:
        """SAC's a' and entropy term, drawn by the actor with its running statistics."""
        with training_mode(self.actor, False):
            return super().next_actions(next_observations)

    def joint_prediction(self, observations: Tensor, actions: Tensor,
                         next_observations: Tensor) -> JointPrediction:
        """The critic at (s, a) and (s', a') in one forward with the statistics of both
        halves together ("CrossQ's one weird trick"): without target networks the two are
        read by the same network, and normalising them apart would make (s', a') look out of
        distribution."""
        with training_mode(self.critic, True):
            return super().joint_prediction(observations, actions, next_observations)

    def critic_loss(self, prediction: Tensor | JointPrediction, batch: Any
                    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The original's ``0.5 * sum_i mean (y - Q_i(s, a))^2`` (Adam makes the factor
        matter only through the gradient-norm clip)."""
        loss, metrics = super().critic_loss(prediction, batch)
        return 0.5 * loss, metrics

    def actor_step_module(self) -> nn.Module:
        """The actor in training mode for its update; everywhere else it acts with its
        running statistics."""
        return InTrainingMode(self.actor)

    # ------------------------------------------------------------------ the schedule

    def actor_steps(self, update: int) -> int:
        """One actor step after every ``policy_frequency``-th critic step (the original's
        ``(n_updates + 1) % policy_delay == 0``), not CleanRL's compensating burst."""
        return 1 if (update + 1) % self.cfg.policy_frequency == 0 else 0

    def after_critic_step(self, update: int) -> None:
        """Nothing: no target network to average."""

    def update_period(self) -> int:
        return self.cfg.policy_frequency


def check_critic_normalizes(critic: nn.Module) -> None:
    """A one-line ConfigError where ``critic`` does not say that it normalises over the
    batch: CrossQ, without target networks, is stable only with such a critic."""
    normalization = getattr(critic, "normalization", None)
    if normalization in BATCH_NORMALIZATIONS:
        return
    name = type(critic).__name__
    said = ("does not say how it normalises" if normalization is None
            else f"says normalization = {normalization!r}")
    raise ConfigError(f"--algo crossq needs a critic that normalises over the batch (it has "
                      f"no target network): critic {name} {said}; give it batch "
                      f"(re)normalisation layers and a normalization attribute "
                      f"{' or '.join(map(repr, BATCH_NORMALIZATIONS))}, or use the default "
                      f"critic")
