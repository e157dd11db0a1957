"""A trained run's policies, evaluated: each seed's actor built from the run's checkpoint as
training built it, its deterministic episodes in an env made as training makes one, and their
video (the machinery of ``python -m rl_graphstep.evaluate``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium import error as gym_error
from torch import nn

from rl_graphstep.algorithms import OffPolicyAlgorithm, algorithm_class, is_on_policy
from rl_graphstep.core.errors import CheckpointError, ConfigError, EnvError, display_path
from rl_graphstep.core.netcheck import evaluation_action
from rl_graphstep.data.normalizer import (
    REFERENCE_FORM,
    NormalizationForm,
    ObservationNormalizer,
)
from rl_graphstep.envs.make import declared_render_modes, make_env
from rl_graphstep.envs.vector import (
    check_continuous_spaces,
    check_trained_observations,
    scale_action,
    seed_everything,
)
from rl_graphstep.networks.custom import NetworkSpec, load_network_classes
from rl_graphstep.networks.seeds import SeedStack
from rl_graphstep.run.netspec import make_networks
from rl_graphstep.run.pponets import make_ppo_networks
from rl_graphstep.settings.config import Config

__all__ = ["VIDEO_DIR", "VIDEO_INSTALL_HINT", "EvaluationResult", "RunPolicies",
           "check_rendering", "check_video_dependency", "evaluation_env"]

VIDEO_DIR = "videos"
"""The folder of a run that `evaluate --video` records its videos into."""

VIDEO_INSTALL_HINT = 'pip install "rl_graphstep[video]"'


class EvaluationResult(NamedTuple):
    """The returns of the evaluation episodes."""

    mean: float
    """Mean return over the episodes."""
    std: float
    """Standard deviation of the returns (population, 0 for one episode)."""
    returns: list[float]
    """The undiscounted return of each episode, in order."""


class RunPolicies:
    """What every seed's evaluation shares: the checkpoint, its config and the device."""

    def __init__(self, cfg: Config, state: dict, checkpoint: Path, folder: Path,
                 device: torch.device, actor: NetworkSpec | None,
                 critic: NetworkSpec | None) -> None:
        self.cfg, self.state, self.checkpoint, self.folder = cfg, state, checkpoint, folder
        # Loaded once for all seeds, as train does (a file loaded per seed runs it again).
        self.actor, self.critic = load_network_classes((actor or cfg.actor, "actor"),
                                                       (critic or cfg.critic, "critic"))
        self.device = device
        self.algorithm = algorithm_class(cfg.algo)

    def evaluate_seed(self, k: int, episodes: int, seed: int, video: bool
                      ) -> tuple[EvaluationResult, str]:
        """The episodes of the run's ``k``-th seed (0 for a single run), each step as a
        single run's evaluation takes it, from ``seed_everything(seed)`` on; and the
        summary's note on stochastic actions."""
        cfg, algorithm = self.cfg, self.algorithm
        seed_everything(seed)
        env = evaluation_env(cfg.env_id, seed, render=video)
        try:
            check_continuous_spaces(cfg.env_id, env.observation_space, env.action_space,
                                    cfg.algo)
            check_trained_observations(cfg.env_id, env.observation_space, self.state,
                                       f"checkpoint {display_path(str(self.checkpoint))}",
                                       "evaluate")
            policy = _load_actor(algorithm, cfg, self.state, env, self.device, self.checkpoint,
                                 self.actor, self.critic, member=k)
            normalize = _saved_normalization(self.state, env, self.device, member=k,
                                             form=algorithm.observation_form)
            if video:
                env = _record_video(env, cfg, self.folder, int(self.state["global_step"]),
                                    None if cfg.num_seeds == 1 else cfg.seed_list[k])
            returns = [_run_episode(env, policy, algorithm, self.device, seed + i, normalize)
                       for i in range(episodes)]
        except gym_error.DependencyNotInstalled as error:
            if not video:
                raise
            # Rendering packages (pygame for classic control) load only at the first frame.
            raise EnvError(f"rendering {cfg.env_id} for --video needs a package that is not "
                           f"installed: {' '.join(str(error).split())}") from None
        finally:
            env.close()
        result = EvaluationResult(float(np.mean(returns)), float(np.std(returns)), returns)
        return result, _stochastic_note(policy, algorithm)


def _stochastic_note(actor: nn.Module, algorithm: type[OffPolicyAlgorithm]) -> str:
    """What the summary adds when the returns are not of deterministic actions."""
    if getattr(algorithm, "actor_kind", None) == "stochastic" and not callable(
            getattr(actor, "deterministic_action", None)):
        return f" (stochastic actions: {type(actor).__name__} has no deterministic_action)"
    return ""


def evaluation_env(env_id: str, seed: int, *, render: bool) -> gym.Env:
    """A single env (plain episodes need no vector env's autoreset), made as a run makes
    each of its envs (``make_env``); asked to render only for ``--video``, so an env whose
    constructor takes no ``render_mode`` evaluates without it."""
    if not render:
        env = make_env(env_id)
    else:
        try:
            env = make_env(env_id, render_mode="rgb_array")
        except EnvError as error:
            cause = error.__cause__
            if isinstance(cause, TypeError) and "render_mode" in str(cause):
                raise EnvError(_no_rgb_array(env_id)) from None
            raise
        if "rgb_array" not in env.metadata.get("render_modes", []):
            env.close()
            raise EnvError(_no_rgb_array(env_id))
    env.action_space.seed(seed)
    return env


def check_rendering(env_id: str) -> None:
    """Before anything else of ``--video``: an env whose class declares its render modes
    records only with ``rgb_array`` among them."""
    modes = declared_render_modes(env_id)
    if modes is not None and "rgb_array" not in modes:
        raise EnvError(_no_rgb_array(env_id))


def _no_rgb_array(env_id: str) -> str:
    return (f"{env_id} has no rgb_array rendering, so --video cannot record it; "
            "evaluate without --video")


def _load_actor(algorithm: type[OffPolicyAlgorithm], cfg: Config, state: dict, env: gym.Env,
                device: torch.device, checkpoint: Path, actor: NetworkSpec | None = None,
                critic: NetworkSpec | None = None, *, member: int = 0) -> nn.Module:
    """The run's actor, built from its config as train built it (or from ``actor`` /
    ``critic`` where given), with the saved weights: for a group, those of its ``member``-th
    seed."""
    shown = display_path(str(checkpoint))
    weights = state["agent"].get("actor")
    if weights is None:
        raise CheckpointError(f"checkpoint {shown} has no actor weights (agent['actor'])")
    if is_on_policy(cfg.algo):  # built and checked as a single run builds it
        actor, _ = make_ppo_networks(algorithm, cfg, [cfg.seed_list[member]],
                                     env.observation_space, env.action_space, device, actor,
                                     critic)
    else:
        actor, _ = make_networks(algorithm, cfg, env.observation_space, env.action_space,
                                 device, actor, critic)
    try:
        if cfg.num_seeds > 1:
            weights = _member_weights(actor, weights, cfg.num_seeds, member)
        actor.load_state_dict(weights)
    except (RuntimeError, TypeError, KeyError, AttributeError, ValueError) as error:
        first = " ".join(str(error).split())[:300]
        raise CheckpointError(f"checkpoint {shown}: the saved actor does not fit the actor "
                              f"its config builds ({first})") from None
    # eval(): a custom actor's dropout or batch norm must not act as in training.
    return actor.eval()


def _saved_normalization(state: dict, env: gym.Env, device: torch.device, *, member: int,
                         form: NormalizationForm = REFERENCE_FORM
                         ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The ``--obs-norm`` statistics a run's ``member``-th seed acted through, frozen as they
    were saved (evaluating counts nothing), in the run's algorithm's ``form`` (PPO's clips);
    None for a run without them. (PPO's ``--reward-norm`` changes nothing the actor sees.)"""
    saved = state.get("obs_normalizer")
    if saved is None:
        return None
    seeds = int(np.asarray(saved["count"]).shape[0])
    normalizer = ObservationNormalizer(seeds, int(np.prod(env.observation_space.shape)), device,
                                       form=form)
    normalizer.load_state_dict(saved)
    return normalizer.member(member).normalize


def _member_weights(actor: nn.Module, weights: dict, num_seeds: int, member: int) -> dict:
    """Seed ``member``'s weights out of a group's stacked actor ``weights`` (keys
    ``stacked.<name>``, tensors (K, ...)): loaded into a stack of ``actor``'s layout, the
    checks ``load_state_dict`` makes, then that seed's slice."""
    stack = SeedStack([actor] * num_seeds)  # copies: actor itself is left as built
    stack.load_state_dict(weights)
    return stack.member(member).state_dict()


def check_video_dependency() -> None:
    # RecordVideo only imports moviepy when it writes the first video; fail before any episode.
    if importlib.util.find_spec("moviepy") is None:
        raise ConfigError(f"--video needs moviepy, which is not installed; "
                          f"run {VIDEO_INSTALL_HINT}")


def _record_video(env: gym.Env, cfg: Config, run_dir: Path, step: int,
                  group_seed: int | None = None) -> gym.Env:
    from gymnasium.wrappers import RecordVideo

    # One prefix per checkpoint (and per seed of a group), so evaluating a later checkpoint
    # or another seed does not overwrite videos.
    seed = "" if group_seed is None else f"__seed_{group_seed}"
    return RecordVideo(env, str(run_dir / VIDEO_DIR), episode_trigger=lambda _: True,
                       name_prefix=f"{cfg.env_id}__{cfg.algo}{seed}__step_{step:012d}")


def _act(actor: nn.Module, algorithm: type[OffPolicyAlgorithm], observations: torch.Tensor
         ) -> torch.Tensor:
    """The policy's deterministic action in [-1, 1] (see ``evaluation_action``; a SAC actor
    without ``deterministic_action`` gives a sample, and the summary says so)."""
    return evaluation_action(actor, algorithm.actor_kind, observations)


def _env_action(actor: nn.Module, algorithm: type, observations: torch.Tensor,
                space: gym.Space) -> np.ndarray | int:
    """The action the env takes for one observation (1, O): an off-policy actor's [-1, 1]
    action scaled onto the space; PPO's mean clipped to the space (as training clips its
    samples), or its most likely action's index."""
    if is_on_policy(algorithm.name):
        action = actor.deterministic_action(observations)[0].cpu().numpy()
        if isinstance(space, gym.spaces.Discrete):
            return int(action[0])
        return np.clip(action, space.low, space.high).astype(space.dtype, copy=False)
    action = _act(actor, algorithm, observations)[0].cpu().numpy()
    return scale_action(action, space.low, space.high).astype(space.dtype, copy=False)


@torch.no_grad()
def _run_episode(env: gym.Env, actor: nn.Module, algorithm: type[OffPolicyAlgorithm],
                 device: torch.device, seed: int,
                 normalize: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """The undiscounted return of one episode from ``env.reset(seed=seed)``; the actor sees
    the observations through ``normalize`` where given (a run trained with --obs-norm)."""
    space = env.action_space
    observation, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=device).unsqueeze(0)
        if normalize is not None:
            obs = normalize(obs)
        observation, reward, terminated, truncated, _ = env.step(
            _env_action(actor, algorithm, obs, space))
        total += float(reward)
        done = terminated or truncated
    return total
