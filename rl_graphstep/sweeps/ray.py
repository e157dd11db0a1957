"""The Ray a sweep runs on, started (or joined) so that the sweep stops cleanly: a local Ray's
processes in a session of their own, SIGTERM and SIGHUP turned into the Ctrl-C on which Tune
saves its state and stops the trials, and Tune's own lines about that stop left out (the
sweep says in its own line how to continue)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "started_ray"]

# A Ctrl-C (SIGINT) Tune handles itself. Windows has no SIGHUP, nor signal masks.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
# The starts of what Tune logs when stopped: the Python call it suggests is not the command.
_TUNE_STOP_LINES = ("Stop signal received", "Experiment has been interrupted")


@contextlib.contextmanager
def started_ray(address: str | None, stopped_by: list[int]) -> Iterator[None]:
    """Ray started (``address`` None) or joined for the ``with`` block, and shut down after
    it. SIGTERM and SIGHUP (not an ignored one: ``nohup``) stop the block as a Ctrl-C does,
    each noted in ``stopped_by``: within Tune's run it stops the trials, which save, and
    Tune keeps its state; before it, a ``KeyboardInterrupt``. One that comes while Ray
    starts waits for it."""
    import ray

    _mask(signal.SIG_BLOCK)  # ray.init sets handlers of its own
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    quiet = _TuneStopFilter()
    tune_log = logging.getLogger("ray.tune.tune")
    try:
        with _ray_in_its_own_session():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)

        def stop(signum: int, frame: FrameType | None) -> None:
            stopped_by.append(signum)
            # What a Ctrl-C does now: Tune's handler within its run, Python's before it. Called,
            # not sent: a process started in the background may ignore SIGINT.
            on_ctrl_c = signal.getsignal(signal.SIGINT)
            if not callable(on_ctrl_c):
                raise KeyboardInterrupt
            on_ctrl_c(signal.SIGINT, frame)

        for signum in STOP_SIGNALS:
            if previous[signum] is not signal.SIG_IGN:
                signal.signal(signum, stop)
        tune_log.addFilter(quiet)
        _mask(signal.SIG_UNBLOCK)
        yield
    finally:
        _mask(signal.SIG_UNBLOCK)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        tune_log.removeFilter(quiet)
        ray.shutdown()


def _mask(how: int) -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(how, STOP_SIGNALS)


class _TuneStopFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TUNE_STOP_LINES)


@contextlib.contextmanager
def _ray_in_its_own_session() -> Iterator[None]:
    """Start the processes of a local Ray (GCS, raylet, and through it the trials' workers)
    in a session of their own. A signal to the sweep's process group, as ``timeout``, a
    batch system or systemd send it, then reaches the driver only, which stops the trials
    cleanly, instead of finding Ray killed under it. They still end with the driver: Ray ties
    them to it with the kernel's parent-death signal, which is why this is done only where
    Ray has that (Linux); elsewhere its reaper kills them by their process group, which must
    stay the driver's. They also take the stop signals the driver holds back meanwhile."""
    import ray._private.services as services
    from ray._private.utils import detect_fate_sharing_support

    popen = getattr(services, "ConsolePopen", None)
    if popen is None or sys.platform == "win32" or not detect_fate_sharing_support():
        yield
        return

    class OwnSession(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            inherited = kwargs.get("preexec_fn")

            def preexec() -> None:
                if inherited is not None:
                    inherited()
                _mask(signal.SIG_UNBLOCK)

            kwargs["preexec_fn"] = preexec
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = popen
