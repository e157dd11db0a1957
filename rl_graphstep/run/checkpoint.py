"""Checkpoints of a run: written atomically, the newest ``keep`` kept, found and loaded with one
clear line for every way a checkpoint can be missing, broken or of another run.

Who may write into a run folder, and the cleaning of half-written saves: rl_graphstep.run.rundir.

Layout: ``<run_dir>/checkpoints/step_{global_step:012d}.pt`` (zero-padded, so names sort by step).

A checkpoint is one ``torch.save``d dict (``FORMAT`` 1), written by ``rl_graphstep.train``::

    {
        "format": 1,
        "config": config_to_dict(cfg),        # plain values; config_from_dict rebuilds the Config
                                              # (custom networks by spec: rl_graphstep.run.netspec)
        "run_name": str,
        "global_step": int,                   # environment steps taken, over all envs
        "episodes": int,                      # episodes finished
        "recent_returns": list[float],        # the returns the progress bar averages
        "agent": {"actor": state_dict, "critic": state_dict, ...},  # networks, optimizers, ...
        "rng": {...},                         # python, numpy, torch (and CUDA) generator states
        "envs": bytes | None,                 # the pickled vector env, None when it cannot be
        "observations": np.ndarray,           # the envs' current observations
        "buffer": dict | None,                # the replay buffer's contents, None when not saved
        "staged_actor": list[Tensor] | None,  # --action-stream: the actor the next action reads
    }

Only ``format``, ``config``, ``global_step`` and ``agent`` (``REQUIRED_KEYS``) are checked on
load; the rest is the writer's and reader's business. Loading unpickles (numpy RNG states, the
env), so load only checkpoints you trust.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import pickle
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rl_graphstep.core.errors import CheckpointError, display_path, first_line
from rl_graphstep.run.folders import CHECKPOINT_DIR, not_a_run
from rl_graphstep.settings.config import plain_value
from rl_graphstep.settings.fieldtypes import user_path

__all__ = [
    "CHECKPOINT_DIR",
    "FORMAT",
    "PARTIAL_FILES",
    "REQUIRED_KEYS",
    "checkpoint_path",
    "checkpoint_step",
    "find_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "networks_mismatch",
    "run_folder_of",
    "save_checkpoint",
    "set_aside_later",
]

FORMAT = 1
"""The version of the state dict layout above; bumped when a reader could misread a writer."""

REQUIRED_KEYS: tuple[str, ...] = ("format", "config", "global_step", "agent")
"""The keys every checkpoint has; ``load_checkpoint`` refuses a dict without them."""


_NAME = re.compile(r"step_(\d+)\.pt")
PARTIAL_FILES = ".step_*.tmp"
"""The name pattern of a save's temporary file in ``checkpoints/`` (see _write_atomically)."""


def checkpoint_path(run_dir: Path | str, step: int) -> Path:
    """Where the checkpoint of ``step`` lives: ``<run_dir>/checkpoints/step_000000015000.pt``."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{step:012d}.pt"


def save_checkpoint(run_dir: Path | str, step: int, state: Mapping[str, Any], *, keep: int
                    ) -> Path:
    """Write ``state`` as the checkpoint of ``step`` and keep only the newest ``keep``.

    The write is atomic: ``torch.save`` goes to a temporary file in the same folder, which is
    flushed to disk and then renamed onto the final name, so a crash or a full disk during a
    save leaves every earlier checkpoint whole (and no temporary file behind, unless the
    process is killed outright). Pruning keeps the ``keep`` highest steps, and the checkpoint
    just written even when it is not among them (a run restarted from an earlier step then
    keeps the later checkpoints until it passes them: nothing newer is deleted for it; the
    training loop moves them aside first with :func:`set_aside_later`).

    Args:
        run_dir: the run folder; ``checkpoints/`` is created inside it when missing.
        step: the global step, which names the file.
        state: the dict to save (see the module docstring).
        keep: how many checkpoints to keep, at least 1.

    Returns:
        The path of the checkpoint written.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 checkpoint, got {keep}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, state)
    _prune(run_dir, keep, spare=path)
    return path


def _write_atomically(path: Path, state: Mapping[str, Any]) -> None:
    tmp_name: str | None = None
    try:
        # Same folder as the target: os.replace is only atomic within one file system.
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.stem}.",
                                         suffix=".tmp", delete=False) as tmp:
            tmp_name = tmp.name
            torch.save(state, tmp)
            tmp.flush()
            # Data on disk before the rename, or a power cut could leave a renamed empty file.
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        # BaseException too: a Ctrl-C mid-save must not leave a half-written .tmp behind.
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable; folders cannot be opened this way on Windows."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename has still happened
    finally:
        os.close(fd)


def set_aside_later(run_dir: Path | str, step: int) -> Path | None:
    """Move the checkpoints of steps after ``step`` into ``checkpoints/abandoned_after_<step>/``
    and return that folder (None when there were none).

    A run resumed from an older checkpoint starts a new timeline; the later checkpoints of the
    old one would otherwise be taken for its latest (and the new timeline would overwrite
    them step by step). Moved, not deleted: nothing is lost.
    """
    later = [p for p in list_checkpoints(run_dir) if (checkpoint_step(p) or 0) > step]
    if not later:
        return None
    base = Path(run_dir) / CHECKPOINT_DIR / f"abandoned_after_{step:012d}"
    folder, n = base, 1
    while folder.exists():  # a second abandoned timeline after the same step
        n += 1
        folder = base.with_name(f"{base.name}_{n}")
    folder.mkdir()
    for path in later:
        os.replace(path, folder / path.name)
    _fsync_dir(folder.parent)
    return folder


def _prune(run_dir: Path | str, keep: int, spare: Path) -> None:
    checkpoints = list_checkpoints(run_dir)
    for old in checkpoints[: max(len(checkpoints) - keep, 0)]:
        if old != spare:
            old.unlink(missing_ok=True)


def checkpoint_step(path: Path) -> int | None:
    """The env step in a checkpoint's file name (``step_000000015000.pt`` -> 15000), read
    without loading it; None for any other name."""
    match = _NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def _checkpoints_in(folder: Path) -> list[Path]:
    found = [(step, p) for p in folder.glob("step_*.pt")
             if (step := checkpoint_step(p)) is not None and p.is_file()]
    return [p for _, p in sorted(found)]


def list_checkpoints(run_dir: Path | str) -> list[Path]:
    """The checkpoints of a run, oldest step first; empty when there are none (or no folder).
    Temporary files of a save in progress are never listed."""
    return _checkpoints_in(Path(run_dir) / CHECKPOINT_DIR)


def latest_checkpoint(run_dir: Path | str) -> Path | None:
    """The checkpoint of the highest step of a run, or None when it has none."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def find_checkpoint(run_dir_or_file: Path | str) -> Path:
    """The checkpoint file meant by a run folder (its latest checkpoint), the run's
    ``checkpoints/`` folder itself (its latest), or a checkpoint file (itself).

    Raises:
        CheckpointError: the path does not exist, or the folder holds no checkpoints.
    """
    text = str(run_dir_or_file)
    if not text.strip():
        raise CheckpointError("no run given: give a run folder (such as runs/<run name>) or a "
                              ".pt checkpoint")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        # Printed as is, a newline would split the one-line message; NUL is no path at all.
        raise CheckpointError(f"run folder {text!r} must not contain control characters "
                              "such as NUL or a newline")
    path = user_path(run_dir_or_file)
    shown = display_path(str(path))
    if path.is_file():
        return path
    if not path.exists():
        if path.suffix == ".pt":
            raise CheckpointError(f"checkpoint file {shown} does not exist")
        raise CheckpointError(f"run folder {shown} does not exist{_close_runs_hint(path)}; "
                              "give a run folder (such as runs/<run name>) or a .pt checkpoint")
    if not path.is_dir():
        raise CheckpointError(f"{shown} is neither a run folder nor a checkpoint file")
    latest = latest_checkpoint(path)
    if latest is None and path.name == CHECKPOINT_DIR:
        # The user pointed at runs/x/checkpoints rather than runs/x: just as clear a request.
        found = _checkpoints_in(path)
        latest = found[-1] if found else None
    if latest is None:
        folder = display_path(str(path / CHECKPOINT_DIR))
        # A run saves every --checkpoint-every steps and at its end, however it is stopped:
        # one without any ended before its first (killed, or failed), or is no run at all.
        raise CheckpointError(not_a_run(path, shown) or (
            f"{shown} has no checkpoints in {folder}: it is not a run's folder, or its run "
            "ended before the first save (every --checkpoint-every steps and at the end)"))
    return latest


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder of a checkpoint file that :func:`find_checkpoint` gave
    (``runs/x/checkpoints/step_*.pt`` -> ``runs/x``; a file elsewhere: its folder)."""
    folder = checkpoint.parent
    return folder.parent if folder.name == CHECKPOINT_DIR else folder


def _close_runs_hint(path: Path) -> str:
    """`` (did you mean runs/y?)`` when the parent folder holds a similar name."""
    try:
        siblings = [p.name for p in path.parent.iterdir() if p.is_dir()]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, siblings, n=1)
    return f" (did you mean {display_path(str(path.parent / close[0]))}?)" if close else ""


# What torch.load raises for a file that is not a whole torch file: a truncated zip is an
# OSError (EINVAL) or a RuntimeError from the zip reader, random bytes fall through to the
# legacy pickle reader (UnpicklingError, EOFError, ValueError, ...).
_UNREADABLE = (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
               OSError, IndexError, KeyError, TypeError, MemoryError, OverflowError)


def load_checkpoint(run_dir_or_file: Path | str, *, env_id: str | None = None,
                    algo: str | None = None) -> dict[str, Any]:
    """Load a checkpoint on the CPU: a run folder's latest one, or a ``.pt`` file.

    Args:
        run_dir_or_file: a run folder, its ``checkpoints/`` folder, or a checkpoint file.
        env_id: when given, the checkpoint must be of this environment.
        algo: when given, the checkpoint must be of this algorithm.

    Returns:
        The state dict (see the module docstring), tensors on the CPU.

    Raises:
        CheckpointError: one line naming the path and what is wrong: it does not exist, holds
            no checkpoints, is truncated or corrupted, is not a checkpoint of this format, or is
            of another env or algorithm.
    """
    path = find_checkpoint(run_dir_or_file)
    shown = display_path(str(path))
    state = _read(path, shown)
    _check_format(state, shown)
    _check_run(state, shown, env_id, algo)
    return state


def _read(path: Path, shown: str) -> Any:
    try:
        # weights_only=False: the state holds numpy RNG states and a pickled env.
        return torch.load(path, map_location="cpu", weights_only=False)
    except PermissionError:
        raise CheckpointError(f"checkpoint {shown} cannot be read: permission denied") from None
    except (ModuleNotFoundError, AttributeError) as error:
        # An object pickled from code this interpreter cannot import (e.g. a custom env).
        raise CheckpointError(
            f"checkpoint {shown} holds an object whose code cannot be imported here "
            f"({_one_line(error)}); install or put on the path what the run used") from None
    except _UNREADABLE as error:
        raise CheckpointError(
            f"checkpoint {shown} is truncated or corrupted ({type(error).__name__}: "
            f"{_one_line(error)}); load an earlier checkpoint of the run instead") from None


def _one_line(error: BaseException) -> str:
    """The first line of an exception's text: torch's messages run over several."""
    return first_line(error)[:200]


def _check_format(state: Any, shown: str) -> None:
    expected = (f"a dict with format {FORMAT} and the keys "
                f"{', '.join(k for k in REQUIRED_KEYS if k != 'format')}")
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{shown} is not an rl_graphstep checkpoint: it holds a "
                              f"{type(state).__name__}, not {expected}")
    if "format" in state and state["format"] != FORMAT:
        raise CheckpointError(f"checkpoint {shown} has format {state['format']!r}, but this "
                              f"rl_graphstep reads format {FORMAT}; use the version that wrote it")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{shown} is not an rl_graphstep checkpoint: it lacks "
                              f"{', '.join(missing)} (expected {expected})")
    if not isinstance(state["config"], Mapping) or not isinstance(state["agent"], Mapping):
        raise CheckpointError(f"{shown} is not an rl_graphstep checkpoint: its config and "
                              "agent must be dicts")


def _check_run(state: Mapping[str, Any], shown: str, env_id: str | None, algo: str | None
               ) -> None:
    have_env, have_algo = state["config"].get("env_id"), state["config"].get("algo")
    if (env_id is None or env_id == have_env) and (algo is None or algo == have_algo):
        return
    want_env = have_env if env_id is None else env_id
    want_algo = have_algo if algo is None else algo
    raise CheckpointError(f"checkpoint {shown} is of {have_algo} on {have_env}, "
                          f"not {want_algo} on {want_env}")


# The settings that shape the networks: resuming with any of them changed cannot load.
_NETWORK_KEYS = ("hidden_sizes", "actor", "critic", "actor_kwargs", "critic_kwargs")


def networks_mismatch(state: Mapping[str, Any], cfg: Any, error: BaseException,
                      built: str = "the networks") -> str:
    """The line for a checkpoint whose agent state does not load into the networks ``cfg``
    builds (a ``load_state_dict`` size mismatch): which flags differ from the checkpoint's
    config, and that dropping them resumes; else what was ``built`` and the error.
    ``cfg`` is the run's ``Config``."""
    saved = state["config"]
    changed = [key for key in _NETWORK_KEYS
               if key in saved and plain_value(saved[key]) != plain_value(getattr(cfg, key))]
    shown = display_path(str(cfg.resume)) if getattr(cfg, "resume", None) else "the checkpoint"
    if changed:
        differ = "; ".join(f"--{key.replace('_', '-')} is {_show(getattr(cfg, key))} here, "
                           f"{_show(saved[key])} in the checkpoint" for key in changed)
        fix = "drop " + " and ".join(f"--{key.replace('_', '-')}" for key in changed)
        return (f"the networks of {shown} do not match the ones this run builds ({differ}); "
                f"{fix} to resume it")
    return (f"the saved networks of {shown} do not fit {built} this run built "
            f"({type(error).__name__}: {_one_line(error)}); resume with the networks and "
            "kwargs the run was trained with")


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return "none" if value is None else str(value)
