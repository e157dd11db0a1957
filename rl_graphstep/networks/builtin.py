"""Default SAC networks (squashed-Gaussian actor, ensemble critic) and the protocol for custom ones.

A custom network plugs in if it meets `SACActor` / `Critic` below and runs inside a CUDA graph:

- actor: `actor(observations) -> (actions, log_probs)` with actions (B, A) in [-1, 1] (the env
  wrapper scales them onto the action bounds) and log_probs (B,), reparameterised so gradients
  flow through the sample; `actor.deterministic_action(observations) -> (B, A)` for evaluation
  (checked at start-up like forward; an actor without it trains, with a warning that
  evaluation then takes its sampled action; a TD3/DDPG actor's forward is its own);
  optionally `actor.sample(observations, noise=None) -> (B, A)`, the draw of
  `actor(observations)[0]` without the log-probability, which SAC then uses to act; given
  `noise` (B, A), a standard normal draw, it uses that instead of drawing on the device, so
  acting draws nothing there and runs beside the updates (`--action-stream`, on by default
  with CUDA graphs; without `sample(observations, noise)` the action runs in line).
- critic: `critic(observations, actions) -> (B, E)`, one Q value per ensemble member, and a
  `num_critics` attribute giving E; with `--critic-atoms A` (a distributional critic),
  `(B, E, A)`: each member's logits over the A atoms of the support. A CrossQ critic has a
  `normalization` attribute, `"batch_renorm"` or `"batch_norm"`: it normalises over the batch
  in training mode and with running statistics in inference mode (the learner sets the mode).
- both: fixed shapes, no host syncs (`.item()`, `bool(t)`, Python `if` on a tensor, `nonzero`,
  boolean-mask indexing), no `torch.distributions` (its argument validation syncs), and noise
  drawn on the input's device (`torch.randn_like`) so each graph replay gets fresh noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Protocol, runtime_checkable

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.networks.batchrenorm import BatchRenorm, BatchRenormSettings, renorm_blocks

__all__ = [
    "LOG_STD_MAX",
    "LOG_STD_MIN",
    "Critic",
    "DeterministicActor",
    "DeterministicPolicy",
    "EnsembleCritic",
    "SACActor",
    "SquashedGaussianActor",
    "StateActionInput",
    "hidden_blocks",
    "mlp",
]

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0


@runtime_checkable
class SACActor(Protocol):
    """What SAC needs from an actor (see the module docstring for the capture rules)."""

    def __call__(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """A reparameterised action (B, A) in [-1, 1] and its log-probability (B,)."""
        ...

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The action (B, A) in [-1, 1] to take when evaluating, without exploration noise."""
        ...


@runtime_checkable
class DeterministicPolicy(Protocol):
    """What TD3 and DDPG need from an actor: same capture rules, but no sampling inside.

    The algorithm adds its own exploration and target-smoothing noise around the action.
    """

    def __call__(self, observations: Tensor) -> Tensor:
        """The action (B, A) in [-1, 1], differentiable with respect to the actor's parameters."""
        ...

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The action (B, A) in [-1, 1] to take when evaluating (the same as calling it)."""
        ...


@runtime_checkable
class Critic(Protocol):
    """What SAC needs from a critic (see the module docstring for the capture rules)."""

    num_critics: int

    def __call__(self, observations: Tensor, actions: Tensor) -> Tensor:
        """Q values shaped (B, num_critics), one column per ensemble member (with
        ``--critic-atoms A``: logits (B, num_critics, A))."""
        ...


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.ReLU, *,
        layer_norm: bool = False) -> nn.Sequential:
    """Linear layers `sizes[0] -> ... -> sizes[-1]` with `activation` between them (not after);
    with `layer_norm`, each hidden Linear is followed by a LayerNorm before its activation
    (FastSAC's Linear -> LayerNorm -> activation block). Without it, the module names are
    those of older runs' checkpoints."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(pairwise(sizes)):
        if i > 0:
            if layer_norm:
                layers.append(nn.LayerNorm(fan_in))
            layers.append(activation())
        layers.append(nn.Linear(fan_in, fan_out))
    return nn.Sequential(*layers)


def hidden_blocks(sizes: Sequence[int], *, layer_norm: bool = False) -> nn.Module:
    """`sizes[0] -> ... -> sizes[-1]` as Linear -> (LayerNorm) -> ReLU blocks, the last one
    included: a trunk whose output feeds heads. Identity for a single size."""
    if len(sizes) < 2:
        return nn.Identity()
    return nn.Sequential(*mlp(sizes, layer_norm=layer_norm),
                         *([nn.LayerNorm(sizes[-1])] if layer_norm else []), nn.ReLU())


def _flat_size(space: gym.spaces.Box, what: str) -> int:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(f"the default networks need a flat (1-D) Box {what} space, got {space}")
    return int(space.shape[0])


class _DefaultActor(nn.Module):
    """What the default actors share: their arguments and sizes.

    Args:
        observation_space: flat Box of the observations.
        action_space: flat Box of the actions; only its size is used, since actions come out
            in [-1, 1] and are scaled onto the bounds outside the network.
        hidden_sizes: widths of the hidden layers.
        layer_norm: a LayerNorm after each hidden Linear, before its ReLU (``--layer-norm``).
    """

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box) -> None:
        super().__init__()
        self.observation_size = _flat_size(observation_space, "observation")
        self.action_size = _flat_size(action_space, "action")


class SquashedGaussianActor(_DefaultActor):
    """SAC's actor: a ReLU MLP giving a Gaussian's mean and log-std, squashed by tanh
    (arguments as :class:`_DefaultActor`; ``batch_renorm``: CrossQ's trunk, batch
    renormalisation of the input and after each hidden ReLU)."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                 hidden_sizes: Sequence[int] = (256, 256), *, layer_norm: bool = False,
                 batch_renorm: BatchRenormSettings | None = None) -> None:
        super().__init__(observation_space, action_space)
        sizes = [self.observation_size, *hidden_sizes]
        self.trunk = (hidden_blocks(sizes, layer_norm=layer_norm) if batch_renorm is None
                      else renorm_blocks(sizes, batch_renorm))
        self.mean = nn.Linear(sizes[-1], self.action_size)
        self.log_std = nn.Linear(sizes[-1], self.action_size)

    def mean_and_log_std(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """The pre-squash Gaussian's mean and log-std, each (B, A); log-std in [-5, 2]."""
        features = self.trunk(observations)
        # A smooth squash rather than a clamp (CleanRL's choice) keeps a gradient at the bounds.
        raw = torch.tanh(self.log_std(features))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (raw + 1)
        return self.mean(features), log_std

    def _draw(self, observations: Tensor, noise: Tensor | None = None
              ) -> tuple[Tensor, Tensor, Tensor]:
        """One reparameterised sample: (actions, the standard normal noise, log-std)."""
        mean, log_std = self.mean_and_log_std(observations)
        # randn_like draws on the tensor's device, so a CUDA graph replay draws afresh.
        eps = torch.randn_like(mean) if noise is None else noise
        return torch.tanh(mean + log_std.exp() * eps), eps, log_std

    def sample(self, observations: Tensor, noise: Tensor | None = None) -> Tensor:
        """Actions (B, A) drawn exactly as :meth:`forward` draws them, without computing their
        log-probability: acting needs none, and skips its kernels. ``noise`` (B, A), a
        standard normal draw, replaces the one made on the device."""
        return self._draw(observations, noise)[0]

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """A reparameterised sample: actions (B, A) in [-1, 1] and their log-probability (B,)."""
        actions, eps, log_std = self._draw(observations)
        # Gaussian log-density at mean + std * eps, written via eps: (x - mean) / std == eps.
        gaussian = -0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        # Change of variables through tanh; 1e-6 keeps the log finite where |action| rounds to 1.
        log_probs = (gaussian - torch.log(1 - actions.pow(2) + 1e-6)).sum(dim=-1)
        return actions, log_probs

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """tanh of the mean: the action to take when evaluating."""
        mean, _ = self.mean_and_log_std(observations)
        return torch.tanh(mean)


class EnsembleCritic(nn.Module):
    """`num_critics` Q networks evaluated together: each layer is one batched matmul.

    Member e's layer l computes `h @ weights[l][e] + biases[l][e]`, like an `nn.Linear` with
    weight `weights[l][e].T`, and is initialised the same way, so the ensemble behaves like
    separate `nn.Linear` critics while costing one batched matmul per layer. With
    `layer_norm`, each hidden layer's output is normalised over its width and scaled and
    shifted by member e's own `norm_weights[l][e]` / `norm_biases[l][e]` (init 1 and 0)
    before the ReLU: member e is then an `nn.LayerNorm` MLP with those affine parameters.
    With `batch_renorm` (CrossQ), the input and each hidden layer's output after its ReLU are
    batch-renormalised with member e's own statistics, scale and shift (each shaped
    (E, width)), as the original's vmapped critics keep theirs; `normalization` says which.

    Args:
        observation_space: flat Box of the observations.
        action_space: flat Box of the actions.
        hidden_sizes: widths of each member's hidden layers.
        num_critics: ensemble members (2 for SAC's clipped double Q).
        layer_norm: a LayerNorm after each hidden layer, before its ReLU (``--layer-norm``).
        atoms: 0 for one Q value per member; A > 0 for a distributional critic, whose last
            layer gives each member A logits over the atoms of its support (``--critic-atoms``).
        batch_renorm: batch renormalisation's settings (CrossQ), or None: none.
    """

    def __init__(
        self,
        observation_space: gym.spaces.Box,
        action_space: gym.spaces.Box,
        hidden_sizes: Sequence[int] = (256, 256),
        num_critics: int = 2,
        *,
        layer_norm: bool = False,
        atoms: int = 0,
        batch_renorm: BatchRenormSettings | None = None,
    ) -> None:
        super().__init__()
        if num_critics < 1:
            raise ConfigError(f"num_critics must be at least 1, got {num_critics}")
        if atoms < 0 or atoms == 1:
            raise ConfigError(f"atoms must be 0 (Q values) or at least 2, got {atoms}")
        self.observation_size = _flat_size(observation_space, "observation")
        self.action_size = _flat_size(action_space, "action")
        self.num_critics = int(num_critics)
        self.atoms = int(atoms)
        sizes = [self.observation_size + self.action_size, *hidden_sizes, self.atoms or 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in pairwise(sizes):
            self.weights.append(nn.Parameter(torch.empty(num_critics, fan_in, fan_out)))
            self.biases.append(nn.Parameter(torch.empty(num_critics, 1, fan_out)))
        self.layer_norm = bool(layer_norm)
        if self.layer_norm:  # only then: the parameter names stay those of older checkpoints
            self.norm_weights = nn.ParameterList(
                nn.Parameter(torch.ones(num_critics, width)) for width in hidden_sizes)
            self.norm_biases = nn.ParameterList(
                nn.Parameter(torch.zeros(num_critics, width)) for width in hidden_sizes)
        # How it normalises, for the algorithms that need to know (CrossQ needs batch
        # statistics; see rl_graphstep.algorithms.crossq).
        self.normalization = ("batch_renorm" if batch_renorm is not None
                              else "layer_norm" if self.layer_norm else "none")
        if batch_renorm is not None:  # only then, as layer_norm's parameters
            self.input_renorm = BatchRenorm(sizes[0], (num_critics,), batch_renorm)
            self.hidden_renorms = nn.ModuleList(
                BatchRenorm(width, (num_critics,), batch_renorm) for width in hidden_sizes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every member as `nn.Linear` does: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        # nn.Linear's kaiming_uniform_(a=sqrt(5)) works out to this bound; it cannot be called
        # on the (E, in, out) tensor directly, since it would take in * out as the fan-in.
        for weight, bias in zip(self.weights, self.biases, strict=True):
            bound = 1.0 / math.sqrt(weight.shape[1])
            nn.init.uniform_(weight, -bound, bound)
            nn.init.uniform_(bias, -bound, bound)
        if self.layer_norm:  # nn.LayerNorm's init
            for weight, bias in zip(self.norm_weights, self.norm_biases, strict=True):
                nn.init.ones_(weight)
                nn.init.zeros_(bias)

    def _normalised(self, h: Tensor, layer: int) -> Tensor:
        """LayerNorm of ``h`` (E, B, width) over its width with each member's own affine
        parameters: ``F.layer_norm`` takes one (width,) weight for all rows, so the
        normalisation runs without it and the (E, 1, width) scale and shift follow."""
        weight, bias = self.norm_weights[layer], self.norm_biases[layer]
        # addcmul (one rounding, as in layer_norm's own affine step) rather than * then +:
        # on the CPU a member then equals nn.LayerNorm to the bit.
        return torch.addcmul(bias.unsqueeze(-2), F.layer_norm(h, h.shape[-1:]),
                             weight.unsqueeze(-2))

    def forward(self, observations: Tensor, actions: Tensor) -> Tensor:
        """Q values shaped (B, num_critics); with atoms, logits (B, num_critics, atoms)."""
        x = torch.cat([observations, actions], dim=-1)
        h = x.unsqueeze(0).expand(self.num_critics, -1, -1)
        renorm = self.normalization == "batch_renorm"
        if renorm:
            h = self.input_renorm(h)
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            # Not `baddbmm`: on CUDA it first copies the broadcast bias into its output (a
            # kernel of its own), where a separate add fuses into the next pointwise kernel
            # (the ReLU, or the loss) under torch.compile.
            h = torch.bmm(h, weight) + bias
            if i < last:
                if self.layer_norm:
                    h = self._normalised(h, i)
                h = torch.relu(h)
                if renorm:
                    h = self.hidden_renorms[i](h)
        if self.atoms:
            return h.transpose(0, 1)
        return h.squeeze(-1).transpose(0, 1)


class StateActionInput(nn.Module):
    """A critic that takes one packed `[observation | action]` tensor, as the critic step feeds it.

    The wrapped critic is a submodule, so the wrapper's parameters are the critic's own.

    Args:
        critic: a `Critic`.
        observation_size: columns of the packed input that are the observation; defaults to
            `critic.observation_size`.
    """

    def __init__(self, critic: nn.Module, observation_size: int | None = None) -> None:
        super().__init__()
        self.critic = critic
        if observation_size is None:
            observation_size = getattr(critic, "observation_size", None)
        if observation_size is None:
            raise ValueError(
                f"StateActionInput needs observation_size: {type(critic).__name__} has no "
                "observation_size attribute to take it from"
            )
        self.observation_size = int(observation_size)

    def _get_name(self) -> str:
        # Errors about the critic step name the user's critic, not this adapter.
        return f"{self.critic._get_name()} (via StateActionInput)"

    def forward(self, inputs: Tensor) -> Tensor:
        """`critic(inputs[..., :observation_size], inputs[..., observation_size:])`."""
        return self.critic(inputs[..., : self.observation_size],
                           inputs[..., self.observation_size :])


class DeterministicActor(_DefaultActor):
    """TD3's and DDPG's actor: a ReLU MLP whose output is squashed into [-1, 1] by tanh
    (arguments as :class:`_DefaultActor`)."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                 hidden_sizes: Sequence[int] = (256, 256), *, layer_norm: bool = False) -> None:
        super().__init__(observation_space, action_space)
        self.net = mlp([self.observation_size, *hidden_sizes, self.action_size],
                       layer_norm=layer_norm)

    def forward(self, observations: Tensor) -> Tensor:
        """The action (B, A) in [-1, 1]."""
        return torch.tanh(self.net(observations))

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The same action as `forward`: exploration noise is the algorithm's job."""
        # Through self.forward rather than an alias, so a subclass's forward is honoured.
        return self.forward(observations)
