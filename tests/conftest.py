"""Shared test set-up: one intra-op thread, the stop signals not ignored, `cuda` tests skip
cleanly on a machine without a GPU, a `torch_threads` fixture, a `children` fixture (processes
a test starts, ended with it: processtools), and `slow` tests (minutes of training) run without
the stack dump of `faulthandler_timeout`."""

from __future__ import annotations

import faulthandler
import signal
import warnings
from collections.abc import Iterator

import pytest
import torch
from processtools import Children

from rl_graphstep.core.errors import STOP_SIGNALS
from rl_graphstep.run import threads
from rl_graphstep.run.threads import user_chose_threads


def pytest_configure(config: pytest.Config) -> None:
    # The tests' updates are small; with torch's thread per core, the idle workers spinning
    # against other processes made them several times slower on a busy machine, as in
    # training (rl_graphstep/run/threads.py). A count the user set in the environment is kept.
    if not user_chose_threads():
        torch.set_num_threads(1)
    stop_signals_as_from_a_terminal()


def stop_signals_as_from_a_terminal() -> None:
    """The suite's stop signals act as in a terminal, whatever started it: a shell's
    background job inherits an ignored SIGINT and ``nohup`` an ignored SIGHUP, and a run
    keeps an ignored signal ignored by design, so the tests that stop a run in this process
    would find nothing to stop it. (The tests of ignored signals ignore them themselves.)"""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # pytest arms the timed dump before the test's setup and cancels it after its teardown; a
    # learning run passes the timeout by design, and 80 lines of stack then read like a hang.
    if "slow" in item.keywords:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def torch_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No thread count chosen by the user (no OMP_NUM_THREADS, torch's count as at import),
    two threads to start from; the process's count comes back after the test."""
    before = torch.get_num_threads()
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_IMPORT_COUNT", 2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def children() -> Iterator[Children]:
    """Start a test's processes (``children.python(...)``): each with default stop signals
    and stdin /dev/null, and killed with its process group when the test ends in any way."""
    started = Children()
    try:
        yield started
    finally:
        started.end_all()


@pytest.fixture(autouse=True)
def stop_signal_handlers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with the stop signals' handlers the one before it found: a handler
    left behind (an ignored SIGTERM, say) changes what the next test in the same process sees.
    One that changed is put back, with a warning that names the test that left it."""
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    changed = [signal.Signals(s).name for s, handler in before.items()
               if signal.getsignal(s) is not handler]
    for signum, handler in before.items():
        if handler is not None:  # None: set outside Python, not restorable from here
            signal.signal(signum, handler)
    if changed:
        warnings.warn(f"{request.node.nodeid} left the handlers of {', '.join(changed)} "
                      "changed (put back)", stacklevel=1)
