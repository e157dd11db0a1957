"""Python child processes of the tests, started as a user's shell would start them whatever
shell started pytest, and ended in every outcome of the test.

A child inherits its parent's ignored signals: under ``nohup`` (CI systems, batch jobs) SIGHUP
is ignored, and a shell's background job ignores SIGINT, and the training program keeps a stop
signal ignored at its start ignored (as ``nohup`` asks). So a test that sends a signal sets
the child's handling of it; each child here starts with SIGHUP, SIGINT and SIGTERM handled by
default. Its stdin is ``/dev/null`` unless the test gives one: pytest's own may be closed or a
terminal nobody types into.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)

# Run by a fresh interpreter before it becomes the child (exec keeps the pid, and the default
# handling set here; only handled signals are reset by exec, ignored ones stay ignored). A
# wrapper rather than a preexec_fn, which is not safe in a parent with threads (torch's).
_DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    f"for s in {[int(s) for s in STOP_SIGNALS]}: signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def python_command(*args: str) -> list[str]:
    """``python ARGS`` with SIGHUP, SIGINT and SIGTERM handled by default in that Python."""
    return [sys.executable, "-c", _DEFAULT_SIGNALS, sys.executable, *args]


def run_python(*args: str, timeout: float = 300, **kwargs: Any
               ) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``python ARGS`` (see :func:`python_command`), stdin ``/dev/null``
    unless given; killed on its ``timeout`` or any error (``subprocess.run`` does)."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(python_command(*args), timeout=timeout, **kwargs)


@contextlib.contextmanager
def started_python(*args: str, **kwargs: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen`` of ``python ARGS`` (see :func:`python_command`), stdin
    ``/dev/null`` unless given; killed when the block ends in any way (its process group too,
    with ``start_new_session=True``: the env subprocesses it started) and waited for, its
    pipes closed."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    process = subprocess.Popen(python_command(*args), **kwargs)
    try:
        yield process
    finally:
        end(process, group=bool(kwargs.get("start_new_session")))


def end(process: subprocess.Popen, *, group: bool = False) -> None:
    """Kill ``process`` (with ``group``, every process of its group, which it leads) unless it
    has ended, wait for it, and close its pipes."""
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    elif process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
