"""Learning curve from tensorboard run folders: raw episode returns and a moving average, as PNG.

Reads one scalar tag (``charts/episodic_return`` by default, x = global env step) from each
run folder, or a ``step,value`` CSV file that ``--csv-dir`` wrote earlier, plots the raw
points faintly and a trailing mean over ``--smooth`` episodes boldly, one colour per run,
with an optional dashed reference line. Prints one summary line per run.
A resumed run's several event files in one folder are read together, its restart hiding what
the interrupted process logged past the resume step; every value is kept, several at one step
too (a run of many envs ends several episodes at one step). Needs matplotlib (not a project
dependency).

    python benchmarks/plot_curve.py RUN_DIR|CSV [RUN_DIR|CSV ...] --out benchmarks/curve.png \\
        [--tag charts/episodic_return] [--title TEXT] [--smooth 10] [--csv-dir DIR] \\
        [--reference 9635 --reference-label "CleanRL SAC, 1M steps"]
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from cli import BenchmarkError, cli_main, positive_int
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator, ScalarEvent

DEFAULT_TAG = "charts/episodic_return"
SUMMARY_LAST = 10


class CurveError(BenchmarkError):
    """A run folder or tag that cannot be plotted; the message is shown as a one-line error."""


def read_scalars(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    """Return (steps, values) of `tag` in `run_dir`, sorted by step: all the folder's event
    files read together, every value kept (see ``logged``)."""
    if not run_dir.exists():
        raise CurveError(f"{run_dir}: no such folder")
    if not run_dir.is_dir():
        raise CurveError(f"{run_dir}: not a folder (give the run folder, not an event file)")
    if not any(p.is_file() and "tfevents" in p.name for p in run_dir.iterdir()):
        raise CurveError(f"{run_dir}: no tensorboard event files in this folder")
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = sorted(events.Tags().get("scalars", []))
    if tag not in tags:
        present = ", ".join(tags) if tags else "none"
        raise CurveError(f"{run_dir}: no scalar tag {tag!r}; scalar tags present: {present}")
    return read_points(events, tag)


def logged(events: EventAccumulator, tag: str) -> list[ScalarEvent]:
    """Every value of ``tag`` in loaded ``events``, sorted by step and, within a step, in the
    order written: several envs end episodes at one step, and each is an episode. A resumed
    run's restart (the ``purge_step`` its logger writes) has already hidden what the
    interrupted process logged at and past the resume step, so nothing is counted twice."""
    return sorted(events.Scalars(tag), key=lambda event: event.step)  # stable


def read_points(events: EventAccumulator, tag: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``tag`` in loaded ``events`` (see ``logged``)."""
    points = logged(events, tag)
    return [event.step for event in points], [event.value for event in points]


def read_csv(path: Path) -> tuple[list[int], list[float]]:
    """Return (steps, values) from a ``step,value`` CSV file with a header row."""
    try:
        with path.open(newline="") as file:
            rows = list(csv.reader(file))[1:]
        # By step only: the episodes of one step keep their written order.
        points = sorted(((int(float(step)), float(value)) for step, value in rows),
                        key=lambda point: point[0])
    except OSError as err:
        raise CurveError(f"{path}: {err.strerror}") from err
    except ValueError as err:
        raise CurveError(f"{path}: not a step,value CSV with a header row ({err})") from err
    if not points:
        raise CurveError(f"{path}: no rows below the header")
    return [step for step, _ in points], [value for _, value in points]


def write_csv(path: Path, tag: str, steps: Sequence[int], values: Sequence[float]) -> None:
    """Write one curve as a ``step,value`` CSV file (header ``step,<tag's last part>``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["step", tag.rsplit("/", 1)[-1]])
        writer.writerows((step, f"{value:.2f}") for step, value in zip(steps, values, strict=True))


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and up to `window - 1` values before it (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    out: list[float] = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def format_steps(x: float, _pos: object = None) -> str:
    """Tick label for an env-step count: 0, 500, 250k, 1M, 1.5M."""
    magnitude = abs(x)
    if magnitude >= 1_000_000:
        text, suffix = f"{x / 1_000_000:.2f}", "M"
    elif magnitude >= 1_000:
        text, suffix = f"{x / 1_000:.1f}", "k"
    else:
        return f"{x:.0f}"
    return text.rstrip("0").rstrip(".") + suffix


def summary_line(name: str, steps: Sequence[int], values: Sequence[float]) -> str:
    """`NAME: N episodes, last step S, mean of last 10 returns M` for one run."""
    last = values[-SUMMARY_LAST:]
    return (f"{name}: {len(values)} episodes, last step {steps[-1]}, "
            f"mean of last {len(last)} returns {sum(last) / len(last):.2f}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR|CSV",
                        help="tensorboard run folder(s) or step,value CSV files; one curve each")
    parser.add_argument("--out", type=Path, required=True, help="PNG file to write")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"scalar tag (default {DEFAULT_TAG})")
    parser.add_argument("--title", default=None, help="plot title (default: the run name(s))")
    parser.add_argument("--smooth", type=positive_int, default=10,
                        help="episodes in the trailing moving average (default 10)")
    parser.add_argument("--reference", type=float, default=None,
                        help="y value of a dashed horizontal reference line")
    parser.add_argument("--reference-label", default="reference",
                        help="legend label of the reference line")
    parser.add_argument("--csv-dir", type=Path, default=None,
                        help="also write each run folder's curve to DIR/RUN_NAME.csv")
    return parser.parse_args(argv)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    """Read the runs, print their summaries, write the PNG; return the exit code."""
    args = parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        print("plot_curve.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    # The accumulator warns when it drops a crashed run's events past a resume point; that is
    # the expected way resumed runs are read, so keep it quiet.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    curves: list[tuple[str, list[int], list[float]]] = []
    for path in args.runs:
        if path.suffix == ".csv":
            curves.append((path.stem, *read_csv(path)))
            continue
        steps, values = read_scalars(path, args.tag)
        curves.append((path.resolve().name, steps, values))
        if args.csv_dir is not None:
            write_csv(args.csv_dir / f"{path.resolve().name}.csv", args.tag, steps, values)
    for name, steps, values in curves:
        print(summary_line(name, steps, values))

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, steps, values) in enumerate(curves):
        color = colors[i % len(colors)]
        ax.scatter(steps, values, s=6, color=color, alpha=0.25, linewidths=0)
        ax.plot(steps, trailing_mean(values, args.smooth), color=color, linewidth=2.2,
                label=f"{name} (mean of {args.smooth} episodes)")
    if args.reference is not None:
        ax.axhline(args.reference, color="black", linestyle="--", linewidth=1.2,
                   label=args.reference_label)
    ax.xaxis.set_major_formatter(FuncFormatter(format_steps))
    ax.set_xlabel("environment steps")
    ax.set_ylabel(args.tag)
    ax.set_title(args.title if args.title is not None else ", ".join(n for n, _, _ in curves))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    plt.close(fig)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
