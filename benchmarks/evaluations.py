"""The table's evaluation column: each seed's deterministic evaluation of its group's final
checkpoint (``rl_graphstep.evaluate``, 10 episodes per seed), kept beside the group's training
returns, and what the table and its short form show of it.

    python benchmarks/table.py collect RUN_DIR [RUN_DIR ...] --evaluate   # also evaluates

Published figures are often evaluation returns (the TD3 paper, the SB3 zoo, the CrossQ
numbers of issue 52): for a group with an evaluation the table gives its IQM and 95%
bootstrap interval beside the training IQM, and judges the group within range by the mean of
its seeds' evaluations, like for like; groups without one are judged, as before, by their
training returns. The evaluation's episodes start from ``env.reset(seed=i)`` (episode i), so
evaluating the same checkpoint again on the same device writes the same file.

Kept as ``<env>__<name>__evaluation.csv`` in the results folder, by the group's name (its
algorithm, ``sac``, or its algorithm and regime, ``sac-32envs``: ``results.py``):
``seed,step,episodes,mean,std`` per seed (the checkpoint's env step, and the mean and std of
its episodes' returns).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from results import GROUPS_FILE, GroupResult, ResultsError
from runfolders import read_group

from rl_graphstep.core.errors import RLGraphstepError
from rl_graphstep.run.aggregate import bootstrap_interval, iqm
from rl_graphstep.run.checkpoint import checkpoint_step, find_checkpoint
from rl_graphstep.run.folders import group_seed_folder

EPISODES = 10
FIELDS = ["seed", "step", "episodes", "mean", "std"]


@dataclass(frozen=True)
class SeedEvaluation:
    """One seed's evaluation: the checkpoint's env step, its episodes, their mean and std."""

    seed: int
    step: int
    episodes: int
    mean: float
    std: float


@dataclass(frozen=True)
class GroupEvaluations:
    """A group's evaluations, one per seed, in seed order."""

    seeds: list[SeedEvaluation]

    def means(self) -> np.ndarray:
        """Each seed's mean evaluation return, in seed order."""
        return np.array([s.mean for s in self.seeds])

    def cell(self) -> str:
        """The table's cell: the IQM of the seeds' means with its 95% bootstrap interval."""
        means = self.means()
        low, high = bootstrap_interval(means, iqm)
        return f"{iqm(means):,.0f} [{low:,.0f}, {high:,.0f}]"

    def note(self) -> str:
        """What was evaluated, and each seed's mean: ``step 1,000,000, 10 episodes per seed;
        1: 10,233, 2: ...; mean 10,100 ± 120``."""
        steps = sorted({s.step for s in self.seeds})
        episodes = sorted({s.episodes for s in self.seeds})
        means = self.means()
        return (f"the checkpoint of step {' / '.join(f'{s:,}' for s in steps)}, "
                f"{' / '.join(map(str, episodes))} deterministic episodes per seed; "
                + ", ".join(f"{s.seed}: {s.mean:,.0f}" for s in self.seeds)
                + f"; mean {means.mean():,.0f} ± {means.std():,.0f}")


def evaluations_file(results_dir: Path, env_id: str, name: str) -> Path:
    """``<env>__<name>__evaluation.csv``, beside the group's ``<env>__<name>.csv`` (its name:
    ``sac``, or ``sac-32envs`` for a variant)."""
    return results_dir / f"{env_id}__{name}__evaluation.csv"


def evaluate_run(path: Path, episodes: int, device: str) -> tuple[GroupResult, GroupEvaluations]:
    """A run folder's group (as ``collect`` reads it) and its seeds' evaluations of the run's
    latest checkpoint (``rl_graphstep.evaluate``; a group's seed folder: that seed's)."""
    from rl_graphstep.evaluate import GroupEvaluation, evaluate

    group = read_group(path)
    seed_folder = group_seed_folder(path)
    try:
        # The file itself, so that the step written is the one evaluated.
        checkpoint = find_checkpoint(seed_folder[0] if seed_folder else path)
        found = evaluate(path if seed_folder else checkpoint, episodes=episodes,
                         device=device, verbose=False)
    except RLGraphstepError as error:
        raise ResultsError(f"{path}: cannot evaluate ({error})") from None
    step = checkpoint_step(checkpoint) or 0
    if isinstance(found, GroupEvaluation):
        pairs = list(zip(found.seeds, found.results, strict=True))
    else:
        pairs = [(group.seeds[0], found)]
    if sorted(seed for seed, _ in pairs) != sorted(group.seeds):
        raise ResultsError(f"{path}: its checkpoint's seeds are not those its logs show")
    return group, GroupEvaluations([
        SeedEvaluation(seed, step, len(result.returns), result.mean, result.std)
        for seed, result in sorted(pairs, key=lambda pair: pair[0])])


def collect_evaluations(paths: Sequence[Path], results_dir: Path, episodes: int = EPISODES,
                        device: str = "auto") -> dict[tuple[str, str], GroupEvaluations]:
    """Evaluate every run folder and keep each group's (pooled by algorithm, regime and task,
    as ``collect`` pools its runs) as ``<env>__<name>__evaluation.csv``, replacing an earlier
    one. Returns them by group key, (env_id, name)."""
    pooled: dict[tuple[str, str], list[SeedEvaluation]] = {}
    for path in paths:
        group, evaluated = evaluate_run(path, episodes, device)
        into = pooled.setdefault(group.key, [])
        clash = {s.seed for s in into} & {s.seed for s in evaluated.seeds}
        if clash:
            raise ResultsError(f"{group.label} on {group.env_id}: seed {min(clash)} appears "
                               "in two runs; give each seed once")
        into.extend(evaluated.seeds)
    results_dir.mkdir(parents=True, exist_ok=True)
    kept = {}
    for (env_id, name), seeds in pooled.items():
        kept[(env_id, name)] = GroupEvaluations(sorted(seeds, key=lambda s: s.seed))
        with evaluations_file(results_dir, env_id, name).open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(FIELDS)
            for s in kept[(env_id, name)].seeds:
                writer.writerow([s.seed, s.step, s.episodes, f"{s.mean:.2f}", f"{s.std:.2f}"])
    return kept


def load_evaluations(results_dir: Path, groups: Sequence[GroupResult]
                     ) -> dict[tuple[str, str], GroupEvaluations]:
    """The kept evaluations of the groups that have one; each must be of its group's seeds
    (a group collected again without evaluating them would otherwise show stale ones)."""
    found = {}
    for group in groups:
        path = evaluations_file(results_dir, group.env_id, group.name)
        if not path.exists():
            continue
        try:
            with path.open(newline="") as file:
                reader = csv.DictReader(file)
                if reader.fieldnames != FIELDS:
                    raise ValueError(f"its header is not {','.join(FIELDS)}")
                seeds = [SeedEvaluation(int(row["seed"]), int(row["step"]),
                                        int(row["episodes"]), float(row["mean"]),
                                        float(row["std"])) for row in reader]
        except (OSError, ValueError, TypeError) as err:
            raise ResultsError(f"{path}: not a {','.join(FIELDS)} CSV ({err})") from err
        if [s.seed for s in seeds] != group.seeds:
            raise ResultsError(
                f"{path}: seeds {' '.join(str(s.seed) for s in seeds) or 'none'}, but "
                f"{GROUPS_FILE} has {' '.join(map(str, group.seeds))}; collect the group's "
                "runs again with --evaluate, or delete the file")
        found[group.key] = GroupEvaluations(seeds)
    return found


def judged_returns(group: GroupResult,
                   evaluations: Mapping[tuple[str, str], GroupEvaluations] | None
                   ) -> np.ndarray:
    """The per-seed returns a group is judged by against its reference: its evaluations'
    means where it has them, else its training finals."""
    evaluated = (evaluations or {}).get(group.key)
    return group.finals() if evaluated is None else evaluated.means()


def table_notes(groups: Sequence[GroupResult],
                evaluations: Mapping[tuple[str, str], GroupEvaluations]) -> str:
    """The lines under the table saying which returns each judgement used, and what each
    evaluation was (empty where no group has one: the table then reads as before)."""
    if not evaluations:
        return ""
    lines = ["", "Within range: judged by the mean of the seeds' deterministic evaluations "
             "(the Evaluation IQM column's returns) for the groups marked (evaluation), "
             "against the first published reference; by the mean of the last 10 training "
             "episodes (the Mean ± std column) for the others.", ""]
    for group in sorted(groups, key=lambda g: g.key):
        evaluated = evaluations.get(group.key)
        if evaluated is not None:
            lines.append(f"- {group.label} on {group.env_id}, evaluation: "
                         f"{evaluated.note()}.")
    return "\n".join(lines) + "\n"


def plot_evaluation(ax: Any, label: str, evaluation: GroupEvaluations, color: str) -> None:
    """On a task's figure: the evaluation IQM with its 95% interval as a point at the step of
    the checkpoint evaluated, in the group's colour, named by its ``label`` (``SAC``,
    ``SAC, 32 envs``)."""
    means = evaluation.means()
    point = float(iqm(means))
    low, high = bootstrap_interval(means, iqm)
    step = max(s.step for s in evaluation.seeds)
    ax.errorbar([step], [point], yerr=[[point - low], [high - point]], fmt="D", color=color,
                capsize=5, markersize=7, label=f"{label} evaluation IQM (95% CI)")
