"""PPO's networks for a run: the built-in actor (Gaussian for a Box action space, categorical
for a Discrete one) and value network, or custom ones given as the off-policy networks are
(``--actor`` / ``--critic`` specs, classes or built modules from Python, recorded by
``run.netspec``); each checked on an example batch (``core.ppocheck``), and for K seeds each
seed's pair built as that seed alone builds it, stacked on a leading seed dimension."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.netcheck import forked_rng
from rl_graphstep.core.ppocheck import check_ppo_actor, check_value_network
from rl_graphstep.data.memory import allocation_errors
from rl_graphstep.networks.custom import NetworkSpec, load_network_classes
from rl_graphstep.networks.policies import CategoricalActor, GaussianActor
from rl_graphstep.networks.seeds import SeedStack, check_batchable, stack_pairs
from rl_graphstep.run.netspec import build_networks, refuse_built_for_group
from rl_graphstep.settings.config import Config

__all__ = ["make_ppo_networks"]

# The rows of each seed's example batch in the check that a stack batches its members.
_BATCH_ROWS = 8


def make_ppo_networks(algorithm: Any, cfg: Config, seeds: Sequence[int],
                      observation_space: gym.Space, action_space: gym.Space,
                      device: torch.device, actor: NetworkSpec | None = None,
                      critic: NetworkSpec | None = None) -> tuple[nn.Module, nn.Module]:
    """The actor and the value network on ``device``: given ones (class, module or spec),
    else those of ``cfg.actor`` / ``cfg.critic``, else PPO's built-in ones; each checked
    once on an example batch before any capture. For K seeds, a stack of each (a built
    module has one initialisation, so a group refuses it), checked to batch over seeds."""
    actor, critic = actor or cfg.actor, critic or cfg.critic
    if len(seeds) > 1:
        refuse_built_for_group(actor, critic)
    # Loaded once: a file spec loaded per seed would give each seed a class of its own.
    actor, critic = load_network_classes((actor, "actor"), (critic, "critic"))
    _check_actor_fits_space(actor, action_space, cfg.env_id)
    discrete = isinstance(action_space, gym.spaces.Discrete)
    sizes = {"observation_size": int(observation_space.shape[0]), "device": device}

    def pair(_seed: int | None = None) -> tuple[nn.Module, nn.Module]:
        with allocation_errors(device):
            actor_net, critic_net = build_networks(algorithm, cfg, observation_space,
                                                   action_space, device, actor, critic)
        check_ppo_actor(actor_net, action_size=1 if discrete else int(action_space.shape[0]),
                        num_actions=int(action_space.n) if discrete else 0, **sizes)
        check_value_network(critic_net, **sizes)
        return actor_net, critic_net

    if len(seeds) == 1:
        return pair()
    actors, critics = stack_pairs(pair, seeds)
    _check_stacks_batch(actors, critics, sizes["observation_size"], action_space, device)
    return actors, critics


def _check_actor_fits_space(actor: NetworkSpec | None, action_space: gym.Space,
                            env_id: str) -> None:
    """A subclass of a built-in distribution head offered for the other kind of action
    space, named before it is built (its constructor would refuse it less plainly)."""
    cls = actor if isinstance(actor, type) else None if actor is None else type(actor)
    if cls is None:
        return
    discrete = isinstance(action_space, gym.spaces.Discrete)
    if discrete and issubclass(cls, GaussianActor):
        raise ConfigError(
            f"actor: {_kind(cls, GaussianActor, 'Gaussian')}, for a Box action space, but "
            f"{env_id}'s action space is {action_space}: give a categorical actor "
            "(rl_graphstep.networks.policies:CategoricalActor or a subclass of it), or drop "
            "--actor for the built-in one")
    if not discrete and issubclass(cls, CategoricalActor):
        raise ConfigError(
            f"actor: {_kind(cls, CategoricalActor, 'categorical')}, for a Discrete action "
            f"space, but {env_id}'s action space is {action_space}: give a Gaussian actor "
            "(rl_graphstep.networks.policies:GaussianActor or a subclass of it), or drop "
            "--actor for the built-in one")


def _kind(cls: type, head: type, kind: str) -> str:
    """``"GaussianActor is a Gaussian actor"``, or for a subclass ``"MyActor is a Gaussian
    actor (a GaussianActor subclass)"``."""
    subclass = "" if cls is head else f" (a {head.__name__} subclass)"
    return f"{cls.__name__} is a {kind} actor{subclass}"


def _check_stacks_batch(actors: SeedStack, critics: SeedStack, observation_size: int,
                        action_space: gym.Space, device: torch.device) -> None:
    """Both stacks called once through vmap, each method PPO calls on them: a member vmap
    cannot batch is one line now (``check_batchable``), not an error in the first update."""
    shape = (actors.num_seeds, _BATCH_ROWS)
    with forked_rng(device):
        observations = torch.randn(*shape, observation_size, device=device)
        if isinstance(action_space, gym.spaces.Discrete):
            actions = torch.randint(0, int(action_space.n), (*shape, 1),
                                    device=device).float()
        else:
            actions = torch.randn(*shape, int(action_space.shape[0]), device=device)
    check_batchable(actors, "actor", (observations,),
                    {"log_prob_and_entropy": (observations, actions)})
    check_batchable(critics, "critic", (observations,))
