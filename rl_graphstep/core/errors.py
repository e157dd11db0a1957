"""The project's error types (each one clear line for the user, never a traceback) and the
helpers that point such a line at the user's own code."""

from __future__ import annotations

import importlib.util
import os
import signal
import sysconfig
import traceback
from pathlib import Path


class RLGraphstepError(Exception):
    """Base of every error the command line reports as one line with a non-zero exit."""


class ConfigError(RLGraphstepError, ValueError):
    """A configuration value, key or file is wrong."""


class EnvError(RLGraphstepError, ValueError):
    """An environment cannot be made or does not suit the algorithm."""


class CaptureError(RLGraphstepError, RuntimeError):
    """An update could not be captured as a CUDA graph."""


class CompileError(CaptureError):
    """An update could not be compiled (``torch.compile``) before its capture."""


# Frames in these folders are the library's, not the user's: a message names the user's line
# (an env whose constructor gives gymnasium's Box low > high is wrong at its own line, not in
# gymnasium/spaces/box.py).
# Found without importing them: the command-line entries import this module before torch.
_LIBRARY_DIRS = tuple(
    os.path.realpath(os.path.dirname(path)) + os.sep
    for path in (*(importlib.util.find_spec(name).origin for name in ("torch", "gymnasium",
                                                                       "numpy")),
                 os.path.dirname(os.path.dirname(__file__)) + "/__init__.py")
)
# The interpreter's standard library (importlib's frames, say) is not the user's either; its
# site-packages, which may lie inside it, can be.
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_PACKAGE_DIRS = tuple(os.path.realpath(sysconfig.get_paths()[key]) + os.sep
                      for key in ("purelib", "platlib"))


def _is_library(filename: str) -> bool:
    path = os.path.realpath(filename)
    return path.startswith(_LIBRARY_DIRS) or (
        path.startswith(_STDLIB_DIR) and not path.startswith(_PACKAGE_DIRS))


def user_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``error``'s traceback outside torch and rl_graphstep."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        # "<frozen importlib._bootstrap>" and the like are the interpreter's, not a file.
        if frame.filename.startswith("<"):
            continue
        if not _is_library(frame.filename):
            return frame
    return None


def user_location(error: BaseException) -> str:
    """``file.py:12`` of :func:`user_frame`, or ``""`` when every frame is the library's."""
    frame = user_frame(error)
    return "" if frame is None else f"{display_path(frame.filename)}:{frame.lineno}"


def first_line(error: BaseException) -> str:
    """The first line of an exception's text, its runs of spaces made one (torch's and
    gymnasium's messages run over several lines); the type's name when it has no text."""
    lines = str(error).strip().splitlines()
    return " ".join(lines[0].split()) if lines else type(error).__name__


def os_error_line(error: OSError) -> str:
    """One line for a file the system would not read or write (a full disk, a run folder
    deleted under the run, a name too long): what failed and on which file, its name cut to
    a readable length."""
    what = error.strerror or first_line(error)
    name = error.filename
    if name is None:
        return what
    name = os.fsdecode(name)
    if len(name) > 80:
        name = f"{name[:40]}...{name[-30:]}"
    return f"{what}: {name}"


def display_path(filename: str) -> str:
    """Relative to the working folder when the file lies below it: short and clickable."""
    try:
        if Path(filename).resolve().is_relative_to(Path.cwd().resolve()):
            return os.path.relpath(filename)
    except (OSError, ValueError):
        pass
    return filename


class CheckpointError(RLGraphstepError, ValueError):
    """A checkpoint cannot be found, read, or does not suit the run asked for."""


class RunFolderError(RLGraphstepError, RuntimeError):
    """A run folder is owned by another training process, or cannot be written."""


# The signals that stop a run cleanly: the training loop catches them, finishes its step and
# saves, and the env workers ignore them, since a terminal (Ctrl-C, or SIGHUP when it closes)
# or a batch system sends them to the whole process group.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TrainingInterrupted(RLGraphstepError):
    """A stop signal, or the console's reader going away (``signum`` SIGPIPE), stopped the run
    after a checkpoint was saved."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class NonFiniteUpdates(RLGraphstepError):
    """Too many consecutive updates had non-finite losses or gradients."""


def type_name(value: object) -> str:
    """``a dict``, ``an int``, ``None``: what a wrong argument was, for a TypeError's line."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"
