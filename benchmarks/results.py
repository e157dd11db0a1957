"""A benchmark's results read from its run folders and kept as CSV files: every seed's episode
returns, and each group's steps, wall time and env steps/s, so that ``table.py report`` can
rebuild the table and the figures without the runs.

A *group* is one algorithm on one task over several seeds: a seed group's folder
(``--num-seeds K``: ``seed_<s>/`` runs inside, and ``aggregate/``), or single-seed run
folders of the same algorithm and task, which are pooled.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from plot_curve import last_per_step
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

RETURN_TAG = "charts/episodic_return"
CONFIG_TAG = "hyperparameters/text_summary"
LAST_EPISODES = 10
GROUPS_FILE = "groups.csv"
GROUP_FIELDS = ["env_id", "algo", "seeds", "steps", "wall_s", "env_steps_per_s"]


class ResultsError(Exception):
    """A run folder or results file that cannot be read; shown as a one-line error."""


@dataclass
class SeedCurve:
    """One seed's episodes: the env step each ended at and its return, in step order."""

    seed: int
    steps: np.ndarray
    returns: np.ndarray

    def final(self, last: int = LAST_EPISODES) -> float:
        """The mean return of the seed's last ``last`` episodes."""
        return float(self.returns[-last:].mean())


@dataclass
class GroupResult:
    """One algorithm on one task over its seeds, and what the group cost."""

    env_id: str
    algo: str
    curves: list[SeedCurve]
    steps: int  # env steps each seed made
    wall_s: float  # the training processes' wall time, summed over a resumed run's parts

    @property
    def key(self) -> tuple[str, str]:
        return self.env_id, self.algo

    @property
    def seeds(self) -> list[int]:
        return [curve.seed for curve in self.curves]

    def finals(self, last: int = LAST_EPISODES) -> np.ndarray:
        """Each seed's mean return over its last ``last`` episodes, in seed order."""
        return np.array([curve.final(last) for curve in self.curves])

    @property
    def env_steps_per_s(self) -> float:
        """Env steps of all seeds together per second of wall time."""
        return len(self.curves) * self.steps / self.wall_s if self.wall_s > 0 else float("nan")


def _config(run_dir: Path, events: EventAccumulator) -> dict[str, str]:
    """The run's hyperparameters table (markdown ``| key | value |`` rows) as a dict."""
    if CONFIG_TAG not in events.Tags().get("tensors", []):
        raise ResultsError(f"{run_dir}: no hyperparameters table; is it a training run folder?")
    text = events.Tensors(CONFIG_TAG)[0].tensor_proto.string_val[0].decode()
    rows = (line.strip().strip("|").split("|") for line in text.splitlines())
    return {key.strip(): value.strip() for key, value, *_ in (r for r in rows if len(r) >= 2)}


def _wall_time(run_dir: Path) -> tuple[float, int]:
    """The wall time the folder's event files span, each file (one process) on its own and
    summed, and the last step any event records."""
    total, last_step = 0.0, 0
    for path in sorted(run_dir.glob("*tfevents*")):
        times = []
        for event in EventFileLoader(str(path)).Load():
            times.append(event.wall_time)
            last_step = max(last_step, event.step)
        if times:
            total += max(times) - min(times)
    return total, last_step


def read_seed_run(run_dir: Path) -> tuple[dict[str, str], SeedCurve]:
    """A seed's run folder: its config and its episode returns (a resumed run's several
    event files read together; a step written twice keeps its last value)."""
    if not any(p.is_file() and "tfevents" in p.name for p in run_dir.iterdir()):
        raise ResultsError(f"{run_dir}: no tensorboard event files in this folder")
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    config = _config(run_dir, events)
    if RETURN_TAG not in events.Tags().get("scalars", []):
        raise ResultsError(f"{run_dir}: no finished episode ({RETURN_TAG!r} is missing)")
    steps, returns = last_per_step(events, RETURN_TAG)
    seed = int(config.get("seed of this run", config.get("seed", "0")))
    return config, SeedCurve(seed, np.array(steps, dtype=np.int64), np.array(returns))


def read_group(path: Path) -> GroupResult:
    """A seed group's folder, or one single-seed run folder (a group of one)."""
    if not path.is_dir():
        raise ResultsError(f"{path}: no such folder")
    seed_dirs = sorted((p for p in path.iterdir() if p.is_dir() and p.name.startswith("seed_")),
                       key=lambda p: int(p.name.removeprefix("seed_")))
    runs = [read_seed_run(p) for p in seed_dirs] if seed_dirs else [read_seed_run(path)]
    config = runs[0][0]
    wall_s, last_step = _wall_time(path / "aggregate" if seed_dirs else path)
    steps = max([last_step, *(int(curve.steps[-1]) for _, curve in runs)])
    return GroupResult(config["env_id"], config["algo"], [curve for _, curve in runs], steps,
                       wall_s)


def pool(groups: Iterable[GroupResult]) -> list[GroupResult]:
    """Groups of the same algorithm and task as one: single-seed runs become a group. Their
    steps are the fewest any made; their wall time is the total of theirs."""
    pooled: dict[tuple[str, str], GroupResult] = {}
    for group in groups:
        if group.key not in pooled:
            pooled[group.key] = GroupResult(group.env_id, group.algo, list(group.curves),
                                            group.steps, group.wall_s)
            continue
        into = pooled[group.key]
        clash = set(into.seeds) & set(group.seeds)
        if clash:
            raise ResultsError(f"{group.algo} on {group.env_id}: seed {min(clash)} appears in "
                               "two runs; give each seed once")
        into.curves = sorted([*into.curves, *group.curves], key=lambda c: c.seed)
        into.steps = min(into.steps, group.steps)
        into.wall_s += group.wall_s
    return list(pooled.values())


def returns_file(results_dir: Path, env_id: str, algo: str) -> Path:
    return results_dir / f"{env_id}__{algo}.csv"


def write_results(results_dir: Path, groups: Sequence[GroupResult]) -> list[Path]:
    """Each group's returns as ``<env>__<algo>.csv`` (seed, step, return) and its row of
    ``groups.csv``, replacing an earlier row of the same algorithm and task. Returns the
    files written."""
    results_dir.mkdir(parents=True, exist_ok=True)
    rows = {key: row for key, row in _read_group_rows(results_dir).items()}
    written = []
    for group in groups:
        path = returns_file(results_dir, group.env_id, group.algo)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["seed", "step", "return"])
            for curve in group.curves:
                writer.writerows((curve.seed, int(step), f"{value:.2f}")
                                 for step, value in zip(curve.steps, curve.returns, strict=True))
        written.append(path)
        rows[group.key] = {"env_id": group.env_id, "algo": group.algo,
                           "seeds": " ".join(map(str, group.seeds)), "steps": group.steps,
                           "wall_s": f"{group.wall_s:.1f}",
                           "env_steps_per_s": f"{group.env_steps_per_s:.0f}"}
    with (results_dir / GROUPS_FILE).open("w", newline="") as file:
        writer = csv.DictWriter(file, GROUP_FIELDS)
        writer.writeheader()
        writer.writerows(rows[key] for key in sorted(rows))
    written.append(results_dir / GROUPS_FILE)
    return written


def _read_group_rows(results_dir: Path) -> dict[tuple[str, str], dict[str, str]]:
    path = results_dir / GROUPS_FILE
    if not path.exists():
        return {}
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        if reader.fieldnames != GROUP_FIELDS:
            raise ResultsError(f"{path}: expected the columns {','.join(GROUP_FIELDS)}")
        return {(row["env_id"], row["algo"]): row for row in reader}


def load_results(results_dir: Path) -> list[GroupResult]:
    """Every group ``write_results`` kept in ``results_dir``."""
    rows = _read_group_rows(results_dir)
    if not rows:
        raise ResultsError(f"{results_dir}: no {GROUPS_FILE}; run 'table.py collect' first")
    groups = []
    for (env_id, algo), row in sorted(rows.items()):
        path = returns_file(results_dir, env_id, algo)
        try:
            data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        except (OSError, ValueError) as err:
            raise ResultsError(f"{path}: not a seed,step,return CSV ({err})") from err
        curves = [SeedCurve(int(seed), data[data[:, 0] == seed, 1].astype(np.int64),
                            data[data[:, 0] == seed, 2])
                  for seed in map(int, row["seeds"].split())]
        if any(curve.steps.size == 0 for curve in curves):
            raise ResultsError(f"{path}: a seed of {GROUPS_FILE} has no episodes here")
        groups.append(GroupResult(env_id, algo, curves, int(row["steps"]),
                                  float(row["wall_s"])))
    return groups


def collect(paths: Sequence[Path], results_dir: Path) -> list[GroupResult]:
    """Read the run folders, pool them by algorithm and task, keep them as CSV files."""
    # The accumulator warns when it drops a crashed run's events past a resume point; that is
    # how resumed runs are read, so keep it quiet.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    groups = pool(read_group(path) for path in paths)
    write_results(results_dir, groups)
    return groups
