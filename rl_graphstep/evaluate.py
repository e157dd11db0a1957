"""`python -m rl_graphstep.evaluate runs/<run>`: the return of a trained policy's deterministic
actions over a few episodes, from the run's latest checkpoint; optionally recorded as video.
A seed group's run is evaluated seed by seed, each seed's actor as that seed alone would be,
into one table with the group's mean and IQM; ``--group-seed S`` evaluates one of them."""

from __future__ import annotations

if __name__ == "__main__":
    # Before every import below (torch takes seconds): a Ctrl-C during them is one line, exit 130.
    from rl_graphstep.cli import startup_guard

    startup_guard()

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium import error as gym_error
from torch import nn

from rl_graphstep.aggregate import group_returns
from rl_graphstep.algorithms import ALGORITHMS, OffPolicyAlgorithm
from rl_graphstep.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    run_folder_of,
)
from rl_graphstep.cli import (
    OneLineParser,
    argument_list,
    end_startup_guard,
    exit_quietly,
    type_name,
)
from rl_graphstep.config import SEED_MAX, Config, config_from_dict, saved_config_values
from rl_graphstep.console import say, seeds_text
from rl_graphstep.envmake import declared_render_modes, make_env
from rl_graphstep.envs import (
    check_continuous_spaces,
    check_trained_observations,
    scale_action,
    seed_everything,
)
from rl_graphstep.errors import (
    CheckpointError,
    ConfigError,
    EnvError,
    RLGraphstepError,
    display_path,
    os_error_line,
)
from rl_graphstep.netcheck import evaluation_action
from rl_graphstep.netspec import make_networks, run_relative
from rl_graphstep.plan import resolve_device
from rl_graphstep.plugins import NetworkSpec, load_network_classes
from rl_graphstep.rundir import check_writable_folder
from rl_graphstep.runfolders import group_seed_folder, user_path
from rl_graphstep.seeds import SeedStack

__all__ = ["EvaluationResult", "GroupEvaluation", "evaluate", "main"]

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


class GroupEvaluation(NamedTuple):
    """A seed group's evaluation: each seed's own :class:`EvaluationResult` and the
    statistics over the seeds' mean returns (``rl_graphstep.aggregate``)."""

    seeds: tuple[int, ...]
    """The group's seeds, in the group's order."""
    results: tuple[EvaluationResult, ...]
    """Seed ``seeds[k]``'s evaluation at index k, as evaluating that seed alone gives it."""
    mean: float
    """Mean over the seeds of their mean returns."""
    min: float
    """The lowest of the seeds' mean returns."""
    iqm: float
    """Interquartile mean of the seeds' mean returns."""
    iqm_low: float
    """Lower end of the IQM's 95% percentile-bootstrap band over the seeds."""
    iqm_high: float
    """Upper end of that band."""

    def of(self, seed: int) -> EvaluationResult:
        """The evaluation of the group's seed ``seed`` (a seed, not an index)."""
        return self.results[self.seeds.index(seed)]


def evaluate(run_dir: Path | str, episodes: int = 10, seed: int = 0, device: str = "auto",
             video: bool = False, *, verbose: bool = True, actor: NetworkSpec | None = None,
             critic: NetworkSpec | None = None, group_seed: int | None = None
             ) -> EvaluationResult | GroupEvaluation:
    """Run ``episodes`` episodes of the latest checkpoint's policy, acting deterministically.

    Episode ``i`` starts from ``env.reset(seed=seed + i)``, so two evaluations with one seed
    see the same episodes, and each episode can be replayed alone.

    A seed group's run (trained with ``--num-seeds`` or ``--seeds``) gives a
    :class:`GroupEvaluation`: every seed's actor, built as the config builds it with that
    seed's weights, runs in an env of its own seeded as above, so seed k's result is exactly
    what evaluating a single run with seed k's weights gives. ``group_seed`` (or the path
    ``<group>/seed_<s>``, the seed's log folder) evaluates one seed of a group alone and gives
    its :class:`EvaluationResult`. A single run gives its :class:`EvaluationResult`.

    Args:
        run_dir: a run folder (its latest checkpoint is taken), a checkpoint ``.pt`` file, or
            a group's seed folder ``<group>/seed_<s>`` (seed ``s`` of the group's latest).
        episodes: how many episodes, at least 1 (per seed, for a group).
        seed: seed of the episodes (and of python, numpy and torch), at least 0.
        device: where the actor runs: ``auto`` (CUDA if available), ``cpu`` or ``cuda``.
        video: record every episode into ``<run_dir>/videos/`` (needs moviepy and an env
            with ``rgb_array`` rendering).
        verbose: print the one-line summary
            (``Pendulum-v1, sac, step 15000: mean return -150.2 ± 12.3 over 10 episodes``),
            which ends in ``(stochastic actions: ...)`` for a SAC actor without
            ``deterministic_action``; for a group, a table of a row per seed and one for
            the group.
        actor, critic: the classes (or specs) to build instead of those the run recorded,
            for a run trained with a class that cannot be imported again (one defined inside
            a function or in an interactive session); the weights are the checkpoint's.
        group_seed: the one seed of a group to evaluate (one of its training seeds).

    Raises:
        RLGraphstepError: one line for a missing or broken checkpoint, a bad argument (a
            ``group_seed`` that is not one of the group's, or given for a single run), an env
            that cannot be made or rendered, or a missing video dependency.
    """
    _check_types(run_dir, episodes=episodes, seed=seed, group_seed=group_seed)
    if episodes < 1:
        raise ConfigError(f"--episodes must be a positive int, got {episodes}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    if seed > SEED_MAX:
        raise ConfigError(f"--seed must be at most {SEED_MAX} (2**32 - 1, numpy's seed "
                          f"range), got {seed}")
    asked = "" if group_seed is None else f"--group-seed {group_seed}"
    run_dir, group_seed, asked = _seed_folder(run_dir, group_seed, asked)
    checkpoint = find_checkpoint(run_dir)
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(saved_config_values(state["config"]),
                           source=f"checkpoint {display_path(str(checkpoint))}")
    # File networks are recorded relative to the run folder, where the run keeps their copies.
    folder = run_folder_of(checkpoint)
    cfg = dataclasses.replace(cfg, actor=run_relative(cfg.actor, folder),
                              critic=run_relative(cfg.critic, folder))
    members = _members(cfg, group_seed, asked, checkpoint)
    # Config checks the device choice, so a bad --device reads like train's.
    torch_device = resolve_device(dataclasses.replace(cfg, device=device))
    if video:  # all before any episode is run
        _check_rendering(cfg.env_id)  # the env's own limit first: moviepy cannot lift it
        check_writable_folder(folder / VIDEO_DIR, "videos", " or evaluate without --video")
        _check_video_dependency()
    run = _Run(cfg, state, checkpoint, folder, torch_device, actor, critic)
    evaluated = [run.evaluate_seed(k, episodes, seed, video) for k in members]
    note = evaluated[0][1]
    if cfg.num_seeds == 1 or group_seed is not None:
        result = evaluated[0][0]
        if verbose:
            tag = "" if cfg.num_seeds == 1 else f", seed {group_seed}"
            say(f"{cfg.env_id}, {cfg.algo}{tag}, step {state['global_step']}: mean return "
                f"{result.mean:.1f} ± {result.std:.1f} over {episodes} "
                f"episode{'s' if episodes > 1 else ''}{note}")
        return result
    group = _group_evaluation(cfg.seed_list, [result for result, _ in evaluated])
    if verbose:
        say(group_table(group, f"{cfg.env_id}, {cfg.algo}, step {state['global_step']}",
                        episodes, note))
    return group


def _check_types(run_dir: object, **counts: object) -> None:
    """A Python caller's argument of the wrong type is a ``TypeError`` naming what to pass
    (None or a string would otherwise fail deep in pathlib or in a comparison)."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError("evaluate() takes a run folder or a checkpoint file, as a str or a Path "
                        f"such as 'runs/<run>', got {type_name(run_dir)}")
    for name, value in counts.items():
        if (value is not None or name != "group_seed") and (
                isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"evaluate()'s {name} must be an int, got {value!r} "
                            f"({type_name(value)})")


def _seed_folder(run_dir: Path | str, group_seed: int | None, asked: str
                 ) -> tuple[Path | str, int | None, str]:
    """A group's seed folder ``<group>/seed_<s>`` as the group's folder and seed ``s`` (the
    folder holds that seed's logs, the group's folder its checkpoints); other paths as given.
    ``asked``: how the seed was asked for, for the messages."""
    path = user_path(run_dir)
    seed_folder = group_seed_folder(path)
    if seed_folder is None:
        return run_dir, group_seed, asked
    named, shown = seed_folder[1], display_path(str(path))
    if group_seed is not None and group_seed != named:
        raise ConfigError(f"{asked} and the seed folder {shown} name two different seeds; "
                          "give one of them")
    return path.parent, named, f"seed folder {shown}"


def _members(cfg: Config, group_seed: int | None, asked: str, checkpoint: Path) -> list[int]:
    """The indices, along the group's seed dimension, of the seeds to evaluate."""
    seeds = cfg.seed_list
    if group_seed is None:
        return list(range(len(seeds)))
    shown = display_path(str(checkpoint))
    if len(seeds) == 1:
        raise ConfigError(f"{asked} picks a seed of a group, but checkpoint {shown} is of a "
                          f"single run (seed {seeds[0]}); evaluate the run itself")
    if group_seed not in seeds:
        raise ConfigError(f"{asked}: seed {group_seed} is not in the group of checkpoint "
                          f"{shown}, whose seeds are {', '.join(map(str, seeds))}")
    return [seeds.index(group_seed)]


def _group_evaluation(seeds: tuple[int, ...], results: list[EvaluationResult]
                      ) -> GroupEvaluation:
    stats = group_returns([r.returns for r in results])
    assert stats is not None  # every seed has at least one episode
    return GroupEvaluation(seeds, tuple(results), stats["mean"], stats["min"], stats["iqm"],
                           stats["iqm_low"], stats["iqm_high"])


def group_table(group: GroupEvaluation, title: str, episodes: int, note: str = "") -> str:
    """The group's evaluation as printed: a title line, a row per seed (its mean return ± the
    std over its episodes) and a row for the group (the mean over the seeds, the IQM and its
    95% bootstrap band)::

        Pendulum-v1, sac, step 300, seeds 1-2: 10 episodes per seed
         seed  mean return
            1   -898.4 ± 12.3
            2  -1280.0 ± 40.1
        group  mean -1089.2, IQM -1089.2 [95% -1280.0, -898.4]
    """
    per = f"{episodes} episode{'s' if episodes > 1 else ''} per seed"
    width = max(len("group"), *(len(str(s)) for s in group.seeds))
    rows = [f"{title}, seeds {seeds_text(group.seeds)}: {per}{note}",
            f"{'seed':>{width}}  mean return"]
    means = [f"{r.mean:.1f}" for r in group.results]
    stds = [f"{r.std:.1f}" for r in group.results]
    mean_width, std_width = max(map(len, means)), max(map(len, stds))
    rows += [f"{seed:>{width}}  {mean:>{mean_width}} ± {std:>{std_width}}"
             for seed, mean, std in zip(group.seeds, means, stds, strict=True)]
    rows.append(f"{'group':>{width}}  mean {group.mean:.1f}, IQM {group.iqm:.1f} "
                f"[95% {group.iqm_low:.1f}, {group.iqm_high:.1f}]")
    return "\n".join(rows)


class _Run:
    """What every seed's evaluation shares: the checkpoint, its config and the device."""

    def __init__(self, cfg: Config, state: dict, checkpoint: Path, folder: Path,
                 device: torch.device, actor: NetworkSpec | None,
                 critic: NetworkSpec | None) -> None:
        self.cfg, self.state, self.checkpoint, self.folder = cfg, state, checkpoint, folder
        # Loaded once for all seeds, as train does (a file loaded per seed runs it again).
        self.actor, self.critic = load_network_classes((actor or cfg.actor, "actor"),
                                                       (critic or cfg.critic, "critic"))
        self.device = device
        self.algorithm = ALGORITHMS[cfg.algo]

    def evaluate_seed(self, k: int, episodes: int, seed: int, video: bool
                      ) -> tuple[EvaluationResult, str]:
        """The episodes of the run's ``k``-th seed (0 for a single run), each step as a
        single run's evaluation takes it, from ``seed_everything(seed)`` on; and the
        summary's note on stochastic actions."""
        cfg, algorithm = self.cfg, self.algorithm
        seed_everything(seed)
        env = _make_env(cfg.env_id, seed, render=video)
        try:
            check_continuous_spaces(cfg.env_id, env.observation_space, env.action_space,
                                    cfg.algo)
            check_trained_observations(cfg.env_id, env.observation_space, self.state,
                                       f"checkpoint {display_path(str(self.checkpoint))}",
                                       "evaluate")
            policy = _load_actor(algorithm, cfg, self.state, env, self.device, self.checkpoint,
                                 self.actor, self.critic, member=k)
            if video:
                env = _record_video(env, cfg, self.folder, int(self.state["global_step"]),
                                    None if cfg.num_seeds == 1 else cfg.seed_list[k])
            returns = [_run_episode(env, policy, algorithm, self.device, seed + i)
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
    if algorithm.actor_kind == "stochastic" and not callable(
            getattr(actor, "deterministic_action", None)):
        return f" (stochastic actions: {type(actor).__name__} has no deterministic_action)"
    return ""


def _make_env(env_id: str, seed: int, *, render: bool) -> gym.Env:
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


def _check_rendering(env_id: str) -> None:
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
    actor, _ = make_networks(algorithm, cfg, env.observation_space, env.action_space, device,
                             actor, critic)
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


def _member_weights(actor: nn.Module, weights: dict, num_seeds: int, member: int) -> dict:
    """Seed ``member``'s weights out of a group's stacked actor ``weights`` (keys
    ``stacked.<name>``, tensors (K, ...)): loaded into a stack of ``actor``'s layout, the
    checks ``load_state_dict`` makes, then that seed's slice."""
    stack = SeedStack([actor] * num_seeds)  # copies: actor itself is left as built
    stack.load_state_dict(weights)
    return stack.member(member).state_dict()


def _check_video_dependency() -> None:
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
        description="Evaluate the latest checkpoint of a run with deterministic actions; "
                    "a seed group's run seed by seed, in one table.",
    )
    parser.add_argument("run", metavar="RUN",
                        help="run folder (its latest checkpoint), a checkpoint .pt file, or a "
                             "group's seed folder RUN/seed_S (that seed alone)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes (default: 10)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first episode; episode i uses seed + i (default: 0)")
    parser.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}",
                        help="where the actor runs (default: auto, cuda if available)")
    parser.add_argument("--group-seed", type=int, default=None, metavar="S",
                        help="evaluate seed S of a seed group alone (default: every seed)")
    parser.add_argument("--video", action="store_true",
                        help=f"record the episodes into RUN/videos/ (needs {VIDEO_INSTALL_HINT})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: one clear line and exit 2 on bad input, 130 on Ctrl-C."""
    try:
        end_startup_guard()  # from here on a Ctrl-C is the KeyboardInterrupt handled below
        args = build_parser().parse_args(argument_list(
            argv, "rl_graphstep.evaluate.main()", "['runs/<run>', '--episodes', '10']"))
        result = evaluate(args.run, episodes=args.episodes, seed=args.seed,
                          device=args.device, video=args.video, group_seed=args.group_seed)
    except RLGraphstepError as error:
        say(f"error: {error}", sys.stderr)
        return 2
    except OSError as error:
        say(f"error: {os_error_line(error)}", sys.stderr)
        return 2
    except KeyboardInterrupt:
        say("stopped: interrupted before the evaluation ended (no result)", sys.stderr)
        return 130
    problem = nonfinite_returns(result)
    if problem:
        say(f"error: {problem}", sys.stderr)
        return NONFINITE_EXIT
    return 0


NONFINITE_EXIT = 3
"""evaluate's exit code when episodes returned no finite score (train's exit 3 for a run that
did not learn)."""


def nonfinite_returns(result: EvaluationResult | GroupEvaluation) -> str | None:
    """Why the printed means are no score, or None: episodes whose return was NaN or
    infinite (the environment's rewards were not finite), which the means then carry."""
    results = [result] if isinstance(result, EvaluationResult) else list(result.results)
    returns = [r for one in results for r in one.returns]
    bad = sum(not math.isfinite(r) for r in returns)
    if not bad:
        return None
    return (f"{bad} of {len(returns)} episode{'s' if len(returns) > 1 else ''} returned a "
            "non-finite return (the environment's rewards were NaN or infinite), so the mean "
            "above is no score; check the rewards the environment returns")


if __name__ == "__main__":
    exit_quietly(main())
