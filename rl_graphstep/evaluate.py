"""`python -m rl_graphstep.evaluate runs/<run>`: the return of a trained policy's deterministic
actions over a few episodes, from the run's latest checkpoint; optionally recorded as video."""

from __future__ import annotations

if __name__ == "__main__":
    # Before every import below (torch takes seconds): a Ctrl-C during them is one line, exit 130.
    from rl_graphstep.cli import startup_guard

    startup_guard()

import argparse
import dataclasses
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium import error as gym_error
from torch import nn

from rl_graphstep.algorithms import ALGORITHMS, OffPolicyAlgorithm
from rl_graphstep.checkpoint import CHECKPOINT_DIR, find_checkpoint, load_checkpoint
from rl_graphstep.cli import OneLineParser, end_startup_guard, exit_quietly
from rl_graphstep.config import SEED_MAX, Config, config_from_dict, saved_config_values
from rl_graphstep.envs import check_continuous_spaces, make_vec_env, scale_action, seed_everything
from rl_graphstep.errors import (
    CheckpointError,
    ConfigError,
    EnvError,
    RLGraphstepError,
    display_path,
)
from rl_graphstep.netcheck import evaluation_action
from rl_graphstep.netspec import make_networks, run_relative
from rl_graphstep.plan import resolve_device
from rl_graphstep.plugins import NetworkSpec

__all__ = ["EvaluationResult", "evaluate", "main"]

VIDEO_INSTALL_HINT = 'pip install "rl_graphstep[video]"'


class EvaluationResult(NamedTuple):
    """The returns of the evaluation episodes."""

    mean: float
    """Mean return over the episodes."""
    std: float
    """Standard deviation of the returns (population, 0 for one episode)."""
    returns: list[float]
    """The undiscounted return of each episode, in order."""


def evaluate(run_dir: Path | str, episodes: int = 10, seed: int = 0, device: str = "auto",
             video: bool = False, *, verbose: bool = True, actor: NetworkSpec | None = None,
             critic: NetworkSpec | None = None) -> EvaluationResult:
    """Run ``episodes`` episodes of the latest checkpoint's policy, acting deterministically.

    Episode ``i`` starts from ``env.reset(seed=seed + i)``, so two evaluations with one seed
    see the same episodes, and each episode can be replayed alone.

    Args:
        run_dir: a run folder (its latest checkpoint is taken) or a checkpoint ``.pt`` file.
        episodes: how many episodes, at least 1.
        seed: seed of the episodes (and of python, numpy and torch), at least 0.
        device: where the actor runs: ``auto`` (CUDA if available), ``cpu`` or ``cuda``.
        video: record every episode into ``<run_dir>/videos/`` (needs moviepy and an env
            with ``rgb_array`` rendering).
        verbose: print the one-line summary
            (``Pendulum-v1, sac, step 15000: mean return -150.2 ± 12.3 over 10 episodes``),
            which ends in ``(stochastic actions: ...)`` for a SAC actor without
            ``deterministic_action``.
        actor, critic: the classes (or specs) to build instead of those the run recorded,
            for a run trained with a class that cannot be imported again (one defined inside
            a function or in an interactive session); the weights are the checkpoint's.

    Raises:
        RLGraphstepError: one line for a missing or broken checkpoint, a bad argument, an env
            that cannot be made or rendered, or a missing video dependency.
    """
    if episodes < 1:
        raise ConfigError(f"--episodes must be a positive int, got {episodes}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    if seed > SEED_MAX:
        raise ConfigError(f"--seed must be at most {SEED_MAX} (2**32 - 1, numpy's seed "
                          f"range), got {seed}")
    checkpoint = find_checkpoint(run_dir)
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(saved_config_values(state["config"]),
                           source=f"checkpoint {display_path(str(checkpoint))}")
    # File networks are recorded relative to the run folder, where the run keeps their copies.
    folder = _run_folder(checkpoint)
    cfg = dataclasses.replace(cfg, actor=run_relative(cfg.actor, folder),
                              critic=run_relative(cfg.critic, folder))
    # Config checks the device choice, so a bad --device reads like train's.
    torch_device = resolve_device(dataclasses.replace(cfg, device=device))
    if video:
        _check_video_dependency()
    seed_everything(seed)

    env = _make_env(cfg.env_id, seed, render=video)
    try:
        check_continuous_spaces(cfg.env_id, env.observation_space, env.action_space, cfg.algo)
        algorithm = ALGORITHMS[cfg.algo]
        policy = _load_actor(algorithm, cfg, state, env, torch_device, checkpoint, actor, critic)
        if video:
            env = _record_video(env, cfg, folder, int(state["global_step"]))
        returns = [_run_episode(env, policy, algorithm, torch_device, seed + i)
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
    if verbose:
        print(f"{cfg.env_id}, {cfg.algo}, step {state['global_step']}: mean return "
              f"{result.mean:.1f} ± {result.std:.1f} over {episodes} "
              f"episode{'s' if episodes > 1 else ''}{_stochastic_note(policy, algorithm)}")
    return result


def _stochastic_note(actor: nn.Module, algorithm: type[OffPolicyAlgorithm]) -> str:
    """What the summary adds when the returns are not of deterministic actions."""
    if algorithm.actor_kind == "stochastic" and not callable(
            getattr(actor, "deterministic_action", None)):
        return f" (stochastic actions: {type(actor).__name__} has no deterministic_action)"
    return ""


def _make_env(env_id: str, seed: int, *, render: bool) -> gym.Env:
    """A single env (plain episodes need no vector env's autoreset)."""
    try:
        env = gym.make(env_id, render_mode="rgb_array" if render else None)
    except gym_error.Error:
        # make_vec_env owns the clear messages for an unknown id or a missing MuJoCo; if it
        # somehow succeeds where gym.make failed, the original error stands.
        make_vec_env(env_id, num_envs=1, seed=seed).close()
        raise
    env.action_space.seed(seed)
    if render and "rgb_array" not in env.metadata.get("render_modes", []):
        env.close()
        raise EnvError(f"{env_id} has no rgb_array rendering, so --video cannot record it; "
                       "evaluate without --video")
    return env


def _load_actor(algorithm: type[OffPolicyAlgorithm], cfg: Config, state: dict, env: gym.Env,
                device: torch.device, checkpoint: Path, actor: NetworkSpec | None = None,
                critic: NetworkSpec | None = None) -> nn.Module:
    """The run's actor, built from its config as train built it (or from ``actor`` /
    ``critic`` where given), with the saved weights."""
    shown = display_path(str(checkpoint))
    weights = state["agent"].get("actor")
    if weights is None:
        raise CheckpointError(f"checkpoint {shown} has no actor weights (agent['actor'])")
    actor, _ = make_networks(algorithm, cfg, env.observation_space, env.action_space, device,
                             actor, critic)
    try:
        actor.load_state_dict(weights)
    except (RuntimeError, TypeError, KeyError, AttributeError) as error:
        first = " ".join(str(error).split())[:300]
        raise CheckpointError(f"checkpoint {shown}: the saved actor does not fit the actor "
                              f"its config builds ({first})") from None
    # eval(): a custom actor's dropout or batch norm must not act as in training.
    return actor.eval()


def _run_folder(checkpoint: Path) -> Path:
    """The run folder of a checkpoint file (``runs/x/checkpoints/step_*.pt`` -> ``runs/x``)."""
    folder = checkpoint.parent
    return folder.parent if folder.name == CHECKPOINT_DIR else folder


def _check_video_dependency() -> None:
    # RecordVideo only imports moviepy when it writes the first video; fail before any episode.
    if importlib.util.find_spec("moviepy") is None:
        raise ConfigError(f"--video needs moviepy, which is not installed; "
                          f"run {VIDEO_INSTALL_HINT}")


def _record_video(env: gym.Env, cfg: Config, run_dir: Path, step: int) -> gym.Env:
    from gymnasium.wrappers import RecordVideo

    # One prefix per checkpoint, so evaluating a later checkpoint does not overwrite videos.
    return RecordVideo(env, str(run_dir / "videos"), episode_trigger=lambda _: True,
                       name_prefix=f"{cfg.env_id}__{cfg.algo}__step_{step:012d}")


def _act(actor: nn.Module, algorithm: type[OffPolicyAlgorithm], observations: torch.Tensor
         ) -> torch.Tensor:
    """The policy's deterministic action in [-1, 1] (see ``evaluation_action``; a SAC actor
    without ``deterministic_action`` gives a sample, and the summary says so)."""
    return evaluation_action(actor, algorithm.actor_kind, observations)


@torch.no_grad()
def _run_episode(env: gym.Env, actor: nn.Module, algorithm: type[OffPolicyAlgorithm],
                 device: torch.device, seed: int) -> float:
    """The undiscounted return of one episode from ``env.reset(seed=seed)``."""
    space = env.action_space
    observation, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=device).unsqueeze(0)
        action = _act(actor, algorithm, obs)[0].cpu().numpy()
        observation, reward, terminated, truncated, _ = env.step(
            scale_action(action, space.low, space.high).astype(space.dtype, copy=False))
        total += float(reward)
        done = terminated or truncated
    return total


def build_parser() -> argparse.ArgumentParser:
    """The evaluation command line (one-line errors, no abbreviated flags)."""
    parser = OneLineParser(
        prog="python -m rl_graphstep.evaluate",
        description="Evaluate the latest checkpoint of a run with deterministic actions.",
    )
    parser.add_argument("run", metavar="RUN",
                        help="run folder (its latest checkpoint) or a checkpoint .pt file")
    parser.add_argument("--episodes", type=int, default=10, help="episodes (default: 10)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first episode; episode i uses seed + i (default: 0)")
    parser.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}",
                        help="where the actor runs (default: auto, cuda if available)")
    parser.add_argument("--video", action="store_true",
                        help=f"record the episodes into RUN/videos/ (needs {VIDEO_INSTALL_HINT})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: one clear line and exit 2 on bad input, 130 on Ctrl-C."""
    try:
        end_startup_guard()  # from here on a Ctrl-C is the KeyboardInterrupt handled below
        args = build_parser().parse_args(argv)
        evaluate(args.run, episodes=args.episodes, seed=args.seed, device=args.device,
                 video=args.video)
    except RLGraphstepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    exit_quietly(main())
