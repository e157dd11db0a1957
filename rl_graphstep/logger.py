"""Tensorboard logging whose per-step losses are summed on the device and synced once per write."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from torch.utils.tensorboard import SummaryWriter

from rl_graphstep.metrics import MetricSums

if TYPE_CHECKING:
    from rl_graphstep.config import Config


def run_name(cfg: Config) -> str:
    """`cfg.run_name`, or CleanRL's `{env_id}__{algo}__{seed}__{unix time}`."""
    if cfg.run_name:
        return cfg.run_name
    # A namespaced id ("ALE/Pong-v5") would otherwise nest the run one folder deeper.
    env = cfg.env_id.replace("/", "-")
    return f"{env}__{cfg.algo}__{cfg.seed}__{int(time.time())}"


# The longest file name most file systems take (ext4, XFS, APFS, NTFS: 255 bytes).
_NAME_MAX = 255


def check_run_dir(path: Path) -> None:
    """Raise ``ConfigError`` (one line, nothing made) when the run folder ``path`` cannot be
    made or written: a file stands where a folder of it must be, the nearest folder that
    exists is not writable, or a name in it is too long."""
    from rl_graphstep.errors import ConfigError

    fix = "pick another --log-dir or --run-name"
    for part in path.parts:
        if len(os.fsencode(part)) > _NAME_MAX:
            raise ConfigError(f"cannot make the run folder: the name {part[:40]!r}... is "
                              f"longer than {_NAME_MAX} bytes; {fix}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"cannot make the run folder {path}: {existing} is a file, not a "
                          f"folder; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot make the run folder {path}: {existing} is not writable; "
                          f"{fix}")


def claim_run_dir(path: Path) -> Path:
    """Make ``path`` as a new, empty folder and return it; if it exists, make and return
    ``path_2`` (``_3``, ...) instead. Made atomically, so two runs named by the same second of
    the clock get a folder each rather than mixing their logs and checkpoints in one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for number in itertools.count(1):
        candidate = path if number == 1 else path.with_name(f"{path.name}_{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")  # itertools.count never ends


class Logger:
    """A SummaryWriter under `run_dir` plus device-side running sums of scalar tensors.

    Args:
        run_dir: folder of this run's event files (created when missing).
        config_table: markdown written once as text under the tag `hyperparameters`.
        purge_step: on resume, events at or after this step from a crashed run are hidden.

    `accumulate` (or an agent's update graphs, through `sums`) never syncs with the device;
    `write` syncs once and logs the interval means.
    Sums not yet written when the logger closes are dropped (they have no step to log at).
    """

    def __init__(
        self,
        run_dir: Path | str,
        config_table: str | None = None,
        *,
        purge_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self._writer = SummaryWriter(str(self.run_dir), purge_step=purge_step)
        # The running sums `accumulate` adds into; the training loop binds them to the agent,
        # whose update graphs then add into them on the device.
        self.sums = MetricSums()
        self._closed = False
        if config_table is not None:
            self._writer.add_text("hyperparameters", config_table)

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

    def close(self) -> None:
        """Flush and close the event file; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._writer.close()

    @property
    def closed(self) -> bool:
        """Whether close() has run."""
        return self._closed

    def __enter__(self) -> Logger:
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
