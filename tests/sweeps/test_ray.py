"""The stop signals around a sweep's Ray, with Ray itself stubbed out: SIGTERM and SIGHUP act
as a Ctrl-C, one that comes while Ray starts waits for it, an ignored SIGHUP (``nohup``) stays
ignored, and the handlers are given back. (A real sweep stopped by a signal to its process
group: tests/test_sweep.py.)"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from rl_graphstep.sweeps.ray import started_ray


@pytest.fixture
def ray_stub(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """Replace ``ray.init`` by a call of the function given, ``ray.shutdown`` by nothing."""
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "shutdown", lambda: None)

    def init_does(action: Callable[[], None]) -> None:
        monkeypatch.setattr(ray, "init", lambda **_kwargs: action())

    init_does(lambda: None)
    return init_does


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["term", "hup"])
def test_a_stop_signal_is_a_ctrl_c_noted_by_its_name(
        signum: int, ray_stub: Callable[[Callable[[], None]], None]) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    stopped: list[int] = []
    with pytest.raises(KeyboardInterrupt), started_ray(None, stopped):
        signal.raise_signal(signum)
    assert stopped == [signum]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_stop_signal_while_ray_starts_waits_for_it(
        ray_stub: Callable[[Callable[[], None]], None]) -> None:
    """Ray sets a SIGTERM handler of its own while it starts (which would exit at once)."""
    ray_stub(lambda: signal.raise_signal(signal.SIGTERM))
    stopped: list[int] = []
    reached = False
    with pytest.raises(KeyboardInterrupt), started_ray(None, stopped):
        reached = True  # not reached: the signal is delivered once Ray is up
    assert stopped == [signal.SIGTERM] and not reached
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGTERM, signal.SIGHUP} == set()


def test_an_ignored_sighup_stays_ignored(ray_stub: Callable[[Callable[[], None]], None]) -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with started_ray(None, []):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
