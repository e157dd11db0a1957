"""The wall-clock axis of the benchmark table: how long a group takes, from its launch, to
reach the published result, and how far it gets in a fixed budget of wall time.

The curve: at each moment since launch, every seed's mean return over its last 10 episodes
ended by then (fewer early on), and the interquartile mean (IQM) over the seeds; none until
every seed has ended an episode (as the group's own aggregate curve). It changes only when a
seed ends an episode, so it is computed exactly on the common grid of those moments.

- Time to threshold: the first moment the IQM curve is at or above the threshold (the first
  reference's mean, the one the group is judged against); "not reached" when it never is.
  Its 95% interval is a percentile bootstrap over seeds: each of 2,000 draws picks as many
  seeds with replacement (whole curves), builds their IQM curve on the same grid and takes
  its first time at the threshold (infinite when never); the interval is the 2.5% and 97.5%
  quantiles of those times, each an actual draw's time (so "not reached" draws count as
  later than any time, and an upper end "not reached" means more than 2.5% of draws never
  got there).
- IQM at the budget (15 minutes): the seeds' last-10 means at 15 minutes since launch, or at
  the group's end where it ended sooner (its result is ready by then), with the 95%
  bootstrap interval of ``bootstrap_interval``.

Times come from ``results.GroupResult.seconds``: recorded since launch, or estimated from an
even pace for groups logged before the launch was recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from results import LAST_EPISODES, GroupResult

from rl_graphstep.run.aggregate import BOOTSTRAP_SEED, bootstrap_interval, iqm

BUDGET_S = 15 * 60.0
RESAMPLES = 2000


def trailing_means(returns: np.ndarray, last: int = LAST_EPISODES) -> np.ndarray:
    """At each episode, the mean return of the last ``last`` episodes up to it (fewer at the
    start)."""
    sums = np.concatenate([[0.0], np.cumsum(returns, dtype=np.float64)])
    ends = np.arange(1, returns.size + 1)
    starts = np.maximum(ends - last, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


@dataclass(frozen=True)
class TimeCurves:
    """Every seed's last-10 mean at each moment of ``grid`` (seconds since launch, sorted):
    ``rows`` (seeds, moments), NaN before the seed's first episode; ``steps``, the env step
    of the episode that ended at each moment."""

    grid: np.ndarray
    steps: np.ndarray
    rows: np.ndarray


def time_curves(group: GroupResult) -> TimeCurves:
    """The group's seeds on the common grid of the moments any seed ended an episode."""
    times = [group.seconds(curve) for curve in group.curves]
    grid, first = np.unique(np.concatenate(times), return_index=True)
    steps = np.concatenate([curve.steps for curve in group.curves])[first]
    rows = []
    for curve, seconds in zip(group.curves, times, strict=True):
        ended = np.searchsorted(seconds, grid, side="right") - 1  # its last episode by then
        means = trailing_means(curve.returns)
        rows.append(np.where(ended >= 0, means[np.maximum(ended, 0)], np.nan))
    return TimeCurves(grid, steps, np.array(rows))


def iqm_curve(rows: np.ndarray) -> np.ndarray:
    """The IQM over seeds (axis -2) at each moment; NaN where a seed has no episode yet."""
    curve = np.asarray(iqm(rows, axis=-2), dtype=np.float64)
    # iqm's sort puts NaN last, where the trim may cut it: a missing seed is NaN here.
    return np.where(np.isnan(rows).any(axis=-2), np.nan, curve)


def first_reach(curve: np.ndarray, grid: np.ndarray, threshold: float) -> float:
    """The first moment of ``grid`` at which ``curve`` is at or above ``threshold``; inf when
    it never is."""
    hits = curve >= threshold  # NaN (a seed without an episode) is never a hit
    return float(grid[hits.argmax()]) if hits.any() else float("inf")


def _draws(seeds: int, resamples: int = RESAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap's draws of ``seeds`` seeds with replacement (the fixed stream of
    ``BOOTSTRAP_SEED``), as (distinct draws, index of each draw among them): a statistic of
    a multiset of seeds need be computed once (five seeds make at most 126)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = np.sort(rng.integers(0, seeds, size=(resamples, seeds)), axis=1)
    return np.unique(draws, axis=0, return_inverse=True)


def time_to_threshold(curves: TimeCurves, threshold: float, confidence: float = 0.95
                      ) -> tuple[float, float, float]:
    """(first time, low, high): the first moment the seeds' IQM reaches ``threshold`` and
    its percentile-bootstrap interval over seeds (see the module's text); inf for "not
    reached"."""
    point = first_reach(iqm_curve(curves.rows), curves.grid, threshold)
    distinct, which = _draws(curves.rows.shape[0])
    firsts = np.array([first_reach(iqm_curve(curves.rows[draw]), curves.grid, threshold)
                       for draw in distinct])[which]
    tail = (1 - confidence) / 2
    # Quantiles that are draws' own values: an interpolation with inf would give inf or NaN.
    low, high = np.quantile(firsts, [tail, 1 - tail], method="inverted_cdf")
    return point, float(low), float(high)


def iqm_band(curves: TimeCurves, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile-bootstrap band of the IQM curve at each moment (whole seeds'
    curves resampled, as ``time_to_threshold`` does)."""
    distinct, which = _draws(curves.rows.shape[0])
    values = np.array([iqm_curve(curves.rows[draw]) for draw in distinct])[which]
    tail = (1 - confidence) / 2
    low, high = np.quantile(values, [tail, 1 - tail], axis=0)
    return low, high


def at_budget(group: GroupResult, budget_s: float = BUDGET_S
              ) -> tuple[float, float, float, float]:
    """(moment, IQM, low, high): the seeds' last-10 means at ``budget_s`` since launch, or at
    the group's end (its wall time) where it ended sooner; NaN where a seed had ended no
    episode by then."""
    moment = min(budget_s, group.wall_s)
    values = []
    for curve in group.curves:
        ended = int(np.searchsorted(group.seconds(curve), moment, side="right")) - 1
        if ended < 0:
            return moment, float("nan"), float("nan"), float("nan")
        values.append(trailing_means(curve.returns)[ended])
    low, high = bootstrap_interval(np.array(values), iqm)
    return moment, float(iqm(np.array(values))), low, high


def step_at(curves: TimeCurves, moment: float) -> int:
    """The env step of the episode that ended at ``moment`` of the grid."""
    return int(curves.steps[np.searchsorted(curves.grid, moment)])


def minutes(seconds: float) -> str:
    """``5.1 min`` (``15 min`` for whole minutes); ``45 s`` under a minute; ``not reached``
    for inf."""
    if not np.isfinite(seconds):
        return "not reached"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds % 60 == 0 else f"{seconds / 60:.1f} min"


@dataclass(frozen=True)
class Threshold:
    """The return a group is timed to: the mean of its first reference, and that
    reference's label."""

    value: float
    label: str


@dataclass(frozen=True)
class WallClockRow:
    """One group's row of the wall-clock table."""

    group: GroupResult
    threshold: Threshold | None
    reached: tuple[float, float, float] | None  # time to threshold and its interval
    reached_step: int | None  # the env step the IQM reached it at
    budget: tuple[float, float, float, float]  # see at_budget


def wallclock_rows(groups: Sequence[GroupResult], thresholds: dict[tuple[str, str], Threshold],
                   budget_s: float = BUDGET_S) -> list[WallClockRow]:
    """The table's rows, by env_id and group name (``sac`` before ``sac-32envs``); a group
    without a reference has no time to one."""
    rows = []
    for group in sorted(groups, key=lambda g: g.key):
        threshold = thresholds.get(group.key)
        reached = step = None
        if threshold is not None:
            curves = time_curves(group)
            reached = time_to_threshold(curves, threshold.value)
            step = step_at(curves, reached[0]) if np.isfinite(reached[0]) else None
        rows.append(WallClockRow(group, threshold, reached, step, at_budget(group, budget_s)))
    return rows


def _number(value: float) -> str:
    return f"{value:,.0f}"


def _reached(row: WallClockRow) -> str:
    if row.reached is None:
        return "-"
    point, low, high = row.reached
    mark = "≈ " if row.group.estimated else ""
    if not np.isfinite(point):
        final = iqm(row.group.finals())
        interval = f" [{minutes(low)}, {minutes(high)}]" if np.isfinite(low) else ""
        return f"not reached{interval} (final IQM {_number(final)})"
    return f"{mark}{minutes(point)} [{minutes(low)}, {minutes(high)}]"


def _at_budget(row: WallClockRow, budget_s: float) -> str:
    moment, value, low, high = row.budget
    if not np.isfinite(value):
        return "no episode of every seed yet"
    ended = f" (ended at {minutes(moment)})" if moment < budget_s else ""
    mark = "≈ " if row.group.estimated and not ended else ""  # which episodes were by then
    return f"{mark}{_number(value)} [{_number(low)}, {_number(high)}]{ended}"


def _samples(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.2f} M"


def wallclock_table(rows: Sequence[WallClockRow], budget_s: float = BUDGET_S) -> str:
    """The Markdown table, one row per group (labelled ``SAC`` or ``SAC, 32 envs``), and
    what its columns mean."""
    budget = minutes(budget_s)
    lines = [
        "| Task | Algorithm | Seeds | Threshold (reference) | Time to threshold [95% CI] | "
        f"Env steps then | IQM at {budget} [95% CI] | Wall time | Env steps/s | "
        "Gradient samples/s | Times |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        group = row.group
        threshold = (f"{_number(row.threshold.value)}, {row.threshold.label}"
                     if row.threshold else "none found")
        step = "-" if row.reached_step is None else f"{row.reached_step:,}"
        times = "even pace (estimated)" if group.estimated else "since launch"
        lines.append(
            f"| {group.env_id} | {group.label} | {len(group.curves)} | {threshold} | "
            f"{_reached(row)} | {step} | {_at_budget(row, budget_s)} | "
            f"{minutes(group.wall_s)} | {_number(group.env_steps_per_s)} | "
            f"{_samples(group.gradient_samples_per_s)} | {times} |")
    return "\n".join(lines) + "\n"


NOTES = """
Times are wall-clock since the group's launch (one process trains all its seeds; start-up and
compiling included). The curve is the interquartile mean (IQM) over the seeds of each seed's
mean return over its last {last} episodes (fewer early on), once every seed has ended one.
*Time to threshold*: the first time that IQM is at or above the threshold, the mean of the
first published reference of the step table (`table.md`); its 95% interval: 2,000 bootstrap
draws of as many seeds with replacement (whole curves), each draw's first time at the
threshold, their 2.5% and 97.5% quantiles ("not reached" where more than 2.5% of draws never
get there). *Env steps then*: the group's env step (per seed) when the IQM got there.
*IQM at {budget}*: the seeds' last-{last} means at {budget} since launch, or at the group's end
where it ended sooner (its result is ready then), with its 95% bootstrap interval over seeds.
*Env steps/s*: all seeds' env steps over the wall time. *Gradient samples/s*: the rows
sampled for critic updates by all seeds, batch size x updates per step x (steps - learning
starts) / envs per seed x seeds (PPO: the rows of each full rollout, envs x steps per rollout,
x epochs x rollouts x seeds), over the wall time, from each run's config as `groups.csv`
keeps it.
"""

ESTIMATED = """
≈ *Estimated from an even pace*: these groups were logged before runs recorded their launch.
Each episode's time is its step's share of the wall time the group's event files span (step /
steps x wall time): that leaves out the start-up before the first event (importing torch,
making the envs and networks) and spreads the faster random-action steps and the update's
compiling (10-50 s, at learning starts) evenly over the run: a time read off it may be off by
tens of seconds, most early in the run.
"""


def wallclock_markdown(rows: Sequence[WallClockRow], budget_s: float = BUDGET_S) -> str:
    """``wallclock.md``: the table and what it means."""
    text = wallclock_table(rows, budget_s) + NOTES.format(last=LAST_EPISODES,
                                                          budget=minutes(budget_s))
    if any(row.group.estimated for row in rows):
        text += ESTIMATED
    return text


def wallclock_summary(rows: Sequence[WallClockRow], budget_s: float = BUDGET_S) -> str:
    """The README's short form: per group, the threshold, the time to it and the IQM at the
    budget; ≈ marks times estimated from an even pace."""
    lines = [f"| Task | Algorithm | Threshold | Time to threshold [95% CI] | "
             f"IQM at {minutes(budget_s)} |", "|---|---|---:|---:|---:|"]
    for row in rows:
        threshold = "-" if row.threshold is None else _number(row.threshold.value)
        lines.append(f"| {row.group.env_id} | {row.group.label} | {threshold} | "
                     f"{_reached(row)} | {_at_budget(row, budget_s)} |")
    if any(row.group.estimated for row in rows):
        lines += ["", "≈: estimated from an even pace over the group's recorded wall time "
                      "(see wallclock.md)."]
    return "\n".join(lines) + "\n"


def plot_wallclock(path: object, task: str, groups: Sequence[GroupResult],
                   thresholds: dict[tuple[str, str], Threshold],
                   budget_s: float = BUDGET_S) -> None:
    """One task's figure against wall time: each group's IQM over its seeds with its 95%
    band (in name order, labelled ``SAC`` or ``SAC, 32 envs``), its threshold dashed, the
    budget dotted."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    estimated = False
    for i, group in enumerate(sorted(groups, key=lambda g: g.key)):
        color = colors[i % len(colors)]
        curves = time_curves(group)
        estimated |= group.estimated
        low, high = iqm_band(curves)
        grid = curves.grid / 60
        ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0, step="post")
        ax.step(grid, iqm_curve(curves.rows), where="post", color=color, linewidth=2,
                label=f"{group.label} IQM of {len(group.curves)} seeds (95% CI)")
        threshold = thresholds.get(group.key)
        if threshold is not None:
            ax.axhline(threshold.value, color=color, linestyle="--", linewidth=1.1,
                       label=f"{group.label} {threshold.label}")
    if ax.get_xlim()[1] >= budget_s / 60:
        ax.axvline(budget_s / 60, color="black", linestyle=":", linewidth=1,
                   label=f"{minutes(budget_s)} budget")
    ax.set_xlabel("minutes since launch" + (" (estimated from an even pace)" if estimated
                                            else ""))
    ax.set_ylabel(f"episodic return (mean of {LAST_EPISODES} episodes)")
    ax.set_title(f"{task}: return against wall-clock")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
