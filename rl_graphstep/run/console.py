"""What a training run prints while it runs and at its end: a progress bar on a terminal, a
short periodic line in a file or a pipe, and the final ``done:`` line; and what becomes of
them when the console's reader goes away (a closed pipe, a hung-up terminal)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TextIO

import numpy as np
from tqdm import tqdm

from rl_graphstep.run.aggregate import group_returns, seed_means
from rl_graphstep.run.nonfinite import describe_updates

# Without a terminal, one progress line at most this often (at a log step): a 1M-step run at
# 2,600 steps/s logs every 0.4 s, which would bury the log file in lines.
LINE_SECONDS = 10.0
# tqdm's own rate and ETA average since the start (smoothed), so the fast random warm-up and
# the pause while the updates are built skew both: the bar shows the elapsed time and the
# postfix our rate and ETA instead.
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes and closed or
    replaced streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_duration(seconds: float) -> str:
    """``14 s``, ``3 min 20 s``, ``2 h 05 min``: short and rounded to what matters."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def silence(stream: TextIO) -> None:
    """Point ``stream``, whose reader has gone, at the null device: what is still written to
    it (its buffer, the interpreter's flush at exit, the env workers sharing its file) is
    dropped instead of failing again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no file behind it
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)


def say(line: str, stream: TextIO | None = None) -> None:
    """Print ``line`` to ``stream`` (stdout) at once, or silence the stream when its reader
    has gone (``train | head`` has ended, the terminal has closed): a command's last line
    must not end it with a traceback."""
    stream = sys.stdout if stream is None else stream
    try:
        print(line, file=stream, flush=True)
    except OSError:  # BrokenPipeError from a pipe, EIO from a hung-up terminal
        silence(stream)


class RateWindow:
    """Steps per second since the previous reading: the recent rate, not the average since
    the start."""

    def __init__(self, step: int, now: float) -> None:
        self.mark = (now, step)

    def restart(self, step: int, now: float) -> None:
        """Start the window afresh, e.g. when learning starts: the random warm-up's steps and
        the seconds spent building the updates stay out of the next reading."""
        self.mark = (now, step)

    def read(self, step: int, now: float) -> float | None:
        """The rate since the previous reading (or restart), which this reading then ends;
        None when no time has passed."""
        began, first = self.mark
        self.mark = (now, step)
        return (step - first) / (now - began) if now > began else None


def eta_seconds(step: int, total: int, learning: tuple[float, int] | None, now: float,
                recent: float | None, random_only: bool) -> float | None:
    """Seconds left at the learning phase's rate since it started (``learning`` is its
    ``(time, step)`` start), or at the recent rate when the run never learns; None before
    learning starts, when the slower learning phase's rate is not known yet."""
    rate = recent
    if learning is not None and step > learning[1] and now > learning[0]:
        rate = (step - learning[1]) / (now - learning[0])
    elif learning is None and not random_only:
        return None
    return (total - step) / rate if rate else None


def progress_line(step: int, total: int, sps: float | None, mean_return: float | None,
                  eta: float | None, learning: bool = True) -> str:
    """``step 12000/50000 (24%) | 2,610 steps/s | return -143.2 | eta 14 s`` (the mean return
    of the last 10 episodes; before ``learning``, no ETA but a note that it has not started)."""
    shown = None if mean_return is None else f"return {mean_return:.1f}"
    return _line(step, total, sps, shown, eta, learning)


def group_progress_line(step: int, total: int, sps: float | None,
                        recent: Sequence[Sequence[float]], eta: float | None,
                        learning: bool = True) -> str:
    """A seed group's :func:`progress_line`: ``... | 14,020 steps/s | return mean -143.2, min
    -180.5 | ...``, the mean and the lowest of the seeds' mean recent returns (over the seeds
    that have finished an episode)."""
    return _line(step, total, sps, _group_returns(recent)[0], eta, learning)


def _group_returns(recent: Sequence[Sequence[float]]) -> tuple[str | None, dict[str, str]]:
    """The group's returns as the line and the bar's postfix show them (None, {}: none yet)."""
    means = [m for m in seed_means(recent) if m is not None]
    if not means:
        return None, {}
    mean, low = float(np.mean(means)), min(means)
    return f"return mean {mean:.1f}, min {low:.1f}", {"ret": f"{mean:.1f}", "min": f"{low:.1f}"}


def _line(step: int, total: int, sps: float | None, returns: str | None, eta: float | None,
          learning: bool) -> str:
    parts = [f"step {step}/{total} ({100 * step / total:.0f}%)"]
    if sps is not None:
        parts.append(f"{sps:,.0f} steps/s")
    if returns is not None:
        parts.append(returns)
    if eta is not None:
        parts.append(f"eta {format_duration(eta)}")
    elif not learning:
        parts.append("learning not started")
    return " | ".join(parts)


class ProgressDisplay:
    """The run's progress: a tqdm bar on stderr when it is a terminal, else one line on stdout
    at a log step at most every ``LINE_SECONDS``; with ``enabled`` False only what ``write``
    is given. Both show the rate since the previous report and the ETA at the learning
    phase's rate. Used as a context manager, like the tqdm bar it wraps.

    When the console's reader goes away (``train | tee log`` and ``tee`` dies with the
    terminal, ``train | head`` has its lines), the display falls silent instead of raising
    in the middle of a step, and calls ``on_lost`` once: the loop stops there and saves."""

    def __init__(self, total: int, initial: int, *, enabled: bool, learning_starts: int,
                 terminal: bool | None = None, clock: Callable[[], float] = time.perf_counter
                 ) -> None:
        self.total = total
        self.clock = clock
        now = clock()
        self.window = RateWindow(initial, now)
        self.learning: tuple[float, int] | None = None
        self.random_only = learning_starts >= total
        self.last_line = now
        terminal = is_terminal(sys.stderr) if terminal is None else terminal
        self.lines = enabled and not terminal
        self.bar = tqdm(total=total, initial=initial, disable=not (enabled and terminal),
                        unit="step", dynamic_ncols=True, bar_format=BAR_FORMAT)
        self.on_lost: Callable[[], None] | None = None
        self.lost = False

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.bar.close()

    def write(self, line: str) -> None:
        """A line on stdout (above the bar when there is one), flushed: a pipe shows it now.
        A failed write means stdout's reader has gone: stdout and the lines fall silent, and
        ``on_lost`` hears of it. (The bar, on a terminal's stderr, needs no such care: tqdm
        stops drawing when a hung-up terminal fails its writes.)"""
        if self.lost:
            return
        try:
            self.bar.write(line)
            sys.stdout.flush()
        except OSError:  # BrokenPipeError from a pipe, EIO from a hung-up terminal
            silence(sys.stdout)
            self.lost, self.lines = True, False
            if self.on_lost is not None:
                self.on_lost()

    def update(self, steps: int) -> None:
        self.bar.update(steps)

    def start_learning(self, step: int) -> None:
        """The learning phase begins at ``step`` (after its updates were built)."""
        now = self.clock()
        self.learning = (now, step)
        self.window.restart(step, now)

    def report(self, step: int, recent_returns: Iterable[float]) -> None:
        """At a log step: the bar's postfix, or a line when one is due."""
        returns = list(recent_returns)
        mean_return = float(np.mean(returns)) if returns else None
        if mean_return is None:
            self._report(step, None, {})
        else:
            self._report(step, f"return {mean_return:.1f}", {"ret": f"{mean_return:.1f}"})

    def report_group(self, step: int, recent: Sequence[Sequence[float]]) -> None:
        """:meth:`report` for a seed group, from each seed's recent returns: the mean and
        the lowest of the seeds' means (see :func:`group_progress_line`)."""
        self._report(step, *_group_returns(recent))

    def _report(self, step: int, returns: str | None, returns_postfix: dict[str, str]) -> None:
        now = self.clock()
        if self.lines and now - self.last_line < LINE_SECONDS:
            return  # the window keeps running until the next line
        if not self.lines and self.bar.disable:
            return
        sps = self.window.read(step, now)
        eta = eta_seconds(step, self.total, self.learning, now, sps, self.random_only)
        if self.lines:
            self.last_line = now
            self.write(_line(step, self.total, sps, returns, eta,
                             learning=self.learning is not None or self.random_only))
            return
        postfix = dict(returns_postfix)
        if sps is not None:
            postfix["sps"] = f"{sps:.0f}"
        if eta is not None:
            postfix["eta"] = format_duration(eta)
        self.bar.set_postfix(postfix)


def done_line(summary: Mapping[str, Any]) -> str:
    """The run's last line: counts, mean return, the whole run's rate beside the learning
    phase's (the whole run's counts the random warm-up and the build), and the log folder.
    Built from a list of parts, so more can be added."""
    ret = summary["mean_return_last_10"]
    return _done(summary, f"mean return of the last 10: {'n/a' if ret is None else f'{ret:.1f}'}",
                 None)


def group_done_line(summary: Mapping[str, Any]) -> str:
    """A seed group's :func:`done_line`: the steps (each seed's), all seeds' episodes, the
    rates of the whole group, then each seed's mean return of its last 10 episodes and the
    IQM over the seeds with its 95% bootstrap band: ``...; seeds 1-8 mean return of the last
    10: 1: -150.2, 2: -148.1, ..., IQM -148.0 [95% -160.1, -140.3]; ...``. ``summary`` holds
    ``seeds`` and ``recent_returns`` (each seed's last 10 returns) beside done_line's keys."""
    seeds, recent = tuple(summary["seeds"]), summary["recent_returns"]
    each = ", ".join(f"{seed}: {'n/a' if m is None else f'{m:.1f}'}"
                     for seed, m in zip(seeds, seed_means(recent), strict=True))
    stats = group_returns(recent)
    iqm_text = ("IQM n/a (a seed has no finished episode)" if stats is None else
                f"IQM {stats['iqm']:.1f} [95% {stats['iqm_low']:.1f}, {stats['iqm_high']:.1f}]")
    return _done(summary, None, f"seeds {seeds_text(seeds)} mean return of the last 10: "
                 f"{each}, {iqm_text}")


def summary_line(summary: Mapping[str, Any]) -> str:
    """The run's last line: :func:`group_done_line` for a group of seeds, else
    :func:`done_line`."""
    return group_done_line(summary) if len(summary["seeds"]) > 1 else done_line(summary)


def _done(summary: Mapping[str, Any], returns: str | None, group: str | None) -> str:
    rate = f"{summary['sps']:,.0f} steps/s"
    if summary.get("learning_sps") is not None:
        rate += (f" (learning phase {summary['learning_sps']:,.0f} steps/s; updates built in "
                 f"{summary['build_seconds']:.1f} s)")
    parts = [f"{summary['global_step']} steps", f"{summary['episodes']} episodes",
             *([returns] if returns is not None else []), rate]
    sections = [f"done: {', '.join(parts)}", *([group] if group is not None else [])]
    if summary.get("steps_taken") == 0:  # a resumed run already at its --total-timesteps
        sections.append(f"nothing to train: the run was at step {summary['global_step']} "
                        f"already (--total-timesteps {summary['total_timesteps']})")
    if "skipped_transitions" in summary:
        sections.append(f"skipped {summary['skipped_transitions']:,} non-finite transitions, "
                        f"{describe_updates(summary['updates'])}")
    return "; ".join([*sections, f"logs in {summary['run_dir']}"])


class LoopClock:
    """Times the loop: steps/s overall and over the learning phase, and how much of the
    learning phase the host spent on its own work rather than waiting for the device's
    actions (``summary`` takes the wait from the collector)."""

    def __init__(self, step: int) -> None:
        self.start = (time.perf_counter(), step)
        self.learning: tuple[float, int] | None = None
        self.build_seconds = 0.0

    def start_learning(self, step: int) -> None:
        self.learning = (time.perf_counter(), step)

    def sps(self, step: int) -> float:
        return (step - self.start[1]) / (time.perf_counter() - self.start[0])

    def summary(self, step: int, waited: float, waits: int) -> dict[str, float | None]:
        """Steps/s, over the learning phase too, and the host's own µs per iteration that
        waited ``waits`` times, ``waited`` seconds in all, for the actions."""
        now = time.perf_counter()
        result: dict[str, float | None] = {"sps": self.sps(step), "learning_sps": None,
                                           "host_us_per_iteration": None,
                                           "build_seconds": self.build_seconds}
        if self.learning is not None and step > self.learning[1]:
            elapsed = now - self.learning[0]
            result["learning_sps"] = (step - self.learning[1]) / elapsed
            if waits:
                result["host_us_per_iteration"] = (elapsed - waited) / waits * 1e6
        return result


def seeds_text(seeds: tuple[int, ...]) -> str:
    """A group's seeds as people write them: ``1-8`` when consecutive, else ``3, 5, 7``."""
    first, last = seeds[0], seeds[-1]
    if len(seeds) > 1 and seeds == tuple(range(first, last + 1)):
        return f"{first}-{last}"
    return ", ".join(map(str, seeds))
