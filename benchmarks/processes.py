"""Starting a benchmark's child cold, and ending it with everything it started (env workers, a
compiler's helpers).

A child that compiles (``torch.compile``) reads and fills the compiler's on-disk caches, which
by default every process of the user shares: a run after another of the same networks builds
its updates in a third of the time (40.9 -> 15.1 s, benchmarks/LOG.md). A benchmark whose
children time start-up gives each its own empty cache folder (:func:`cold_compile`), so that
no arm's time depends on the arms before it.

Each child leads a process group of its own (``start_new_session``). A signal to the group is
delivered asynchronously, and waiting for the leader says nothing of the rest: a worker that
was still being killed would take the next arm's CPU, or outlive the benchmark. So ending a
group waits until none of its members is alive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# How long a SIGKILLed group may take to be gone before it is given up on (a process in the
# kernel's uninterruptible sleep ignores even SIGKILL until it wakes).
KILL_WAIT_S = 30.0


@contextlib.contextmanager
def cold_compile(cache: Path) -> Iterator[dict[str, str]]:
    """This process's environment with the compiler's caches (inductor's, which holds the FX
    graph and AOTAutograd caches, and Triton's kernels) in ``cache``: empty on entry, removed
    on exit."""
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    try:
        yield {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache),
               "TRITON_CACHE_DIR": str(cache / "triton")}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def group_members(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (exited ones not yet reaped, zombies, are not):
    read from /proc on Linux; elsewhere [pgid] while the group can still be signalled."""
    if not sys.platform.startswith("linux"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command's name (which may hold spaces and parentheses): state, ppid, pgrp.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # it ended while being read
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def end_group(process: subprocess.Popen, signum: int = signal.SIGTERM,
              grace_s: float = 10.0) -> int:
    """End ``process`` (a group leader) and every member of its group: ``signum`` first, while
    it still runs, then SIGKILL after ``grace_s`` seconds; returns once the leader is reaped
    and no member is alive. Safe to call again, or after the leader ended by itself. The
    leader's exit code."""
    try:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signum)
                process.wait(grace_s)
    finally:  # a second Ctrl-C during the grace still kills
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        deadline = time.monotonic() + KILL_WAIT_S
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    return code
