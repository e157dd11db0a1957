"""The benchmark table: each algorithm (in each of its regimes) on each task over its seeds,
beside the published numbers, with one learning-curve figure per task and one across tasks.

    python benchmarks/table.py collect RUN_DIR [RUN_DIR ...] \\
        [--results benchmarks/mujoco_results] [--evaluate [--device auto]]
    python benchmarks/table.py report [--results benchmarks/mujoco_results] \\
        [--references benchmarks/references.csv]

A group is an algorithm in one regime on one task (``results.py``): the default regime is
named by the algorithm (``SAC``); an off-policy group of more than one env per seed is a
variant named by its envs (``SAC, 32 envs``, from ``configs/sac_mujoco_parallel.yaml``), kept
and shown beside the default group of the same algorithm and task, and judged against the
same references. ``collect`` reads seed-group folders (``--num-seeds K``) or single-seed run
folders (pooled by algorithm, regime and task) into CSV files in ``--results``; ``report``
builds, from those files alone, ``table.md`` (also printed), ``summary.md`` (the README's
short form: each group's IQM beside the published mean, a column per algorithm and regime),
``<task>.png`` and ``aggregate.png`` there; and the wall-clock axis (``wallclock.py``):
``wallclock.md`` (also printed; time from launch to the first reference's mean, the IQM at
15 minutes, env steps/s and gradient samples/s), ``wallclock_summary.md`` (its short form)
and ``<task>_wallclock.png``. ``collect --evaluate`` also evaluates each run's latest
checkpoint (10 deterministic episodes per seed) into the table's evaluation column
(``evaluations.py``).

Per group: each seed's mean return over its last 10 episodes; their mean ± std (numpy's,
over the seeds) and interquartile mean with its 95% percentile-bootstrap interval; the wall
time and env steps/s of all seeds together, and the machine that ran it (its runs' record,
"not recorded" for runs older than the record). Beside it the references of the same algorithm
on the same task (``references.csv``; a variant's are its algorithm's); the first listed is
the one the group is judged against: within range when the seeds' mean is at least the
reference's mean minus its std (the mean of their evaluations, for a group collected with
``--evaluate``). The figure across tasks normalises each return by that reference's mean
(1 = the published number) and shows, per algorithm and regime, the IQM over all its runs
with a 95% stratified-bootstrap interval, and the performance profile (the fraction of runs
above each normalised score), as rliable's reports do; computed with numpy (rliable itself
brings statsmodels, arch, scipy and seaborn). Figures need matplotlib
(``pip install -e ".[plot]"``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cli import cli_main
from evaluations import (
    EPISODES,
    GroupEvaluations,
    collect_evaluations,
    judged_returns,
    load_evaluations,
    plot_evaluation,
    table_notes,
)
from results import LAST_EPISODES, GroupResult, ResultsError, load_results
from runfolders import collect
from wallclock import (
    Threshold,
    plot_wallclock,
    trailing_means,
    wallclock_markdown,
    wallclock_rows,
    wallclock_summary,
)

from rl_graphstep.run.aggregate import (
    BOOTSTRAP_SEED,
    bootstrap_interval,
    iqm,
    percentile_interval,
    performance_profile,
    stratified_resamples,
)

HERE = Path(__file__).resolve().parent
# Not "mujoco": with benchmarks/ on sys.path, that folder would pass for the MuJoCo package.
DEFAULT_RESULTS = HERE / "mujoco_results"
DEFAULT_REFERENCES = HERE / "references.csv"
REFERENCE_FIELDS = ["algo", "task", "source", "env_id", "steps", "mean", "std", "seeds", "what",
                    "where"]
SOURCE_NAMES = {"cleanrl": "CleanRL", "td3_paper": "TD3 paper", "sb3_zoo": "SB3 zoo"}
CURVE_POINTS = 200


@dataclass(frozen=True)
class Reference:
    """A published result of one algorithm on one task."""

    source: str
    env_id: str
    mean: float
    std: float | None  # None where the source prints none

    def label(self) -> str:
        return f"{SOURCE_NAMES.get(self.source, self.source)} ({self.env_id})"

    def numbers(self) -> str:
        return _number(self.mean) + ("" if self.std is None else f" ± {_number(self.std)}")

    def lowest_in_range(self) -> float:
        """The least return within the published range: the mean minus one std."""
        return self.mean - (self.std or 0.0)


def task_of(env_id: str) -> str:
    """``HalfCheetah-v5`` -> ``HalfCheetah``: references of other versions are the same task."""
    return env_id.rsplit("-v", 1)[0]


def read_references(path: Path) -> dict[tuple[str, str], list[Reference]]:
    """(algo, task) -> its references, in the file's order."""
    try:
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            if reader.fieldnames != REFERENCE_FIELDS:
                raise ResultsError(f"{path}: expected the columns {','.join(REFERENCE_FIELDS)}")
            references: dict[tuple[str, str], list[Reference]] = {}
            for row in reader:
                references.setdefault((row["algo"], row["task"]), []).append(
                    Reference(row["source"], row["env_id"], float(row["mean"]),
                              float(row["std"]) if row["std"] else None))
    except OSError as err:
        raise ResultsError(f"{path}: {err.strerror}") from err
    except ValueError as err:
        raise ResultsError(f"{path}: a mean or std is not a number ({err})") from err
    return references


def _number(value: float) -> str:
    return f"{value:,.0f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def table(groups: Sequence[GroupResult],
          references: dict[tuple[str, str], list[Reference]],
          evaluations: dict[tuple[str, str], GroupEvaluations] | None = None) -> str:
    """The Markdown table, one row per group (by env_id and name, labelled ``SAC`` or
    ``SAC, 32 envs``), task by task; with an Evaluation IQM column (and notes under the
    table) where some group has ``evaluations``."""
    column = "Evaluation IQM [95% CI] | " if evaluations else ""
    lines = [
        f"| Task | Algorithm | Seeds (mean of last {LAST_EPISODES} episodes) | Mean ± std | "
        f"IQM [95% CI] | {column}Published (mean ± std) | Within range | Wall time | "
        "Env steps/s | Machine |",
        "|---|---|---|---:|---:|" + ("---:|" if evaluations else "") + "---|:---:|---:|---:|---|",
    ]
    for group in sorted(groups, key=lambda g: g.key):
        finals = group.finals()
        low, high = bootstrap_interval(finals, iqm)
        found = references.get((group.algo, task_of(group.env_id)), [])
        published = "<br>".join(f"{r.label()}: {r.numbers()}" for r in found) or "none found"
        judged = judged_returns(group, evaluations)  # the evaluations' means where kept
        within = ("yes" if judged.mean() >= found[0].lowest_in_range() else "**no**"
                  ) if found else "-"
        cell = ""  # the evaluation column's, where the table has one
        if evaluations:
            evaluation = evaluations.get(group.key)
            cell = f"{evaluation.cell()} | " if evaluation else "- | "
            within += " (evaluation)" if evaluation and found else ""
        seeds = ", ".join(f"{seed}: {_number(value)}"
                          for seed, value in zip(group.seeds, finals, strict=True))
        lines.append(
            f"| {group.env_id} | {group.label} | {seeds} | {_number(finals.mean())} ± "
            f"{_number(finals.std())} | {_number(iqm(finals))} [{_number(low)}, "
            f"{_number(high)}] | {cell}{published} | {within} | "
            f"{_duration(group.wall_s)} | {_number(group.env_steps_per_s)} | "
            f"{group.machine or 'not recorded'} |")
    return "\n".join(lines) + "\n" + table_notes(groups, evaluations or {})


def summary(groups: Sequence[GroupResult],
            references: dict[tuple[str, str], list[Reference]],
            evaluations: dict[tuple[str, str], GroupEvaluations] | None = None) -> str:
    """The README's short form: a row per task, a column per group label in name order
    (``SAC`` and ``SAC, 32 envs`` side by side), each cell the seeds' IQM, the IQM of their
    evaluations where kept (``eval 10,480``) and, in brackets, the first published mean of
    the group's algorithm."""
    labels = {g.name: g.label for g in sorted(groups, key=lambda g: g.name)}
    cells = {g.key: g for g in groups}
    lines = ["| Task | " + " | ".join(labels.values()) + " |",
             "|---|" + "---:|" * len(labels)]
    for env_id in sorted({g.env_id for g in groups}):
        row = []
        for name in labels:
            group = cells.get((env_id, name))
            if group is None:
                row.append("")
                continue
            found = references.get((group.algo, task_of(env_id)))
            published = f" ({_number(found[0].mean)})" if found else ""
            evaluation = (evaluations or {}).get(group.key)
            evaluated = "" if evaluation is None else f"; eval {_number(iqm(evaluation.means()))}"
            row.append(f"{_number(iqm(group.finals()))}{evaluated}{published}")
        lines.append(f"| {env_id} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def smoothed_curves(group: GroupResult, points: int = CURVE_POINTS
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Every seed's trailing mean of its last 10 episodes, on a common grid of env steps
    (from the step where every seed has finished an episode): (grid, (seeds, points))."""
    start = max(int(curve.steps[0]) for curve in group.curves)
    end = min(int(curve.steps[-1]) for curve in group.curves)
    grid = np.linspace(start, end, points) if end > start else np.array([float(end)])
    rows = []
    for curve in group.curves:
        # Where several envs ended episodes at one step, the curve there is the mean after
        # them all (np.interp needs each step once).
        last = np.append(curve.steps[1:] != curve.steps[:-1], True)
        rows.append(np.interp(grid, curve.steps[last], trailing_means(curve.returns)[last]))
    return grid, np.array(rows)


def first_references(groups: Sequence[GroupResult],
                     references: dict[tuple[str, str], list[Reference]]
                     ) -> dict[tuple[str, str], Threshold]:
    """group key -> the mean of the first reference of its algorithm and task (the one it is
    judged against, whatever its regime), the threshold of its time to result."""
    thresholds = {}
    for group in groups:
        found = references.get((group.algo, task_of(group.env_id)))
        if found:
            thresholds[group.key] = Threshold(found[0].mean, found[0].label())
    return thresholds


def normalised_scores(groups: Sequence[GroupResult],
                      references: dict[tuple[str, str], list[Reference]]
                      ) -> dict[str, list[np.ndarray]]:
    """group label (``SAC``, ``SAC, 32 envs``) -> one array per task it ran: its seeds'
    returns over the mean of its algorithm's first reference on that task."""
    scores: dict[str, list[np.ndarray]] = {}
    for group in sorted(groups, key=lambda g: g.key):
        found = references.get((group.algo, task_of(group.env_id)))
        if found:
            scores.setdefault(group.label, []).append(group.finals() / found[0].mean)
    return scores


def plot_task(path: Path, task: str, groups: Sequence[GroupResult],
              references: dict[tuple[str, str], list[Reference]],
              evaluations: dict[tuple[str, str], GroupEvaluations] | None = None) -> None:
    """One task's figure: every seed thin, each group's IQM and its 95% band thick (in name
    order, labelled ``SAC`` or ``SAC, 32 envs``), the first reference of each group's
    algorithm dashed, and its evaluation IQM (where kept) a point."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    from plot_curve import format_steps

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, group in enumerate(sorted(groups, key=lambda g: g.key)):
        color = colors[i % len(colors)]
        grid, rows = smoothed_curves(group)
        for row in rows:
            ax.plot(grid, row, color=color, linewidth=0.7, alpha=0.35)
        bands = iqm_band(rows)
        ax.fill_between(grid, bands[0], bands[1], color=color, alpha=0.2, linewidth=0)
        ax.plot(grid, iqm(rows, axis=0), color=color, linewidth=2.4,
                label=f"{group.label} IQM of {len(rows)} seeds (95% CI)")
        if group.key in (evaluations or {}):
            plot_evaluation(ax, group.label, evaluations[group.key], color)
        found = references.get((group.algo, task_of(group.env_id)))
        if found:
            ax.axhline(found[0].mean, color=color, linestyle="--", linewidth=1.1,
                       label=f"{group.label} {found[0].label()}")
    ax.xaxis.set_major_formatter(FuncFormatter(format_steps))
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episodic return (mean of {LAST_EPISODES} episodes)")
    ax.set_title(task)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def iqm_band(rows: np.ndarray, resamples: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """The 95% bootstrap band of the IQM over seeds at each point of (seeds, points) rows:
    each draw resamples whole seeds' curves."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = rng.integers(0, rows.shape[0], size=(resamples, rows.shape[0]))
    return percentile_interval(iqm(rows[draws], axis=1))


def plot_aggregate(path: Path, scores: dict[str, list[np.ndarray]]) -> None:
    """Across tasks, per group label (an algorithm in one regime, as ``normalised_scores``
    keys them): the IQM of the normalised scores with its 95% stratified bootstrap interval,
    and the performance profile with its band."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = sorted(scores)
    pooled = np.concatenate([s for label in labels for s in scores[label]])
    thresholds = np.linspace(0.0, max(1.5, float(pooled.max()) * 1.05), 101)
    for i, label in enumerate(labels):
        color = colors[i % len(colors)]
        tasks = scores[label]
        point = iqm(np.concatenate(tasks))
        low, high = percentile_interval(stratified_resamples(tasks, iqm))
        left.errorbar([point], [i], xerr=[[point - low], [high - point]], fmt="o", color=color,
                      capsize=6, linewidth=2)
        profile = performance_profile(np.concatenate(tasks), thresholds)
        band = percentile_interval(stratified_resamples(
            tasks, lambda draws, axis: performance_profile(draws, thresholds, axis=axis)))
        right.fill_between(thresholds, band[0], band[1], color=color, alpha=0.2, linewidth=0)
        right.plot(thresholds, profile, color=color, linewidth=2,
                   label=f"{label} ({len(tasks)} task{'s' if len(tasks) > 1 else ''})")
    left.set_yticks(range(len(labels)), labels)
    left.axvline(1.0, color="black", linestyle="--", linewidth=1)
    left.set_xlabel("IQM of return / published mean (95% CI)")
    left.grid(True, axis="x", alpha=0.3)
    right.axvline(1.0, color="black", linestyle="--", linewidth=1)
    right.set_xlabel("return / published mean (τ)")
    right.set_ylabel("fraction of runs with score > τ")
    right.grid(True, alpha=0.3)
    right.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(results_dir: Path, references_path: Path) -> list[Path]:
    """The table and the figures from the kept results; returns the files written."""
    groups = load_results(results_dir)
    references = read_references(references_path)
    evaluations = load_evaluations(results_dir, groups)
    text = table(groups, references, evaluations)
    print(text, end="")
    (results_dir / "table.md").write_text(text)
    (results_dir / "summary.md").write_text(summary(groups, references, evaluations))
    thresholds = first_references(groups, references)
    rows = wallclock_rows(groups, thresholds)
    clock = wallclock_markdown(rows)
    print(clock, end="")
    (results_dir / "wallclock.md").write_text(clock)
    (results_dir / "wallclock_summary.md").write_text(wallclock_summary(rows))
    written = [results_dir / name for name in ("table.md", "summary.md", "wallclock.md",
                                               "wallclock_summary.md")]
    try:
        import matplotlib
    except ImportError:
        print("figures need matplotlib: pip install -e \".[plot]\"", file=sys.stderr)
        return written
    matplotlib.use("Agg")
    for task in sorted({task_of(g.env_id) for g in groups}):
        path = results_dir / f"{task}.png"
        plot_task(path, task, [g for g in groups if task_of(g.env_id) == task], references,
                  evaluations)
        path_clock = results_dir / f"{task}_wallclock.png"
        plot_wallclock(path_clock, task, [g for g in groups if task_of(g.env_id) == task],
                       thresholds)
        written += [path, path_clock]
    scores = normalised_scores(groups, references)
    if scores:
        plot_aggregate(results_dir / "aggregate.png", scores)
        written.append(results_dir / "aggregate.png")
    return written


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: one clear line and exit 2 on a run or file that cannot be read."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect", help="read run folders into the results' CSVs")
    gather.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    gather.add_argument("--evaluate", action="store_true",
                        help=f"also evaluate each run's latest checkpoint ({EPISODES} "
                             "deterministic episodes per seed) into the evaluation column")
    gather.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}",
                        help="where --evaluate runs the actors (default: auto)")
    build = commands.add_parser("report", help="the table and figures from the results' CSVs")
    build.add_argument("--references", type=Path, default=DEFAULT_REFERENCES,
                       help=f"published numbers (default {DEFAULT_REFERENCES.name})")
    for command in (gather, build):
        command.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                             help="folder of the kept results "
                             "(default benchmarks/mujoco_results)")
    args = parser.parse_args(argv)
    if args.command == "collect":
        collected = collect(args.runs, args.results)
        for group in collected:
            print(f"{group.label} on {group.env_id}: seeds {group.seeds}, "
                  f"{group.steps:,} steps each, {_duration(group.wall_s)}")
        if args.evaluate:
            labels = {group.key: group.label for group in collected}
            for key, kept in collect_evaluations(args.runs, args.results,
                                                 device=args.device).items():
                print(f"{labels.get(key, key[1])} on {key[0]}: evaluated, IQM {kept.cell()}")
    else:
        for path in report(args.results, args.references):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
