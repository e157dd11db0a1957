"""A benchmark's results kept as CSV files: every seed's episode returns with the seconds
since launch each was logged at, and each group's steps, wall time, env steps/s and the
settings that make its gradient samples, so that ``table.py report`` can rebuild the tables
and the figures without the runs (``runfolders.py`` reads the runs into these groups).

A *group* is one algorithm, in one regime, on one task over several seeds: a seed group's
folder (``--num-seeds K``: ``seed_<s>/`` runs inside, and ``aggregate/``), or single-seed run
folders of the same algorithm, regime and task, which are pooled. The regime comes from the
runs' settings: an off-policy group stepping ``num_envs`` > 1 envs per seed (such as
``configs/sac_mujoco_parallel.yaml``'s 32) is the variant ``32envs``, named ``sac-32envs`` in
its files and keys and shown as ``SAC, 32 envs``, beside the default group of the same
algorithm and task (one env per seed, or envs not recorded: no variant, named ``sac``, shown
as ``SAC``, as before). A PPO group's envs are part of its usual rollouts: never a variant.
Groups kept before the launch was recorded have no times: theirs are estimated from an even
pace over their wall time (``GroupResult.estimated``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cli import BenchmarkError

from rl_graphstep.algorithms import is_on_policy

LAST_EPISODES = 10
GROUPS_FILE = "groups.csv"
OLD_GROUP_FIELDS = ["env_id", "algo", "seeds", "steps", "wall_s", "env_steps_per_s"]
# What makes the gradient samples (from each run's config): an off-policy group's replay
# batches, an on-policy (PPO) group's rollouts and epochs over them; and where wall_s is
# counted from: "launch" (recorded) or "first event" (runs logged before the launch was
# recorded).
OFF_POLICY_SETTINGS = ["num_envs", "batch_size", "updates_per_step", "learning_starts"]
ON_POLICY_SETTINGS = ["num_envs", "num_steps", "num_minibatches", "update_epochs"]
SETTINGS = [*OFF_POLICY_SETTINGS, "num_steps", "num_minibatches", "update_epochs"]
# And what ran the group (its runs' machine record, "" where they recorded none).
GROUP_FIELDS = [*OLD_GROUP_FIELDS, *SETTINGS, "timed_from", "machine"]
# groups.csv as written before the machine was kept, and before the on-policy settings were.
UNMACHINED_GROUP_FIELDS = GROUP_FIELDS[:-1]
OFF_POLICY_GROUP_FIELDS = [*OLD_GROUP_FIELDS, *OFF_POLICY_SETTINGS, "timed_from"]


class ResultsError(BenchmarkError):
    """A run folder or results file that cannot be read; shown as a one-line error."""


@dataclass
class SeedCurve:
    """One seed's episodes: the env step each ended at and its return, in step order, and
    the seconds since launch it was logged at (None where the run recorded no launch)."""

    seed: int
    steps: np.ndarray
    returns: np.ndarray
    seconds: np.ndarray | None = None

    def final(self, last: int = LAST_EPISODES) -> float:
        """The mean return of the seed's last ``last`` episodes."""
        return float(self.returns[-last:].mean())


def variant_of(algo: str, settings: dict[str, int | None]) -> str:
    """The regime of a group of ``algo`` with these settings: ``32envs`` for an off-policy
    group of 32 envs per seed, "" for the default regime (one env per seed or envs not
    recorded, and every on-policy group, whose envs are part of its usual rollouts)."""
    num_envs = settings.get("num_envs")
    if is_on_policy(algo) or not isinstance(num_envs, int) or num_envs <= 1:
        return ""
    return f"{num_envs}envs"


def group_name(algo: str, settings: dict[str, int | None]) -> str:
    """The name of a group in file names and keys: ``sac``, or ``sac-32envs`` for a variant."""
    regime = variant_of(algo, settings)
    return f"{algo}-{regime}" if regime else algo


@dataclass
class GroupResult:
    """One algorithm in one regime (``variant``) on one task over its seeds, and what the
    group cost."""

    env_id: str
    algo: str
    curves: list[SeedCurve]
    steps: int  # env steps each seed made
    # The training processes' wall time, summed over a resumed run's parts: from each one's
    # launch to its last event, or from its first event where no launch was recorded.
    wall_s: float
    # The run's settings that make its gradient samples (None where not recorded).
    settings: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(SETTINGS))
    timed_from: str = "first event"
    machine: str = ""  # what ran it (the runs' record; "" where none was kept)

    @property
    def variant(self) -> str:
        """Its regime: ``32envs`` for an off-policy group of 32 envs per seed, else ""."""
        return variant_of(self.algo, self.settings)

    @property
    def name(self) -> str:
        """``sac``, or ``sac-32envs`` for a variant: its name in file names and keys."""
        return group_name(self.algo, self.settings)

    @property
    def label(self) -> str:
        """What the tables and figures call it: ``SAC``, or ``SAC, 32 envs``."""
        if not self.variant:
            return self.algo.upper()
        return f"{self.algo.upper()}, {self.settings['num_envs']} envs"

    @property
    def key(self) -> tuple[str, str]:
        """(env_id, name): one group per algorithm, regime and task."""
        return self.env_id, self.name

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

    @property
    def estimated(self) -> bool:
        """Whether its episodes' times are estimated (some run recorded no launch)."""
        return any(curve.seconds is None for curve in self.curves)

    def seconds(self, curve: SeedCurve) -> np.ndarray:
        """A seed's episode times since launch: as recorded, else estimated from an even pace
        (step / steps of the group's wall time), and made non-decreasing."""
        if curve.seconds is not None:
            times = curve.seconds
        else:
            times = curve.steps / self.steps * self.wall_s if self.steps else curve.steps * 0.0
        return np.maximum.accumulate(np.asarray(times, dtype=np.float64))

    @property
    def updates_per_seed(self) -> int | None:
        """Critic updates each seed made. Off-policy: ``updates_per_step`` per iteration of
        ``num_envs`` steps once past ``learning_starts``. On-policy (PPO): ``update_epochs``
        x ``num_minibatches`` per full rollout of ``num_envs`` x ``num_steps`` steps. None
        where its settings were not recorded."""
        settings = self.settings
        on_policy = is_on_policy(self.algo)
        if any(settings.get(name) is None
               for name in (ON_POLICY_SETTINGS if on_policy else OFF_POLICY_SETTINGS)):
            return None
        if on_policy:
            rollouts = self.steps // (settings["num_envs"] * settings["num_steps"])
            return rollouts * settings["update_epochs"] * settings["num_minibatches"]
        iterations = max(0, self.steps - settings["learning_starts"]) // settings["num_envs"]
        return iterations * settings["updates_per_step"]

    @property
    def gradient_samples(self) -> int | None:
        """Rows sampled for critic updates by all seeds: ``batch_size`` rows per update of
        each seed (PPO: a minibatch, its rollout's ``num_envs`` x ``num_steps`` rows over
        ``num_minibatches``). None where its settings were not recorded."""
        updates = self.updates_per_seed
        if updates is None:
            return None
        settings = self.settings
        rows = (settings["num_envs"] * settings["num_steps"] // settings["num_minibatches"]
                if is_on_policy(self.algo) else settings["batch_size"])
        return len(self.curves) * updates * rows

    @property
    def gradient_samples_per_s(self) -> float | None:
        """Gradient samples of all seeds per second of wall time (None where unknown)."""
        samples = self.gradient_samples
        return None if samples is None or self.wall_s <= 0 else samples / self.wall_s


def joined_machines(machines: Iterable[str]) -> str:
    """Machine records in their order, each once, joined by " + " ("" for none)."""
    return " + ".join(dict.fromkeys(m for m in machines if m))


def pool(groups: Iterable[GroupResult]) -> list[GroupResult]:
    """Groups of the same algorithm, regime and task (``key``) as one: single-seed runs
    become a group, never pooled with runs of another regime. Their steps are the fewest any
    made; their wall time is the total of theirs."""
    pooled: dict[tuple[str, str], GroupResult] = {}
    for group in groups:
        if group.key not in pooled:
            pooled[group.key] = GroupResult(group.env_id, group.algo, list(group.curves),
                                            group.steps, group.wall_s, dict(group.settings),
                                            group.timed_from, group.machine)
            continue
        into = pooled[group.key]
        clash = set(into.seeds) & set(group.seeds)
        if clash:
            raise ResultsError(f"{group.label} on {group.env_id}: seed {min(clash)} appears "
                               "in two runs; give each seed once")
        into.curves = sorted([*into.curves, *group.curves], key=lambda c: c.seed)
        into.steps = min(into.steps, group.steps)
        into.wall_s += group.wall_s
        if group.timed_from != into.timed_from:
            into.timed_from = "first event"  # some of its runs recorded no launch
        into.machine = joined_machines([*into.machine.split(" + "), group.machine])
    return list(pooled.values())


def returns_file(results_dir: Path, env_id: str, name: str) -> Path:
    """``<env>__<name>.csv``: a group's returns, by its name (``sac``, ``sac-32envs``)."""
    return results_dir / f"{env_id}__{name}.csv"


def write_results(results_dir: Path, groups: Sequence[GroupResult]) -> list[Path]:
    """Each group's returns as ``<env>__<name>.csv`` (``returns_file``: seed, step, return,
    and seconds since launch where every run recorded its launch) and its row of
    ``groups.csv`` (its regime read back from its settings), replacing an earlier row of the
    same group (algorithm, regime and task). Returns the files written."""
    results_dir.mkdir(parents=True, exist_ok=True)
    rows = {key: row for key, row in _read_group_rows(results_dir).items()}
    written = []
    for group in groups:
        path = returns_file(results_dir, group.env_id, group.name)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            timed = not group.estimated
            writer.writerow(["seed", "step", "return", *(["seconds"] if timed else [])])
            for curve in group.curves:
                for i, (step, value) in enumerate(zip(curve.steps, curve.returns, strict=True)):
                    # Seconds to the microsecond: at 0.01 s an episode ended just after a
                    # reading's moment (60.004 s) read back as at it (60.00) and counted.
                    writer.writerow([curve.seed, int(step), f"{value:.2f}",
                                     *([f"{curve.seconds[i]:.6f}"] if timed else [])])
        written.append(path)
        # wall_s as precise as the episodes' seconds: rounded alike, none is past it.
        rows[group.key] = {"env_id": group.env_id, "algo": group.algo,
                           "seeds": " ".join(map(str, group.seeds)), "steps": group.steps,
                           "wall_s": f"{group.wall_s:.6f}",
                           "env_steps_per_s": f"{group.env_steps_per_s:.0f}",
                           **{name: "" if value is None else value
                              for name, value in group.settings.items()},
                           "timed_from": group.timed_from, "machine": group.machine}
    with (results_dir / GROUPS_FILE).open("w", newline="") as file:
        writer = csv.DictWriter(file, GROUP_FIELDS)
        writer.writeheader()
        writer.writerows(rows[key] for key in sorted(rows))
    written.append(results_dir / GROUPS_FILE)
    return written


def _row_settings(row: dict[str, str]) -> dict[str, int | None]:
    """A ``groups.csv`` row's settings (None where empty or not a column of its file)."""
    return {name: int(row[name]) if row.get(name) else None for name in SETTINGS}


def _read_group_rows(results_dir: Path) -> dict[tuple[str, str], dict[str, str]]:
    """``groups.csv``'s rows by group key, (env_id, name): the name from the row's algorithm
    and settings (``num_envs``), as ``GroupResult.key`` gives it."""
    path = results_dir / GROUPS_FILE
    if not path.exists():
        return {}
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        # A file written before the settings (or the on-policy ones) were kept: its rows have
        # none, timed from the first event.
        if reader.fieldnames not in (GROUP_FIELDS, UNMACHINED_GROUP_FIELDS,
                                     OFF_POLICY_GROUP_FIELDS, OLD_GROUP_FIELDS):
            raise ResultsError(f"{path}: expected the columns {','.join(GROUP_FIELDS)}")
        return {(row["env_id"], group_name(row["algo"], _row_settings(row))):
                {"timed_from": "first event", "machine": "", **row} for row in reader}


def load_results(results_dir: Path) -> list[GroupResult]:
    """Every group ``write_results`` kept in ``results_dir``, sorted by (env_id, name)."""
    rows = _read_group_rows(results_dir)
    if not rows:
        raise ResultsError(f"{results_dir}: no {GROUPS_FILE}; run 'table.py collect' first")
    groups = []
    for (env_id, name), row in sorted(rows.items()):
        curves = _read_returns(returns_file(results_dir, env_id, name), row["seeds"])
        groups.append(GroupResult(env_id, row["algo"], curves, int(row["steps"]),
                                  float(row["wall_s"]), _row_settings(row), row["timed_from"],
                                  row["machine"]))
    return groups


def _read_returns(path: Path, seeds: str) -> list[SeedCurve]:
    """A group's ``seed,step,return[,seconds]`` CSV: a file without the seconds (written
    before they were kept) gives curves without them."""
    try:
        with path.open() as file:
            header = file.readline().strip().split(",")
        if header not in (["seed", "step", "return"], ["seed", "step", "return", "seconds"]):
            raise ValueError(f"its header is {','.join(header)}")
        data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    except (OSError, ValueError) as err:
        raise ResultsError(f"{path}: not a seed,step,return[,seconds] CSV ({err})") from err
    curves = []
    for seed in map(int, seeds.split()):
        rows = data[data[:, 0] == seed]
        if rows.shape[0] == 0:
            raise ResultsError(f"{path}: a seed of {GROUPS_FILE} has no episodes here")
        curves.append(SeedCurve(seed, rows[:, 1].astype(np.int64), rows[:, 2],
                                rows[:, 3] if len(header) == 4 else None))
    return curves
