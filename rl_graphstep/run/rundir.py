"""The run folder a training run writes into: its name, making it, and its ownership by one
training process at a time (RunLock), whose owner clears what killed saves left half-written."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import tempfile
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from rl_graphstep.core.errors import ConfigError, RunFolderError, display_path
from rl_graphstep.run.checkpoint import (
    CHECKPOINT_DIR,
    PARTIAL_FILES,
    find_checkpoint,
    run_folder_of,
)
from rl_graphstep.settings.config import Config

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, see RunLock
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"
"""The file in a run folder that its owning training process holds a lock on."""


CLOCK_FORMAT = "%Y-%m-%d_%H-%M-%S"
"""The local date and time that ends a run folder's default name: ``2026-12-06_01-23-45``.
Read and sorted as it is (names of one env, algorithm and seed sort by start), and with no
``:``, which Windows refuses in a file name and ``module:Class`` specs would split on."""


def run_name(cfg: Config) -> str:
    """`cfg.run_name`, or CleanRL's `{env_id}__{algo}__{seed}__{local date and time}`
    (``Pendulum-v1__sac__1__2026-12-06_01-23-45``); a seed group's
    `{env_id}__{algo}__seeds_{seeds_label}__{local date and time}`. (Older runs end in the
    Unix time instead; nothing reads the name, so they resume and evaluate as before.)"""
    if cfg.run_name:
        return cfg.run_name
    # A namespaced id ("ALE/Pong-v5") would otherwise nest the run one folder deeper.
    env = cfg.env_id.replace("/", "-")
    seeds = cfg.seed_list
    seed = f"seeds_{seeds_label(seeds)}" if len(seeds) > 1 else str(seeds[0])
    started = time.strftime(CLOCK_FORMAT, time.localtime(time.time()))
    return f"{env}__{cfg.algo}__{seed}__{started}"


# A group's seeds spelled out in its folder name up to this many characters.
_LABEL_MAX = 60


def seeds_label(seeds: tuple[int, ...]) -> str:
    """``1-8`` for a run of consecutive seeds, ``3_5_7`` for others; a list too long for a
    folder name: ``3_5_and_62_more``."""
    first, last = seeds[0], seeds[-1]
    if len(seeds) > 1 and seeds == tuple(range(first, last + 1)):
        return f"{first}-{last}"
    label = "_".join(map(str, seeds))
    if len(label) <= _LABEL_MAX:
        return label
    return f"{seeds[0]}_{seeds[1]}_and_{len(seeds) - 2}_more"


# The longest file name most file systems take (ext4, XFS, APFS, NTFS: 255 bytes).
_NAME_MAX = 255


def check_run_dir(path: Path) -> None:
    """Raise ``ConfigError`` (one line, nothing made) when the run folder ``path`` cannot be
    made or written: a file (or a link to nothing) stands where a folder of it must be, the
    nearest folder that exists is not writable, or a name in it is too long."""
    fix = "pick another --log-dir or --run-name"
    for part in path.parts:
        if len(os.fsencode(part)) > _NAME_MAX:
            raise ConfigError(f"cannot make the run folder: the name {part[:40]!r}... is "
                              f"longer than {_NAME_MAX} bytes; {fix}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a broken link: making the folders would say "File exists"
            raise ConfigError(f"cannot make the run folder {path}: {existing} is a link to "
                              f"{os.readlink(existing)}, which does not exist; make that "
                              f"folder or remove the link, or {fix}")
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"cannot make the run folder {path}: {existing} is a file, not a "
                          f"folder; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot make the run folder {path}: {existing} is not writable; "
                          f"{fix}")


def check_writable_folder(folder: Path, what: str, alternative: str = "") -> None:
    """Raise ``RunFolderError`` (one line) when ``what`` (``checkpoints``, say) could not be
    written into ``folder`` later in the run, so that no work is lost finding out at the first
    save: a file (or a broken link) stands where the folder must be, or the folder refuses a
    new file (its permissions, a read-only file system), found by making and removing one;
    a folder that does not exist yet, its parent, where it will be made (nothing is made
    here). ``alternative``: another way out, after the fix (`` or pick another --run-name``).
    """
    shown = display_path(str(folder))
    if folder.is_symlink() and not folder.exists():
        raise RunFolderError(f"cannot write {what}: {shown} is a link to "
                             f"{os.readlink(folder)}, which does not exist; make that folder "
                             f"or remove the link{alternative}")
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"cannot write {what}: {shown} is a file, not a folder; move it "
                             f"away{alternative}")
    probed = folder if folder.exists() else folder.parent
    if not probed.is_dir():
        return  # made with its parents when the run starts writing, checked there
    try:
        with tempfile.NamedTemporaryFile(dir=probed, prefix=".write_check."):
            pass
    except OSError as error:
        raise RunFolderError(f"cannot write {what} into {display_path(str(probed))} "
                             f"({error.strerror or error}); make it writable{alternative}"
                             ) from None


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


def run_dir_of(cfg: Config) -> Path:
    """The resumed run's folder (that of the checkpoint ``cfg.resume`` picks: it may name
    the run, its ``checkpoints/`` or a checkpoint file), or a new one under ``cfg.log_dir``."""
    if not cfg.resume:
        return Path(cfg.log_dir) / run_name(cfg)
    return run_folder_of(find_checkpoint(cfg.resume))


def own_run_dir(cfg: Config, run_dir: Path, owned: contextlib.ExitStack) -> None:
    """Lock ``run_dir`` for this process until ``owned`` closes: a second training of the
    same folder, new or resumed, gets one line instead of mixing its files into this one."""
    if cfg.resume:
        find_checkpoint(cfg.resume)  # a wrong --resume path is its own line, and makes no folder
        advice = "wait for it to end before resuming it"
    else:
        advice = "wait for it to end or pick another --run-name"
    owned.enter_context(RunLock(run_dir, advice=advice))


# ----------------------------------------------------------------------------- run ownership

# The descriptors of the run locks this process holds. A forked child (AsyncVectorEnv's
# workers) shares them, and with them the lock: it would keep a run killed
# with kill -9 locked until it noticed its parent was gone. Children close their copies (that
# leaves the parent's lock in place: a flock goes with the last descriptor of its file).
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork (nor flock)
    os.register_at_fork(after_in_child=_close_held_in_child)


class RunLock:
    """Ownership of a run folder by one training process for its whole life: an exclusive
    advisory lock (``flock``) on ``<run_dir>/.lock``, a file that names the owner's pid and
    host for the line a second process gets.

    The kernel drops the lock when its process ends in any way, ``kill -9`` included, so the
    lock of a dead run is simply free again: nothing stale is ever left to remove by hand.
    Readers (evaluation) take no lock; reading a run while it trains is fine. Where ``fcntl``
    does not exist (Windows) runs are not locked; where the file system refuses locks a
    warning says so and the run goes on unlocked.

    Args:
        run_dir: the run folder; made (with its parents) when missing, and removed again on
            release when it was made here and nothing else was written into it, so a run
            refused for bad input leaves no empty folder behind.
        advice: what the refused process should do instead, the end of its one line.
        owner: what holds the folder, as that line names it (a training, a sweep).

    Raises:
        RunFolderError: on entering, when another process owns the folder or the lock file
            cannot be made.
    """

    def __init__(self, run_dir: Path | str, *,
                 advice: str = "wait for it to end or pick another --run-name",
                 owner: str = "training") -> None:
        self.run_dir = Path(run_dir)
        self.owner = owner
        self.path = self.run_dir / LOCK_FILE
        self.advice = advice
        self._fd: int | None = None
        self._made: list[Path] = []

    def __enter__(self) -> RunLock:
        if fcntl is None:
            return self
        self._made = [p for p in (self.run_dir, *self.run_dir.parents) if not p.exists()]
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._fd = self._lock()
            if self._fd is not None:
                _HELD.add(self._fd)
                os.ftruncate(self._fd, 0)
                os.write(self._fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        except OSError as error:
            self.__exit__(None, None, None)
            raise RunFolderError(
                f"cannot make the lock file {display_path(str(self.path))} "
                f"({error.strerror or error}); the run folder must be writable") from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _lock(self) -> int | None:
        """The descriptor of the locked file at ``self.path``; None when locks are refused."""
        assert fcntl is not None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunFolderError(self._in_use()) from None
            except OSError as error:
                os.close(fd)
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                warnings.warn(f"{display_path(str(self.run_dir))}: the file system refuses "
                              "locks, so nothing stops a second training from using this run "
                              "folder at the same time", stacklevel=3)
                return None
            # The previous owner removes the file on release: if it did so after we opened
            # it, we hold a lock on a file no one else can find. Lock the one at the path.
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def _in_use(self) -> str:
        try:
            pid, _, host = self.path.read_text(encoding="utf-8").strip().partition(" ")
        except (OSError, UnicodeDecodeError):
            pid, host = "", ""
        owner = ""
        if pid.isdigit():  # empty for the moment between the owner's lock and its write
            owner = f" (pid {pid})" if host in ("", socket.gethostname()) else (
                f" (pid {pid} on {host})")
        return (f"{display_path(str(self.run_dir))} is in use by another {self.owner}{owner}; "
                f"{self.advice}")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            # Removed while still held, so no one takes a lock on it in between (see _lock).
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            _HELD.discard(self._fd)
            os.close(self._fd)
            self._fd = None
        for folder in self._made:  # innermost first; rmdir leaves a folder that is not empty
            try:
                folder.rmdir()
            except OSError:
                break
        self._made = []


class PartialSaves(NamedTuple):
    """What :func:`remove_partial_saves` removed."""

    files: int
    size: int  # bytes

    def describe(self) -> str:
        """``removed 3 partial checkpoint files (45 MB)``."""
        size = (f"{self.size / 1e6:.0f} MB" if self.size >= 1e6 else
                f"{self.size / 1e3:.0f} kB" if self.size >= 1e3 else f"{self.size} bytes")
        noun = "file" if self.files == 1 else "files"
        return f"removed {self.files} partial checkpoint {noun} ({size})"


def remove_partial_saves(run_dir: Path | str) -> PartialSaves:
    """Delete the temporary files that saves of killed runs left in ``checkpoints/``.

    Call it only while holding the run's :class:`RunLock`: the temporary file of a save in
    progress looks just the same.
    """
    files = size = 0
    for path in (Path(run_dir) / CHECKPOINT_DIR).glob(PARTIAL_FILES):
        try:
            bytes_ = path.stat().st_size
            path.unlink()
        except OSError:
            continue
        files, size = files + 1, size + bytes_
    return PartialSaves(files, size)


def clean_partial_saves(run_dir: Path) -> PartialSaves | None:
    """Delete what saves of killed runs left half-written in the (owned) ``run_dir``; return
    what was deleted, None when nothing was."""
    removed = remove_partial_saves(run_dir)
    return removed if removed.files else None


EVENT_FILES = "events.out.tfevents.*"
EARLIER_START = "earlier_start"


def set_aside_earlier_logs(run_dir: Path) -> Path | None:
    """Move the event files that an earlier run in the (owned) ``run_dir`` left, one that
    ended before its first checkpoint, into ``earlier_start[_N]/`` with their layout kept;
    return that folder, None when there were none.

    A run started again under the same name starts at step 0: left in place, its old event
    files would make tensorboard draw both runs as one curve that repeats its steps. Moved,
    not deleted, they show as a run of their own beside it."""
    def earlier(path: Path) -> bool:
        return path.relative_to(run_dir).parts[0].startswith(EARLIER_START)

    found = [path for path in run_dir.rglob(EVENT_FILES) if not earlier(path)]
    if not found:
        return None
    folder, n = run_dir / EARLIER_START, 1
    while folder.exists():  # a third start, and so on
        n += 1
        folder = run_dir / f"{EARLIER_START}_{n}"
    for path in found:
        target = folder / path.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    return folder
