"""The folders found under a log dir and what each is: a run (its ``checkpoints/``), a seed
group's seed and aggregate log folders, a sweep's folder, a folder of runs; and, for one that
is not a run, the line that says what it is and what to give instead."""

from __future__ import annotations

import re
from pathlib import Path

from rl_graphstep.core.errors import display_path

CHECKPOINT_DIR = "checkpoints"
"""The folder of a run that holds its checkpoints."""

AGGREGATE_DIR = "aggregate"
"""The folder of a seed group's aggregate curves, beside the seeds' folders."""

SWEEP_STATE_DIR = ".tune"
"""The folder of a sweep (``<log-dir>/<sweep>/``) that holds Ray Tune's state."""

_SEED_DIR = re.compile(r"seed_(\d+)")


def seed_dir_name(seed: int) -> str:
    """The folder of one seed's run inside the group's: ``seed_3``."""
    return f"seed_{seed}"


def is_run(path: Path) -> bool:
    """Whether ``path`` is a run's folder: one that holds a ``checkpoints/`` folder."""
    return (path / CHECKPOINT_DIR).is_dir()


def group_seed_folder(path: Path) -> tuple[Path, int] | None:
    """``(group folder, seed)`` for a seed group's log folder of one seed
    (``runs/<group>/seed_3``, whose checkpoints are the group's); None for any other path."""
    match = _SEED_DIR.fullmatch(path.name)
    if match is None or (path / CHECKPOINT_DIR).exists() or not is_run(path.parent):
        return None
    return path.parent, int(match.group(1))


def not_a_run(path: Path, shown: str) -> str | None:
    """What the folder ``path`` (shown as ``shown``), which holds no checkpoints, is instead of
    a run, and what to give in its place; None when it is none of the kinds known here."""
    seed_folder = group_seed_folder(path)
    if seed_folder is not None:
        group, seed = seed_folder
        return (f"{shown} is the log folder of seed {seed} of the seed group {_shown(group)}, "
                f"whose folder holds the checkpoints: give {_shown(group)} (a group resumes "
                "as a whole)")
    if path.name == AGGREGATE_DIR and is_run(path.parent):
        return (f"{shown} holds the aggregate curves of the seed group {_shown(path.parent)}, "
                f"not checkpoints: give {_shown(path.parent)}")
    runs = _runs_in(path)
    if (path / SWEEP_STATE_DIR).is_dir():
        trial = (f"one of its trials' folders (such as {_shown(runs[0])})" if runs
                 else "one of its trials' folders once it has saved one")
        return (f"{shown} is the folder of the sweep {path.name!r}, not a run: give {trial}, "
                "or continue the whole sweep with python -m rl_graphstep.sweep <its sweep "
                f"file> --resume --log-dir {_shown(path.parent)}")
    if runs:
        return (f"{shown} is a folder of runs, not a run: give one of them (such as "
                f"{_shown(runs[0])})")
    return None


def _runs_in(path: Path) -> list[Path]:
    """The run folders directly inside ``path``, by name."""
    try:
        return sorted(p for p in path.iterdir() if is_run(p))
    except OSError:
        return []


def _shown(path: Path) -> str:
    return display_path(str(path))
