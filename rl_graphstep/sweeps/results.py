"""A sweep's results: which trials ended, the table of trials best first (printed, and written
as CSV and Markdown), the best trial's config, and the line that counts failed trials."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rl_graphstep.core.errors import display_path
from rl_graphstep.run.cli import suggested_command
from rl_graphstep.run.console import say
from rl_graphstep.settings.config import config_to_dict
from rl_graphstep.settings.sweepfile import SweepSpec, trial_config
from rl_graphstep.sweeps.trials import NOT_LEARNED, SCORE, error_line

__all__ = ["failed_line", "trial_finished", "write_results"]


def trial_finished(result: Any, scheduler: str) -> bool:
    """Whether a trial ended: trained to its end, failed, or (ASHA) was stopped early. Tune
    marks the trials of a sweep stopped by Ctrl-C terminated too, so its status cannot say."""
    metrics = result.metrics or {}
    if result.error is not None or metrics.get("finished"):
        return True
    return scheduler == "asha" and bool(metrics)  # a trial ASHA stopped had reported


def write_results(spec: SweepSpec, results: Any, sweep_dir: Path) -> list[dict[str, Any]]:
    """The trials best first, printed and written as CSV and Markdown; the best one's config
    as YAML. Returns the rows."""
    rows = []
    for result in results:
        metrics, config = result.metrics or {}, result.config or {}
        params = {name: config.get(name) for name in (*spec.grid, *spec.sampled)}
        rows.append({"trial": metrics.get("trial_id", Path(result.path).name), **params,
                     SCORE: metrics.get(SCORE, float("nan")),
                     "iqm_return": metrics.get("iqm_return", float("nan")),
                     "mean_return": metrics.get("mean_return", float("nan")),
                     "global_step": metrics.get("global_step", 0),
                     "node": str(metrics.get("node_id", ""))[:12],
                     "error": _trial_error(result)})
    sign = -1.0 if spec.mode == "max" else 1.0
    # Trials that failed or did not learn rank last whatever their score: their runs' last
    # returns are not a result of the settings.
    rows.sort(key=lambda r: (bool(r["error"]), r[SCORE] != r[SCORE],
                             sign * (r[SCORE] if r[SCORE] == r[SCORE] else 0.0)))
    columns = list(rows[0]) if rows else ["trial"]
    with (sweep_dir / "results.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    (sweep_dir / "results.md").write_text("\n".join(lines) + "\n")
    say("\n".join(lines))
    if rows and rows[0][SCORE] == rows[0][SCORE] and not rows[0]["error"]:
        best = rows[0]
        cfg = trial_config(spec, {n: best[n] for n in (*spec.grid, *spec.sampled)},
                           log_dir="runs", run_name=f"{spec.name}_best")
        values = {k: v for k, v in config_to_dict(cfg).items()
                  if k not in ("log_dir", "run_name", "resume")}
        command = suggested_command("train", "--config",
                                    str(sweep_dir / "best_config.yaml"))
        (sweep_dir / "best_config.yaml").write_text(
            f"# the best trial of sweep {spec.name} ({best['trial']}, {SCORE} "
            f"{best[SCORE]:.1f}); train it with: {command}\n"
            + yaml.safe_dump(values, sort_keys=False))
    return rows


def _trial_error(result: Any) -> str:
    """The error column of a trial: its own exception in one line, or ``not learned: ...``
    with why its run did not learn (what ``train`` exits 3 for); "" for a trial that learned."""
    if result.error is not None:
        return error_line(result.error)
    why = (result.metrics or {}).get(NOT_LEARNED)
    return f"not learned: {why}" if why else ""


def failed_line(rows: Sequence[dict[str, Any]], results_csv: Path) -> str | None:
    """The sweep's last line when some trials failed or did not learn, None when none did:
    ``2 of 4 trials failed and 1 did not learn; see the error column of runs/g/results.csv``."""
    unlearned = sum(r["error"].startswith("not learned: ") for r in rows)
    failed = sum(bool(r["error"]) for r in rows) - unlearned
    if not (failed or unlearned):
        return None
    what = [f"{failed} failed"] if failed else []
    what += [f"{unlearned} did not learn"] if unlearned else []
    first, *rest = what
    count, _, verb = first.partition(" ")
    return (f"{count} of {len(rows)} trials {verb}{''.join(' and ' + r for r in rest)}; see "
            f"the error column of {display_path(str(results_csv))}")


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
