"""What a run prints: the bar's rate and ETA on a fake clock, the periodic line without a
terminal, and the final line."""

from __future__ import annotations

import io
import os
import sys

import pytest

from rl_graphstep.run.aggregate import bootstrap_interval, iqm
from rl_graphstep.run.console import (
    ProgressDisplay,
    RateWindow,
    done_line,
    eta_seconds,
    format_duration,
    group_done_line,
    group_progress_line,
    progress_line,
    say,
    silence,
    summary_line,
)


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class GoneReader(io.StringIO):
    """A stream whose reader has gone: every write fails as a closed pipe's does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_the_rate_is_the_recent_one_and_learning_restarts_it() -> None:
    window = RateWindow(step=0, now=0.0)
    assert window.read(1000, 0.1) == pytest.approx(10_000)  # the random warm-up
    window.restart(1000, 30.1)  # 30 s building the updates
    assert window.read(3600, 31.1) == pytest.approx(2600)
    assert window.read(6200, 32.1) == pytest.approx(2600)  # not 6200 / 32.1 = 193
    assert window.read(6200, 32.1) is None  # no time passed


def test_the_eta_uses_the_learning_phase_rate() -> None:
    learning = (30.1, 1000)  # learning started at step 1000, after the build
    # 2,600 steps/s since then; the recent rate (here a slow interval) does not matter.
    assert eta_seconds(6200, 50_000, learning, 32.1, recent=100.0,
                       random_only=False) == pytest.approx(43_800 / 2600)
    # Before learning, the learning phase's rate is not known: no ETA from the warm-up's.
    assert eta_seconds(500, 50_000, None, 0.05, recent=10_000.0, random_only=False) is None
    # A run that never learns goes at its recent rate to the end.
    assert eta_seconds(500, 1000, None, 0.05, recent=10_000.0, random_only=True) == 0.05


def test_the_bar_shows_the_recent_rate_and_the_learning_eta(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    with ProgressDisplay(50_000, 0, enabled=True, learning_starts=1000, terminal=True,
                         clock=clock) as bar:
        clock.now = 0.1
        bar.update(1000)
        bar.report(1000, [])
        assert bar.bar.postfix == "sps=10000"  # no ETA during the warm-up
        clock.now = 30.1
        bar.start_learning(1000)
        clock.now = 32.1
        bar.update(5200)
        bar.report(6200, [-150.0, -140.0])
        # The old postfix: sps=193 (the average since the start) and tqdm's ETA at that.
        assert bar.bar.postfix == "ret=-145.0, sps=2600, eta=17 s"
        assert "remaining" not in bar.bar.bar_format and "rate" not in bar.bar.bar_format
    assert "sps=2600, eta=17 s]" in capsys.readouterr().err


def test_without_a_terminal_a_line_at_most_every_few_seconds(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    with ProgressDisplay(50_000, 0, enabled=True, learning_starts=1000, terminal=False,
                         clock=clock) as bar:
        clock.now = 0.1
        bar.report(1000, [])  # too soon after the start
        clock.now = 30.1
        bar.start_learning(1000)
        for step in range(2000, 50_001, 1000):  # 2,000 steps/s: a log step every 0.5 s
            clock.now += 0.5
            bar.update(1000)
            bar.report(step, [-200.0])
    # The first line 30.5 s after the start, the next ones 10 s apart; the rate since the
    # previous line (the first: since learning started, not since the start).
    assert capsys.readouterr().out.splitlines() == [
        "step 2000/50000 (4%) | 2,000 steps/s | return -200.0 | eta 24 s",
        "step 22000/50000 (44%) | 2,000 steps/s | return -200.0 | eta 14 s",
        "step 42000/50000 (84%) | 2,000 steps/s | return -200.0 | eta 4 s",
    ]


def test_a_line_in_the_warm_up_says_learning_has_not_started() -> None:
    assert progress_line(3000, 50_000, 9800.0, None, None, learning=False) == (
        "step 3000/50000 (6%) | 9,800 steps/s | learning not started")


def test_disabled_prints_nothing_but_what_it_is_given(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    clock = FakeClock()
    with ProgressDisplay(100, 0, enabled=False, learning_starts=10, terminal=False,
                         clock=clock) as bar:
        bar.write("start")
        clock.now = 100.0
        bar.update(100)
        bar.report(100, [1.0])
    out, err = capsys.readouterr()
    assert (out, err) == ("start\n", "")


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (14.4, "14 s"), (200, "3 min 20 s"),
                                               (7500, "2 h 05 min")])
def test_durations_read_short(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_final_line_gives_both_rates() -> None:
    summary = {"global_step": 25_000, "episodes": 25, "mean_return_last_10": 1234.56,
               "sps": 510.2, "learning_sps": 2604.7, "build_seconds": 38.04,
               "run_dir": "runs/x"}
    assert done_line(summary) == (
        "done: 25000 steps, 25 episodes, mean return of the last 10: 1234.6, 510 steps/s "
        "(learning phase 2,605 steps/s; updates built in 38.0 s); logs in runs/x")
    # A run that never learned: no learning phase to give.
    summary.update(learning_sps=None, mean_return_last_10=None)
    assert done_line(summary) == ("done: 25000 steps, 25 episodes, mean return of the last "
                                  "10: n/a, 510 steps/s; logs in runs/x")


# ----------------------------------------------------------------------------- seed groups

GROUP_RECENT = [[-150.0, -140.0], [-300.0], [-120.0, -130.0, -110.0]]  # means -145, -300, -120


def test_a_groups_line_gives_the_seeds_mean_and_min_return() -> None:
    assert group_progress_line(12_000, 50_000, 14_020.0, GROUP_RECENT, 14.0) == (
        "step 12000/50000 (24%) | 14,020 steps/s | return mean -188.3, min -300.0 | eta 14 s")
    # Only the seeds that have finished an episode; none yet: no return at all.
    assert group_progress_line(3000, 50_000, 9800.0, [[-10.0], []], None) == (
        "step 3000/50000 (6%) | 9,800 steps/s | return mean -10.0, min -10.0")
    assert group_progress_line(3000, 50_000, 9800.0, [[], []], None, learning=False) == (
        "step 3000/50000 (6%) | 9,800 steps/s | learning not started")


def test_a_groups_bar_and_lines(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    with ProgressDisplay(50_000, 0, enabled=True, learning_starts=1000, terminal=True,
                         clock=clock) as bar:
        clock.now = 30.0
        bar.start_learning(1000)
        clock.now = 32.0
        bar.update(6000)
        bar.report_group(6000, GROUP_RECENT)
        assert bar.bar.postfix == "ret=-188.3, min=-300.0, sps=2500, eta=18 s"
    capsys.readouterr()
    with ProgressDisplay(50_000, 0, enabled=True, learning_starts=0, terminal=False,
                         clock=clock) as bar:
        clock.now += 20.0
        bar.start_learning(0)
        clock.now += 10.0
        bar.report_group(5000, GROUP_RECENT)
    assert capsys.readouterr().out.splitlines() == [
        "step 5000/50000 (10%) | 500 steps/s | return mean -188.3, min -300.0 | eta 1 min 30 s"]


GROUP_SUMMARY = {"global_step": 25_000, "episodes": 375, "sps": 9_000.4,
                 "learning_sps": 12_010.0, "build_seconds": 40.0, "run_dir": "runs/g",
                 "seeds": (1, 2, 3), "recent_returns": GROUP_RECENT}


def test_a_groups_final_line_gives_each_seed_and_the_iqm() -> None:
    low, high = bootstrap_interval([-145.0, -300.0, -120.0], iqm)
    assert group_done_line(GROUP_SUMMARY) == (
        "done: 25000 steps, 375 episodes, 9,000 steps/s (learning phase 12,010 steps/s; "
        "updates built in 40.0 s); seeds 1-3 mean return of the last 10: 1: -145.0, "
        f"2: -300.0, 3: -120.0, IQM -188.3 [95% {low:.1f}, {high:.1f}]; logs in runs/g")
    summary = {**GROUP_SUMMARY, "seeds": (3, 5, 7), "recent_returns": [[-1.0], [], [-2.0]],
               "learning_sps": None, "skipped_transitions": 0,
               "updates": {"critic": (0, 100), "actor": (0, 50)}}
    line = group_done_line(summary)
    assert line.startswith("done: 25000 steps, 375 episodes, 9,000 steps/s; seeds 3, 5, 7 mean "
                           "return of the last 10: 3: -1.0, 5: n/a, 7: -2.0, IQM n/a (a seed "
                           "has no finished episode); skipped 0 non-finite transitions, ")
    assert "\n" not in line and line.endswith("; logs in runs/g")


def test_the_last_line_is_a_groups_for_several_seeds_only() -> None:
    one = {**GROUP_SUMMARY, "seeds": (3,), "recent_returns": [[-1.0]],
           "mean_return_last_10": -1.0}
    assert summary_line(one) == done_line(one)
    assert summary_line(GROUP_SUMMARY) == group_done_line(GROUP_SUMMARY)


def test_a_gone_reader_silences_the_lines_and_is_heard_of_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", GoneReader())
    clock, lost = FakeClock(), []
    with ProgressDisplay(50_000, 0, enabled=True, learning_starts=0, terminal=False,
                         clock=clock) as bar:
        bar.on_lost = lambda: lost.append(clock.now)
        bar.write("the first line")  # no BrokenPipeError in the middle of a step
        for step in range(1000, 50_001, 1000):
            clock.now += 5.0
            bar.update(1000)
            bar.report(step, [-200.0])
        bar.write("the last line")
    assert lost == [0.0]
    assert bar.lost and not bar.lines


def test_say_drops_a_line_nobody_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", GoneReader())
    say("done: ...")  # no traceback for the last line of a command
    out = io.StringIO()
    say("error: ...", out)
    assert out.getvalue() == "error: ...\n"


def test_a_silenced_pipe_takes_writes_again() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone
    with open(write_end, "w") as stream:
        with pytest.raises(BrokenPipeError):
            stream.write("x" * 100_000)  # more than the buffer holds: it reaches the pipe
            stream.flush()
        silence(stream)
        stream.write("y" * 100_000)
        stream.flush()  # now the null device's: no error, and none at close either
