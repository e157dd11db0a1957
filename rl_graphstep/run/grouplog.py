"""A seed group's tensorboard logs: one run per seed under the group's folder, so
``tensorboard --logdir runs`` overlays the seeds, and the group's aggregate curves as a run
of their own."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.aggregate import group_returns
from rl_graphstep.run.folders import AGGREGATE_DIR, seed_dir_name
from rl_graphstep.run.logger import LAUNCH_TAG, EventLog, Logger, launch_text

# The aggregate run's tags, from aggregate.group_returns' keys.
AGGREGATE_TAGS = {key: f"charts/episodic_return_{key}"
                  for key in ("mean", "min", "iqm", "iqm_low", "iqm_high")}


class GroupLogger(EventLog):
    """The tensorboard runs of a group of K seeds: ``<group_dir>/seed_<s>/`` for each seed
    (its losses, returns and charts, and the hyperparameters table) and
    ``<group_dir>/aggregate/`` (the group's curves and what belongs to no one seed, such as
    the steps per second).

    Args:
        group_dir: the group's folder (created when missing).
        seeds: the group's seeds, in the order of the leading K dimension of every value.
        config_table: markdown written once into each seed's run as ``hyperparameters``.
        purge_step: on resume, events at or after this step from a crashed run are hidden.
        launched: the Unix time the process was launched, recorded in every run (each seed's
            and the aggregate; see ``Logger``).

    Per-seed metrics are (K,) device tensors: entry k goes into seed k's run. They are summed
    on the device (``sums``, which the learner's update graphs can add into, as a single run's
    are) and read once per ``write``.
    """

    def __init__(self, group_dir: Path | str, seeds: Sequence[int],
                 config_table: str | None = None, *, purge_step: int | None = None,
                 launched: float | None = None) -> None:
        self.group_dir = Path(group_dir)
        self.seeds = tuple(seeds)
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"a group needs one or more distinct seeds, got {self.seeds}")
        self.sums = MetricSums(shape=(len(self.seeds),))
        self._aggregate = SummaryWriter(str(self.group_dir / AGGREGATE_DIR),
                                        purge_step=purge_step)
        if launched is not None:
            self._aggregate.add_text(LAUNCH_TAG, launch_text(launched))
        self.runs = [Logger(self.group_dir / seed_dir_name(seed), _seed_table(config_table, seed),
                            purge_step=purge_step, launched=launched) for seed in self.seeds]

    def run_dir(self, index: int) -> Path:
        """The folder of the run of the group's ``index``-th seed."""
        return self.runs[index].run_dir

    def accumulate(self, values: dict[str, torch.Tensor]) -> None:
        """Add each (K,) tensor into its key's running sums, on its device, without a sync."""
        self.sums.add(values)

    def write(self, step: int) -> dict[str, list[float]]:
        """Log each key's K interval means, entry k into seed k's run (one sync for all);
        return them and reset the sums."""
        means = self.sums.take_rows()
        for key, row in means.items():
            for run, value in zip(self.runs, row, strict=True):
                run.scalar(key, value, step)
        return means

    def scalars(self, tag: str, values: Sequence[float] | np.ndarray, step: int) -> None:
        """Log one host-side number per seed right away (e.g. each seed's skipped updates)."""
        if len(values) != len(self.runs):
            raise ValueError(f"{tag}: {len(values)} values for a group of {len(self.runs)} "
                             "seeds")
        for run, value in zip(self.runs, values, strict=True):
            run.scalar(tag, float(value), step)

    def group_scalar(self, tag: str, value: float, step: int) -> None:
        """Log one number of the whole group (e.g. ``charts/SPS``) into the aggregate run."""
        self._aggregate.add_scalar(tag, value, step)

    def text(self, tag: str, text: str) -> None:
        """Log a line of text about the whole group (the plan) into the aggregate run."""
        self._aggregate.add_text(tag, text)

    def episode(self, index: int, step: int, episodic_return: float, length: int) -> None:
        """Log a finished episode of the group's ``index``-th seed into that seed's run."""
        self.runs[index].episode(step, episodic_return, length)

    def aggregate(self, step: int, recent: Sequence[Sequence[float]]) -> dict[str, float] | None:
        """Log the group's curves from each seed's recent returns (see
        ``aggregate.group_returns``): the mean, min, IQM and its 95% band over the seeds'
        mean returns. Nothing until every seed has finished an episode; returns what was
        logged."""
        if len(recent) != len(self.runs):
            raise ValueError(f"{len(recent)} seeds' returns for a group of {len(self.runs)}")
        stats = group_returns(recent)
        if stats is not None:
            for key, value in stats.items():
                self._aggregate.add_scalar(AGGREGATE_TAGS[key], value, step)
        return stats

    def flush(self) -> None:
        """Write pending events of every run to disk."""
        for run in self.runs:
            run.flush()
        self._aggregate.flush()

    def _close_files(self) -> None:
        try:
            for run in self.runs:
                run.close()
        finally:
            self._aggregate.close()


def _seed_table(config_table: str | None, seed: int) -> str | None:
    """The group's table with the row of the seed this run trains."""
    if config_table is None:
        return None
    return f"{config_table}\n| seed of this run | {seed} |"
