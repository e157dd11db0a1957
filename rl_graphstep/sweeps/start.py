"""What a sweep started with, kept in its folder so that ``--resume`` continues that sweep: the
sweep file as it was read (``<sweep>/sweep.yaml``) and the flags Tune keeps for the whole sweep
(``<sweep>/.tune/flags.yaml``). Tune restores its own state on a resume whatever the file or
the flags say now, so an edited file would mix two sweeps; it is refused, naming what changed.
Also the range checks of the flags, and whether a local Ray can place a trial at all."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rl_graphstep.core.errors import ConfigError, display_path
from rl_graphstep.run.folders import SWEEP_STATE_DIR
from rl_graphstep.settings.sweepfile import SweepSpec, effective_base, sweep_record

__all__ = ["FLAGS_FILE", "RECORD", "SweepFlags", "check_same_sweep", "flag_problem",
           "placement_problem", "record_start", "resumed_flags", "sweep_differences"]

RECORD = "sweep.yaml"
"""The sweep file as the sweep started, in the sweep's folder (a sweep file itself)."""
FLAGS_FILE = "flags.yaml"
"""The sweep's flags, in its ``.tune`` folder beside Tune's state."""
FINEST_SHARE = 0.0001  # Ray schedules resources in steps of 1/10,000


@dataclasses.dataclass(frozen=True)
class SweepFlags:
    """The flags of a sweep that hold from its start to its end: on a resume Tune keeps the
    scheduler, search, retries and trial resources it started with."""

    scheduler: str = "fifo"
    search: str = "variants"
    max_failures: int = 2
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0

    @classmethod
    def given(cls, values: Mapping[str, Any]) -> SweepFlags:
        """The flags of a new sweep: ``values`` (None: not given) over the defaults."""
        return cls(**{name: value for name, value in values.items() if value is not None})


NAMES = tuple(f.name for f in dataclasses.fields(SweepFlags))


def _flag(name: str, value: Any) -> str:
    return f"--{name.replace('_', '-')} {value:g}" if isinstance(value, float) else (
        f"--{name.replace('_', '-')} {value}")


def flag_problem(name: str, value: Any) -> str | None:
    """Why ``value`` of the numeric flag ``name`` (a field of :class:`SweepFlags`) cannot
    run a sweep, or None: a negative retry count would retry forever, a share of no CPU (or
    of NaN, or an infinite one) could never be placed."""
    flag = f"--{name.replace('_', '-')}"
    if name == "max_failures":
        return None if value >= 0 else (
            f"{flag} must be 0 or more (retries of a failed trial), got {value}")
    if name not in ("cpus_per_trial", "gpus_per_trial"):
        return None
    cpus = name == "cpus_per_trial"  # a trial needs some CPU; it may have no GPU
    if not math.isfinite(value) or value < 0 or (cpus and value == 0):
        return (f"{flag} must be a number {'> 0' if cpus else '>= 0'} (a share such as 0.5, "
                f"or whole ones), got {value:g}")
    if 0 < value < FINEST_SHARE:
        return (f"{flag} must be at least {FINEST_SHARE} (Ray's finest share)"
                f"{'' if cpus else ' or 0'}, got {value:g}")
    return None


def placement_problem(flags: SweepFlags, resources: Mapping[str, float]) -> str | None:
    """Why a local Ray with ``resources`` (``ray.cluster_resources()``) could never start a
    trial of ``flags``, or None: Tune would wait for the resources forever."""
    for name, key, what in (("cpus_per_trial", "CPU", "CPUs"), ("gpus_per_trial", "GPU", "GPUs")):
        wanted, held = getattr(flags, name), float(resources.get(key, 0.0))
        if wanted > held:
            return (f"--{name.replace('_', '-')} {wanted:g} is more than the {held:g} {what} of "
                    f"the local Ray this sweep started, so no trial could ever start; give at "
                    f"most {held:g}, or --address a Ray cluster that has them")
    return None


def record_start(sweep_dir: Path, spec: SweepSpec, flags: SweepFlags) -> None:
    """Keep what the new sweep in ``sweep_dir`` starts with (see the module docstring)."""
    header = (f"# The sweep {spec.name} as it started (from {spec.source}, its base config "
              "expanded): --resume\n# continues it only with a sweep file that reads the same.\n")
    (sweep_dir / RECORD).write_text(header + yaml.safe_dump(sweep_record(spec), sort_keys=False))
    (sweep_dir / SWEEP_STATE_DIR / FLAGS_FILE).write_text(
        yaml.safe_dump(dataclasses.asdict(flags), sort_keys=False))


def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return None  # a sweep started before its folder kept it
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {display_path(str(path))}, which keeps how the sweep "
                          f"started ({type(error).__name__}); start a new sweep under another "
                          "name or --log-dir") from None


def check_same_sweep(sweep_dir: Path, spec: SweepSpec) -> None:
    """Refuse to resume the sweep in ``sweep_dir`` with ``spec`` when it differs from the
    sweep file the sweep started with, in one line naming what differs."""
    kept = _load(sweep_dir / RECORD)
    if not isinstance(kept, dict):
        return
    # Through YAML as the kept one went, so tuples and lists, 1e-3 and 0.001 compare equal.
    now = yaml.safe_load(yaml.safe_dump(sweep_record(spec)))
    changes = sweep_differences(kept, now)
    if changes:
        raise ConfigError(
            f"the sweep file {spec.source} differs from the one this sweep started with "
            f"({'; '.join(changes)}); resume with the original file (a copy is "
            f"{display_path(str(sweep_dir / RECORD))}) or start a new sweep under another "
            "name or --log-dir")


def sweep_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two :func:`sweep_record` mappings: ``total_timesteps 3000 ->
    5000`` for a base setting (its default where a file leaves it out), ``search.q_lr
    removed``, ``num_samples 2 -> 3``."""
    changes = _differences(effective_base(old.get("base") or {}),
                           effective_base(new.get("base") or {}), "")
    changes += _differences(old.get("search") or {}, new.get("search") or {}, "search.")
    top = ("num_samples", "seeds", "metric", "mode")
    changes += _differences({k: old.get(k) for k in top}, {k: new.get(k) for k in top}, "")
    return changes


def _differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str) -> list[str]:
    changes = []
    for key in [*old, *(k for k in new if k not in old)]:
        if key not in new:
            changes.append(f"{prefix}{key} removed")
        elif key not in old:
            changes.append(f"{prefix}{key} added")
        elif old[key] != new[key]:
            before, after = _shown(old[key]), _shown(new[key])
            both = f"{before} -> {after}"
            changes.append(f"{prefix}{key} " + (both if len(both) <= 60 else "changed"))
    return changes


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value)


def resumed_flags(sweep_dir: Path, given: Mapping[str, Any]) -> SweepFlags:
    """The flags of the sweep resumed in ``sweep_dir``: those it started with. ``given``
    (None: not given) may repeat them; one that differs is refused, as Tune would not take it."""
    kept = _load(sweep_dir / SWEEP_STATE_DIR / FLAGS_FILE)
    flags = SweepFlags(**{k: v for k, v in kept.items() if k in NAMES}) if isinstance(
        kept, dict) else SweepFlags()
    differ = [(name, value) for name, value in given.items()
              if value is not None and value != getattr(flags, name)]
    if differ:
        now = " ".join(_flag(name, value) for name, value in differ)
        then = " ".join(_flag(name, getattr(flags, name)) for name, _ in differ)
        drop = " and ".join(f"--{name.replace('_', '-')}" for name, _ in differ)
        raise ConfigError(f"{now} differs from the sweep's {then}: a resumed sweep keeps the "
                          f"flags it started with; drop {drop} (or start a new sweep under "
                          "another name or --log-dir)")
    return flags
