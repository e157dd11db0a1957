"""Tensorboard logging whose per-step losses are summed on the device and synced once per write."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import torch
from torch.utils.tensorboard import SummaryWriter

from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.settings.config import Config, config_to_dict

_Log = TypeVar("_Log", bound="EventLog")

LAUNCH_TAG = "launch_time"
"""The text tag under which every event file holds its process's launch (see launch_text):
``benchmarks/results.py`` times each logged point from it (time to a result)."""


EVENT_QUEUE = 1024
"""Events the writer thread may have queued before a log call waits for it. Many envs end
episodes in bursts (two events each); tensorboard's default queue of 10 made a burst of 16
events wait for the writer's pure-Python checksums: 1,096 µs of the loop's time per burst
against 424 with this queue, on a 2-CPU machine (the writer catches up while the loop waits
for the envs). Queued events are written on flush and close, as before."""


MACHINE_TAG = "machine"
"""The text tag of what ran a run (see machine_text): runs of one table may come from
different machines, and their wall times and speeds are those machines'."""


def machine_text(device: torch.device) -> str:
    """The device a run trained on (a GPU by its name), the host's CPUs and torch's version:
    ``NVIDIA H100 80GB HBM3; 16 CPUs (x86_64); torch 2.11.0+cu130``."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"{where}; {os.cpu_count()} CPUs ({platform.machine()}); torch {torch.__version__}"


def launch_text(launched: float) -> str:
    """What an event file records of its process's launch: the Unix time, to the µs, first
    (``read_launch`` reads it back), and the UTC date for a reader."""
    when = datetime.datetime.fromtimestamp(launched, datetime.timezone.utc)
    return f"{launched:.6f} (Unix time the process was launched: {when:%Y-%m-%d %H:%M:%S} UTC)"


def read_launch(text: str) -> float:
    """The Unix time in a ``launch_text``."""
    return float(text.split(maxsplit=1)[0])


class EventLog:
    """What every tensorboard logger shares: `close` closes its event files once (safe to
    call twice), and a ``with`` block flushes and closes them when it ends, however it ends.
    A subclass writes `flush` and `_close_files`."""

    _closed = False

    def flush(self) -> None:
        """Write pending events to disk."""
        raise NotImplementedError

    def _close_files(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close the event files; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._close_files()

    @property
    def closed(self) -> bool:
        """Whether close() has run."""
        return self._closed

    def __enter__(self: _Log) -> _Log:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Also on exceptions and KeyboardInterrupt: what was logged must reach the disk.
        try:
            self.flush()
        finally:
            self.close()


class Logger(EventLog):
    """A SummaryWriter under `run_dir` plus device-side running sums of scalar tensors.

    Args:
        run_dir: folder of this run's event files (created when missing).
        config_table: markdown written once as text under the tag `hyperparameters`.
        purge_step: on resume, events at or after this step from a crashed run are hidden.
        launched: the Unix time the process was launched, written once as text under the tag
            ``launch_time`` (see ``launch_text``): each event's wall time less it is the time
            since launch, start-up included.

    `accumulate` (or the learner's update graphs, through `sums`) never syncs with the device;
    `write` syncs once and logs the interval means.
    Sums not yet written when the logger closes are dropped (they have no step to log at).
    """

    def __init__(
        self,
        run_dir: Path | str,
        config_table: str | None = None,
        *,
        purge_step: int | None = None,
        launched: float | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self._writer = SummaryWriter(str(self.run_dir), purge_step=purge_step,
                                     max_queue=EVENT_QUEUE)
        # The running sums `accumulate` adds into; the training loop binds them to the
        # learner, whose update graphs then add into them on the device.
        self.sums = MetricSums()
        if config_table is not None:
            self._writer.add_text("hyperparameters", config_table)
        if launched is not None:
            self._writer.add_text(LAUNCH_TAG, launch_text(launched))

    def accumulate(self, values: dict[str, torch.Tensor]) -> None:
        """Add each 0-dim tensor into its key's running sum, on its own device, without a sync."""
        self.sums.add(values)

    def write(self, step: int) -> dict[str, float]:
        """Log and return each key's mean since the last write, then reset the sums."""
        means = self.sums.take()
        for key, mean in means.items():
            self._writer.add_scalar(key, mean, step)
        return means

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Log one host-side number right away."""
        self._writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str) -> None:
        """Log a line of text (tensorboard's text tab)."""
        self._writer.add_text(tag, text)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        """Log a finished episode as `charts/episodic_return` and `charts/episodic_length`."""
        self._writer.add_scalar("charts/episodic_return", episodic_return, step)
        self._writer.add_scalar("charts/episodic_length", length, step)

    def flush(self) -> None:
        """Write pending events to disk."""
        self._writer.flush()

    def _close_files(self) -> None:
        self._writer.close()


def to_markdown_table(cfg: Config) -> str:
    """A `| key | value |` table of every field, for tensorboard's text panel."""
    rows = [f"| {k} | {_cell(v)} |" for k, v in config_to_dict(cfg).items()]
    return "\n".join(["| key | value |", "|---|---|", *rows])


def _cell(value: Any) -> str:
    # Mappings as JSON, the form --actor-kwargs takes; a bare "|" would end the cell early.
    text = json.dumps(value, default=str) if isinstance(value, dict) else str(value)
    return text.replace("|", "\\|")
