"""The run folder a training run writes into: which one, owned by one process at a time."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rl_graphstep.checkpoint import (
    PartialSaves,
    RunLock,
    find_checkpoint,
    remove_partial_saves,
)
from rl_graphstep.config import Config
from rl_graphstep.logger import run_name


def run_dir_of(cfg: Config) -> Path:
    """The resumed run's folder, or a new one under ``cfg.log_dir``."""
    if not cfg.resume:
        return Path(cfg.log_dir) / run_name(cfg)
    path = Path(cfg.resume)
    # A checkpoint file lies in runs/<run>/checkpoints/step_N.pt.
    return path.parent.parent if path.is_file() else path


def own_run_dir(cfg: Config, run_dir: Path, owned: contextlib.ExitStack) -> None:
    """Lock ``run_dir`` for this process until ``owned`` closes: a second training of the
    same folder, new or resumed, gets one line instead of mixing its files into this one."""
    if cfg.resume:
        find_checkpoint(cfg.resume)  # a wrong --resume path is its own line, and makes no folder
        advice = "wait for it to end before resuming it"
    else:
        advice = "wait for it to end or pick another --run-name"
    owned.enter_context(RunLock(run_dir, advice=advice))


def clean_partial_saves(run_dir: Path) -> PartialSaves | None:
    """Delete what saves of killed runs left half-written in the (owned) ``run_dir``; return
    what was deleted, None when nothing was."""
    removed = remove_partial_saves(run_dir)
    return removed if removed.files else None
