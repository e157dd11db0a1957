"""A benchmark's tensorboard run folders read into groups (``results.GroupResult``), and
``collect``: read, pool and keep them as CSV files.

Times are seconds since launch: every event file of a run records when its process was
launched (``rl_graphstep.run.logger.LAUNCH_TAG``), so an episode's time is its event's wall
time less that launch, plus the whole time of the processes before it where a run was resumed.
Runs logged before the launch was recorded have none: their group is timed from its first
event.

Every episode is kept, several at one step too (``plot_curve.logged``). A seed group's
``aggregate/`` run logged, at each log step, the mean over seeds of each seed's last-10 mean as
the run itself counted them: the episodes read back must give the same at every one of those
steps, or the folder is refused (``check_against_aggregate``), so that a reader that loses or
invents episodes cannot make a table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from plot_curve import logged
from results import (
    LAST_EPISODES,
    OFF_POLICY_SETTINGS,
    ON_POLICY_SETTINGS,
    SETTINGS,
    GroupResult,
    ResultsError,
    SeedCurve,
    joined_machines,
    pool,
    write_results,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from wallclock import trailing_means

from rl_graphstep.algorithms import is_on_policy
from rl_graphstep.run.folders import AGGREGATE_DIR
from rl_graphstep.run.grouplog import AGGREGATE_TAGS
from rl_graphstep.run.logger import LAUNCH_TAG, MACHINE_TAG, read_launch

RETURN_TAG = "charts/episodic_return"
AGGREGATE_MEAN = AGGREGATE_TAGS["mean"]
CONFIG_TAG = "hyperparameters/text_summary"
LAUNCH_TEXT_TAG = f"{LAUNCH_TAG}/text_summary"
MACHINE_TEXT_TAG = f"{MACHINE_TAG}/text_summary"


def _config(run_dir: Path, events: EventAccumulator) -> dict[str, str]:
    """The run's hyperparameters table (markdown ``| key | value |`` rows) as a dict."""
    if CONFIG_TAG not in events.Tags().get("tensors", []):
        raise ResultsError(f"{run_dir}: no hyperparameters table; is it a training run folder?")
    text = events.Tensors(CONFIG_TAG)[0].tensor_proto.string_val[0].decode()
    rows = (line.strip().strip("|").split("|") for line in text.splitlines())
    return {key.strip(): value.strip() for key, value, *_ in (r for r in rows if len(r) >= 2)}


@dataclass(frozen=True)
class Process:
    """One event file of a run folder, written by one training process: its launch (None
    where not recorded), its first and last event's wall time."""

    launch: float | None
    first: float
    last: float
    machine: str = ""  # its machine record, where it kept one

    @property
    def start(self) -> float:
        return self.first if self.launch is None else self.launch


def processes(run_dir: Path) -> tuple[list[Process], int]:
    """The folder's event files, one per process, in the order they ran, and the last step
    any event records."""
    found, last_step = [], 0
    for path in sorted(run_dir.glob("*tfevents*")):
        times, launch, machine = [], None, ""
        for event in EventFileLoader(str(path)).Load():
            times.append(event.wall_time)
            last_step = max(last_step, event.step)
            for value in event.summary.value:
                if value.tag == LAUNCH_TEXT_TAG and value.tensor.string_val:
                    launch = read_launch(value.tensor.string_val[0].decode())
                elif value.tag == MACHINE_TEXT_TAG and value.tensor.string_val:
                    machine = value.tensor.string_val[0].decode()
        if times:
            found.append(Process(launch, min(times), max(times), machine))
    return sorted(found, key=lambda p: p.start), last_step


def machines(found: Sequence[Process]) -> str:
    """The machines the processes recorded, in the order they ran."""
    return joined_machines(p.machine for p in found)


def wall_time(found: Sequence[Process]) -> float:
    """The processes' wall time together, each from its start (launch) to its last event."""
    return sum(p.last - p.start for p in found)


def since_launch(times: np.ndarray, found: Sequence[Process]) -> np.ndarray | None:
    """Wall times of events as seconds since launch: within the process that logged each
    (the last to start before it), plus the whole time of the processes before that one.
    None where some process recorded no launch."""
    if not found or any(p.launch is None for p in found):
        return None
    starts = np.array([p.start for p in found])
    before = np.concatenate([[0.0], np.cumsum([p.last - p.start for p in found])[:-1]])
    which = np.clip(np.searchsorted(starts, times, side="right") - 1, 0, len(found) - 1)
    return before[which] + times - starts[which]


def read_seed_run(run_dir: Path) -> tuple[dict[str, str], SeedCurve]:
    """A seed's run folder: its config and every episode's return (a resumed run's several
    event files read together; see ``plot_curve.logged``)."""
    if not any(p.is_file() and "tfevents" in p.name for p in run_dir.iterdir()):
        raise ResultsError(f"{run_dir}: no tensorboard event files in this folder")
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    config = _config(run_dir, events)
    if RETURN_TAG not in events.Tags().get("scalars", []):
        raise ResultsError(f"{run_dir}: no finished episode ({RETURN_TAG!r} is missing)")
    episodes = logged(events, RETURN_TAG)
    seconds = since_launch(np.array([event.wall_time for event in episodes]),
                           processes(run_dir)[0])
    seed = int(config.get("seed of this run", config.get("seed", "0")))
    return config, SeedCurve(seed, np.array([event.step for event in episodes], dtype=np.int64),
                             np.array([event.value for event in episodes]), seconds)


def _settings(config: dict[str, str]) -> dict[str, int | None]:
    """The settings of ``SETTINGS`` a run's config table gives, those its algorithm reads
    (None where it has none: a config table lists every algorithm's settings)."""
    read = ON_POLICY_SETTINGS if is_on_policy(config.get("algo", "")) else OFF_POLICY_SETTINGS
    return {name: int(config[name]) if name in read and config.get(name, "").isdigit()
            else None for name in SETTINGS}


def read_group(path: Path) -> GroupResult:
    """A seed group's folder, or one single-seed run folder (a group of one)."""
    if not path.is_dir():
        raise ResultsError(f"{path}: no such folder")
    seed_dirs = sorted((p for p in path.iterdir() if p.is_dir() and p.name.startswith("seed_")),
                       key=lambda p: int(p.name.removeprefix("seed_")))
    runs = [read_seed_run(p) for p in seed_dirs] if seed_dirs else [read_seed_run(path)]
    config = runs[0][0]
    if seed_dirs:
        check_against_aggregate(path, [curve for _, curve in runs])
    found, last_step = processes(path / "aggregate" if seed_dirs else path)
    steps = max([last_step, *(int(curve.steps[-1]) for _, curve in runs)])
    timed = found and all(p.launch is not None for p in found)
    return GroupResult(config["env_id"], config["algo"], [curve for _, curve in runs], steps,
                       wall_time(found), _settings(config),
                       "launch" if timed else "first event", machines(found))


def check_against_aggregate(path: Path, curves: Sequence[SeedCurve]) -> None:
    """Refuse a seed group whose episodes, read back, disagree with what its run logged: at
    each step of the aggregate's mean curve, the mean over seeds of each seed's last-10 mean
    over the episodes ended by that step must be the logged one (float32 in the logs)."""
    aggregate = path / AGGREGATE_DIR
    if not aggregate.is_dir():
        return
    events = EventAccumulator(str(aggregate), size_guidance={"scalars": 0})
    events.Reload()
    if AGGREGATE_MEAN not in events.Tags().get("scalars", []):
        return
    # Each seed's last-10 mean after each of its episodes, as the table computes it.
    means = [trailing_means(curve.returns) for curve in curves]
    for logged_mean in events.Scalars(AGGREGATE_MEAN):
        ended = [int(np.searchsorted(c.steps, logged_mean.step, side="right")) for c in curves]
        if min(ended) == 0:
            continue  # the run logs nothing before every seed has an episode
        mean = np.mean([seed[n - 1] for seed, n in zip(means, ended, strict=True)])
        if not np.isclose(mean, logged_mean.value, rtol=1e-5, atol=1e-3):
            raise ResultsError(
                f"{path}: at step {logged_mean.step} the episodes read back give a mean "
                f"last-{LAST_EPISODES} return of {mean:.3f} over the seeds, where the run "
                f"logged {logged_mean.value:.3f}: episodes were lost or added in reading")


def collect(paths: Sequence[Path], results_dir: Path) -> list[GroupResult]:
    """Read the run folders, pool them by algorithm, regime and task, keep them as CSV
    files."""
    # The accumulator warns when it drops a crashed run's events past a resume point; that is
    # how resumed runs are read, so keep it quiet.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    groups = pool(read_group(path) for path in paths)
    write_results(results_dir, groups)
    return groups
