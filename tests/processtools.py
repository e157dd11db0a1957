"""Child processes of the tests: started as a user's shell starts them, whatever started
pytest, and ended in every outcome of the test.

- Signals: a child inherits its parent's ignored signals. Under ``nohup`` (CI systems, batch
  jobs) SIGHUP is ignored, a shell's background job ignores SIGINT, and the training program
  keeps a stop signal that was ignored at its start ignored (as ``nohup`` asks): a test that
  sends one would wait for nothing. Each child here starts with SIGHUP, SIGINT, SIGTERM and
  SIGPIPE handled by default, through a tiny Python that resets them and execs the command
  (same pid; a ``preexec_fn`` is not safe in a parent with threads, as torch's).
- stdin: ``/dev/null`` unless the test gives one; pytest's own may be closed, or a terminal.
- Ending: each child leads a process group of its own (``start_new_session``), killed whole
  when the test ends in any way (:func:`run` ends its own; the ``children`` fixture of
  ``conftest.py`` ends those :meth:`Children.start` started), and on Linux killed when pytest
  dies (see ``_RESET_AND_EXEC``), so no training process or env worker outlives a failed or
  interrupted test, or a killed pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)

# argv: the parent's pid, then the command. On Linux the child is also killed when its parent
# (pytest) dies in any way, even by SIGKILL, where no clean-up runs (PR_SET_PDEATHSIG, which
# exec keeps): in a group of its own, a signal to pytest's group no longer reaches it.
_RESET_AND_EXEC = (
    "import os, signal, sys\n"
    f"for s in {[int(s) for s in DEFAULT_SIGNALS]}: signal.signal(s, signal.SIG_DFL)\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        os._exit(137)  # the parent died before that took hold\n"
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


def with_default_signals(command: Sequence[str]) -> list[str]:
    """``command`` run with SIGHUP, SIGINT, SIGTERM and SIGPIPE handled by default (and on
    Linux killed when this process dies)."""
    return [sys.executable, "-S", "-c", _RESET_AND_EXEC, str(os.getpid()), *command]


# The processes started here that lead a process group of their own (by pid).
_LEADERS: set[int] = set()


def _popen(command: Sequence[str], kwargs: dict[str, Any]) -> subprocess.Popen:
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("start_new_session", True)
    process = subprocess.Popen(with_default_signals(command), **kwargs)
    if kwargs["start_new_session"]:
        _LEADERS.add(process.pid)
    return process


def end(process: subprocess.Popen) -> None:
    """Kill ``process`` and, when it leads its own group, every process left in that group
    (env workers, a local Ray), even after it was waited for (the kernel keeps a group's id
    from being reused while any member lives); wait for it and close its pipes."""
    if process.pid in _LEADERS:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # no member left
            os.killpg(process.pid, signal.SIGKILL)
        _LEADERS.discard(process.pid)
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def run(command: Sequence[str], *, timeout: float = 300, capture_output: bool = False,
        check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(command, ...)`` as above: its process group killed when it ends, times
    out or the test is interrupted, not only the process."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    process = _popen(command, kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        end(process)
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


def run_python(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`run` of ``python ARGS`` (this interpreter)."""
    return run([sys.executable, *args], **kwargs)


class Children:
    """The processes a test started (the ``children`` fixture), ended when it ends."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """``subprocess.Popen(command, ...)`` as the module docstring says."""
        process = _popen(command, kwargs)
        self.started.append(process)
        return process

    def python(self, *args: str, **kwargs: Any) -> subprocess.Popen:
        """:meth:`start` of ``python ARGS`` (this interpreter)."""
        return self.start([sys.executable, *args], **kwargs)

    def end_all(self) -> None:
        for process in self.started:
            end(process)
        self.started.clear()


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (Linux: read from /proc). An exited one not yet
    reaped by its new parent, a zombie, counts as ended."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
