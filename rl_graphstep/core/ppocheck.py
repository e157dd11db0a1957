"""Checks of a built PPO actor or value network: each method the on-policy learner, its
rollouts and ``evaluate`` call, run once on a random batch before any capture, so a missing
method, a wrong shape, actions of the wrong kind for the action space or a host sync is one
line naming the class (the off-policy networks' checks are ``core.netcheck``'s).

The protocol (``rl_graphstep/networks/policies.py`` spells it out): an actor's
``forward(obs) -> (actions, log_probs)``, ``log_prob_and_entropy(obs, actions) -> (log_probs,
entropy)`` and ``deterministic_action(obs) -> actions``; a critic's ``forward(obs) -> values``
(B, 1). Where each runs decides what is checked for host syncs on CUDA: the critic's forward
and the actor's ``log_prob_and_entropy`` run inside the captured steps; ``forward`` (acting)
is captured where it can be, and acts eagerly with a warning where it waits for the GPU;
``deterministic_action`` (evaluating) runs eagerly.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.netcheck import check_devices, check_tensor, forked_rng, run_checked

__all__ = ["ACTOR_METHODS", "PPO_ACTOR_PROTOCOL", "check_ppo_actor", "check_value_network"]

ACTOR_METHODS = ("log_prob_and_entropy", "deterministic_action")
"""The methods a PPO actor has besides forward."""

PPO_ACTOR_PROTOCOL = (
    "a PPO actor has forward(observations) -> (actions, log_probs), "
    "log_prob_and_entropy(observations, actions) -> (log_probs, entropy) and "
    "deterministic_action(observations) -> actions (see rl_graphstep/networks/policies.py)")

_VALUE_PROTOCOL = "a PPO critic is a value network, forward(observations) -> values (B, 1)"
# A log-probability recomputed from the stored action may differ by rounding alone.
_LOG_PROB_TOLERANCE = 1e-3


def check_ppo_actor(actor: nn.Module, *, observation_size: int, action_size: int,
                    num_actions: int, device: torch.device, batch_size: int = 256) -> None:
    """Run ``actor``'s three methods once on a random batch and check what PPO relies on.

    Args:
        observation_size: O, the width of an observation.
        action_size: A, the width of a Box action space (a Gaussian actor's (B, A) samples).
        num_actions: n of a Discrete action space, whose actions are indices stored as
            floats, (B, 1), whole numbers in [0, n); 0 for a Box space.
        device: where every parameter, buffer and output must be.

    Checked: each method exists; the shapes, dtype (float32) and finite values of what each
    returns; that ``log_prob_and_entropy``'s log-probabilities carry a gradient; that the
    actions fit the space's kind (indices for a Discrete one, samples that are not all
    whole numbers for a Box one); and that ``log_prob_and_entropy`` gives the sampled
    actions the log-probabilities ``forward`` returned with them, since PPO's ratio
    pi / pi_old starts at 1. No random numbers of the run are consumed.

    Raises:
        ConfigError: one line naming the class and what is wrong.
    """
    name = type(actor).__name__
    missing = [method for method in ACTOR_METHODS
               if not callable(getattr(actor, method, None))]
    if missing:
        raise ConfigError(f"{name} has no {' and no '.join(missing)}: {PPO_ACTOR_PROTOCOL}")
    check_devices(actor, name, device)
    expected = (batch_size, 1 if num_actions else action_size)
    shape_hint = (f" (a Discrete({num_actions}) action is its index as a float, (B, 1): a "
                  "categorical actor's)" if num_actions else
                  f" (a Box action space of {action_size}: a Gaussian actor's samples)")
    with forked_rng(device):
        observations = torch.randn(batch_size, observation_size, device=device)
        # A host sync in forward costs time, not the run: acting then runs eagerly.
        actions, log_probs = _pair(run_checked(actor, (observations,), name, device,
                                               in_graph=False),
                                   name, "forward", "(actions, log_probs)")
        check_tensor(name, actions, "action ", expected, device, hint=shape_hint)
        check_tensor(name, log_probs, "log_prob ", (batch_size,), device,
                     hint=" (sum the log-probabilities over the action dimension)")
        _check_action_kind(name, "forward", actions, num_actions, action_size)
        method = "log_prob_and_entropy"
        with torch.enable_grad():  # the policy loss differentiates what it returns
            new_log_probs, entropy = _pair(run_checked(actor, (observations, actions), name,
                                                       device, method=method),
                                           name, method, "(log_probs, entropy)")
        for what, value in (("log_prob ", new_log_probs), ("entropy ", entropy)):
            check_tensor(name, value, what, (batch_size,), device, method=method,
                         hint=" (one value per row, summed over the action dimension)")
        _check_differentiable(name, method, new_log_probs, "log_probs", "the policy loss")
        _check_same_log_probs(name, log_probs, new_log_probs)
        method = "deterministic_action"
        action = run_checked(actor, (observations,), name, device, method=method,
                             in_graph=False)
        check_tensor(name, action, "", expected, device, method=method, hint=shape_hint)
        if num_actions:
            _check_action_kind(name, method, action, num_actions, action_size)


def check_value_network(critic: nn.Module, *, observation_size: int, device: torch.device,
                        batch_size: int = 256) -> None:
    """Run ``critic(observations)`` once on a random batch: its values must be (B, 1),
    float32, finite, on ``device`` and carry a gradient. An off-policy Q critic
    (``forward(obs, actions)``) is named as such.

    Raises:
        ConfigError: one line naming the class and what is wrong.
    """
    name = type(critic).__name__
    required = _required_arguments(critic)
    if len(required) > 1:
        raise ConfigError(f"{name}.forward takes ({', '.join(required)}), as an off-policy Q "
                          f"critic's does: {_VALUE_PROTOCOL}")
    check_devices(critic, name, device)
    with forked_rng(device):
        observations = torch.randn(batch_size, observation_size, device=device)
        with torch.enable_grad():  # the value loss differentiates them
            values = run_checked(critic, (observations,), name, device)
    check_tensor(name, values, "", (batch_size, 1), device, label="value",
                 hint=f" ({_VALUE_PROTOCOL})")
    _check_differentiable(name, "forward", values, "values", "the value loss")


def _pair(output: object, name: str, method: str, what: str) -> tuple[Tensor, Tensor]:
    """``output`` as the two tensors ``method`` returns, or one line saying what it was."""
    if isinstance(output, tuple | list) and len(output) == 2:
        return output[0], output[1]
    got = (f"a {type(output).__name__} of {len(output)}" if isinstance(output, tuple | list)
           else f"a {type(output).__name__}")
    raise ConfigError(f"{name}.{method} returned {got}, expected a tuple {what}")


def _check_action_kind(name: str, method: str, actions: Tensor, num_actions: int,
                       action_size: int) -> None:
    """Indices in [0, n) for a Discrete space; for a Box one, samples that are not all whole
    numbers (a Gaussian sample is one with probability 0; a categorical actor's always)."""
    whole = actions == actions.round()
    if num_actions:
        if not bool(whole.all()):
            example = float(actions[~whole][0])
            raise ConfigError(
                f"{name}.{method} returned actions that are not whole numbers (e.g. "
                f"{example:.4g}), but the action space is Discrete({num_actions}), whose "
                "actions are indices: give a categorical actor (as "
                "rl_graphstep.networks.policies:CategoricalActor); a Gaussian one is for a Box "
                "action space")
        low, high = float(actions.min()), float(actions.max())
        if low < 0 or high > num_actions - 1:
            raise ConfigError(
                f"{name}.{method} returned action indices in [{low:.0f}, {high:.0f}], "
                f"expected 0 .. {num_actions - 1} for the Discrete({num_actions}) action space")
        return
    if bool(whole.all()):
        raise ConfigError(
            f"{name}.{method} returned only whole-number actions, as a categorical actor's "
            f"indices, but the action space is a Box of {action_size}, whose actions are "
            "continuous: give a Gaussian actor (as rl_graphstep.networks.policies:"
            "GaussianActor); a categorical one is for a Discrete action space")


def _check_differentiable(name: str, method: str, value: Tensor, what: str, loss: str
                          ) -> None:
    """``value`` carries a gradient back to the network's parameters (the update's
    backward would fail inside the step otherwise)."""
    if not value.requires_grad:
        raise ConfigError(
            f"{name}.{method} returned {what} without a gradient: {loss} differentiates them "
            "with respect to the network's parameters; compute them outside torch.no_grad() "
            "and without .detach()")


def _check_same_log_probs(name: str, sampled: Tensor, recomputed: Tensor) -> None:
    """``log_prob_and_entropy`` of the sampled actions gives the log-probabilities the
    sample came with (PPO divides the one by the other: the ratio starts at 1)."""
    difference = float((sampled - recomputed).abs().max())
    if difference > _LOG_PROB_TOLERANCE * (1.0 + float(sampled.abs().max())):
        raise ConfigError(
            f"{name}.log_prob_and_entropy gives the actions forward sampled log-probabilities "
            f"up to {difference:.4g} from those forward returned with them: both must be the "
            "log-probability of the action forward returns (the unclipped sample), since "
            "PPO's ratio pi / pi_old starts at 1")


def _required_arguments(module: nn.Module) -> list[str]:
    """The positional parameters of ``module.forward`` without a default (none known where
    its signature cannot be read)."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters
            if p.kind in positional and p.default is inspect.Parameter.empty]
