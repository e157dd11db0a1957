"""`python -m rl_graphstep.evaluate runs/<run>`: the return of a trained policy's deterministic
actions over a few episodes, from the run's latest checkpoint; optionally recorded as video.
A seed group's run is evaluated seed by seed, each seed's actor as that seed alone would be,
into one table with the group's mean and IQM; ``--group-seed S`` evaluates one of them."""

from __future__ import annotations

if __name__ == "__main__":
    # Before every import below (torch takes seconds): a Ctrl-C during them is one line, exit 130.
    from rl_graphstep.run.cli import startup_guard

    startup_guard()

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from rl_graphstep.core.errors import (
    ConfigError,
    RLGraphstepError,
    display_path,
    os_error_line,
    type_name,
)
from rl_graphstep.networks.custom import NetworkSpec
from rl_graphstep.run.aggregate import group_returns
from rl_graphstep.run.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    run_folder_of,
)
from rl_graphstep.run.cli import (
    OneLineParser,
    argument_list,
    end_startup_guard,
    exit_quietly,
)
from rl_graphstep.run.console import say, seeds_text
from rl_graphstep.run.evaluation import (
    VIDEO_DIR,
    VIDEO_INSTALL_HINT,
    EvaluationResult,
    RunPolicies,
    check_rendering,
    check_video_dependency,
)
from rl_graphstep.run.folders import group_seed_folder
from rl_graphstep.run.netspec import run_relative
from rl_graphstep.run.rundir import check_writable_folder
from rl_graphstep.settings.config import Config, config_from_dict, saved_config_values
from rl_graphstep.settings.fieldtypes import user_path
from rl_graphstep.settings.plan import resolve_device
from rl_graphstep.settings.seedgroup import SEED_MAX

__all__ = ["EvaluationResult", "GroupEvaluation", "evaluate", "main"]

class GroupEvaluation(NamedTuple):
    """A seed group's evaluation: each seed's own :class:`EvaluationResult` and the
    statistics over the seeds' mean returns (``rl_graphstep.run.aggregate``)."""

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
        check_rendering(cfg.env_id)  # the env's own limit first: moviepy cannot lift it
        check_writable_folder(folder / VIDEO_DIR, "videos", " or evaluate without --video")
        check_video_dependency()
    run = RunPolicies(cfg, state, checkpoint, folder, torch_device, actor, critic)
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
