"""The sweep file: a base config, a search space and the seeds of every trial, read and
checked without Ray, so a bad file is one clear line before anything starts.

```yaml
name: sac_pendulum_lr            # the sweep's folder under the log dir (default: the file's stem)
base:                            # training settings, as in a --config file
  config: configs/sac_pendulum.yaml   # optional: a config file under the other base keys
  total_timesteps: 3000
search:
  q_lr: [0.001, 0.0003]          # a list: a grid, every value in turn
  tau: {uniform: [0.002, 0.02]}  # sampled: choice, uniform, loguniform, randint (ends included)
num_samples: 2                   # the grid repeated, sampled values drawn anew each time
seeds: [1, 2, 3]                 # every trial trains these seeds as one group (or num_seeds: 3)
metric: iqm                      # iqm (default) or mean of the seeds' last-10-episode returns
mode: max                        # max (default) or min
```

A network given by a file path (``actor: nets/custom.py:DeepActor``) is taken from the current
folder, as ``train --config`` takes it, and recorded by its absolute path: the trials train in
Ray's processes, in folders of their own.
"""

from __future__ import annotations

import difflib
import itertools
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.usercode import is_file_path
from rl_graphstep.settings.config import (
    FIELD_TYPES,
    FIELDS,
    Config,
    coerce_mapping,
    field_default,
    network_problem,
    plain_value,
)
from rl_graphstep.settings.configfile import read_config_file, read_yaml_mapping
from rl_graphstep.settings.seedgroup import MAX_SEEDS, seed_list_problem
from rl_graphstep.settings.values import value_problem

__all__ = ["SAMPLERS", "Sampled", "SweepSpec", "check_trials", "checked_points",
           "effective_base", "read_sweep_file", "sweep_record", "trial_config", "trial_source"]

NAME_MAX = 255  # bytes of a file name on most file systems
KEYS = ("name", "base", "search", "num_samples", "seeds", "num_seeds", "metric", "mode")
METRICS = ("iqm", "mean")
MODES = ("max", "min")
SAMPLERS = ("choice", "uniform", "loguniform", "randint")
# Set for every trial by the sweep itself: a search over them would fight it.
TRIAL_OWNED = ("seed", "seeds", "num_seeds", "log_dir", "run_name", "resume", "config")
# Settings that may name a file (``path/file.py:Class``), which a trial opens from another
# folder than the one the sweep started in.
FILE_SPECS = ("actor", "critic")


@dataclass(frozen=True)
class Sampled:
    """A sampled dimension: ``kind`` one of ``SAMPLERS``; ``values`` the choices, or the two
    ends of the range (both included)."""

    kind: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file: every value already of its field's type."""

    name: str
    source: str
    base: dict[str, Any]
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    sampled: dict[str, Sampled] = field(default_factory=dict)
    num_samples: int = 1
    seeds: tuple[int, ...] = (1,)
    metric: str = "iqm"
    mode: str = "max"

    @property
    def trials(self) -> int:
        """How many trials the sweep runs: the grid's size times ``num_samples``."""
        return math.prod(len(values) for values in self.grid.values()) * self.num_samples

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, in file order (one empty point if none)."""
        names = list(self.grid)
        return [dict(zip(names, values, strict=True))
                for values in itertools.product(*(self.grid[n] for n in names))]


def _problem(source: str, what: str) -> ConfigError:
    return ConfigError(f"{what} in {source}")


def _unknown(key: object, known: tuple[str, ...], what: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return _problem(source, f"unknown {what} {key!r}{hint}; valid: {', '.join(known)}")


def _field_value(name: str, value: Any, source: str) -> Any:
    """``value`` as field ``name``'s type, checked (one line naming both on a problem), a file
    path made absolute."""
    return _absolute_files(coerce_mapping({name: value}, source), source)[name]


def _absolute_files(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with each network given by a relative file path (``nets/custom.py:Class``)
    given by its absolute one, taken from the current folder as ``train`` takes it: a trial
    runs in a Ray worker whose working folder is elsewhere. A file that is not there is one
    line now rather than a failure of every trial."""
    out = dict(values)
    for name in FILE_SPECS:
        spec = out.get(name)
        if not isinstance(spec, str) or ":" not in spec:
            continue
        location, _, class_name = spec.rpartition(":")
        if not is_file_path(location):
            continue  # package.module:Class, imported (Ray's workers share this folder's path)
        path = Path(location).expanduser()
        if not path.is_file():
            relative = "" if path.is_absolute() else (
                f" (relative paths are taken from {os.getcwd()})")
            raise _problem(source, f"{name}: file {location!r} for {spec!r} does not exist"
                                   f"{relative}")
        out[name] = f"{path.resolve()}:{class_name}"
    return out


def _read_base(raw: Any, source: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _problem(source, f"base must be a mapping of training settings, got {raw!r}")
    base = dict(raw)
    from_file: dict[str, Any] = {}
    if "config" in base:
        path = base.pop("config")
        if not isinstance(path, str):
            raise _problem(source, f"base config must be a file's path, got {path!r}")
        try:
            from_file = read_config_file(path)
        except ConfigError as err:
            raise ConfigError(f"{err} (the base config of {source})") from None
    owned = sorted(set(base) & set(TRIAL_OWNED))
    if owned:
        raise _problem(source, f"base cannot set {owned[0]!r}: the sweep sets it for every "
                               "trial (give seeds or num_seeds at the top level)")
    where = f"{source}'s base"
    return _absolute_files({**from_file, **coerce_mapping(base, where)}, where)


def _read_sampled(name: str, raw: Mapping[Any, Any], source: str) -> Sampled:
    where = f"{source}'s search for {name!r}"
    if len(raw) != 1 or next(iter(raw)) not in SAMPLERS:
        keys = ", ".join(map(str, raw)) or "nothing"
        raise _problem(where, f"a sampled value needs exactly one of {', '.join(SAMPLERS)}, "
                              f"got {keys}")
    kind, values = next(iter(raw.items()))
    if not isinstance(values, list) or not values:
        raise _problem(where, f"{kind} takes a non-empty list, got {values!r}")
    typed = tuple(_field_value(name, v, where) for v in values)
    if kind == "choice":
        return Sampled(kind, typed)
    if len(typed) != 2:
        raise _problem(where, f"{kind} takes [low, high], got {values!r}")
    low, high = typed
    if isinstance(low, bool) or not isinstance(low, int | float):
        raise _problem(where, f"{kind} needs numbers, and {name} is not numeric")
    if kind == "randint" and not (isinstance(low, int) and isinstance(high, int)):
        raise _problem(where, f"randint needs whole numbers, got {values!r}")
    if kind != "randint" and FIELD_TYPES[name] is int:
        raise _problem(where, f"{kind} draws fractional numbers and {name} is a whole number; "
                              f"use randint: [{low}, {high}]")
    if not low < high:
        raise _problem(where, f"{kind} needs low < high, got [{low}, {high}]")
    if kind == "loguniform" and low <= 0:
        raise _problem(where, f"loguniform needs low > 0, got {low}")
    return Sampled(kind, typed)


def _read_search(raw: Any, source: str) -> tuple[dict[str, tuple[Any, ...]], dict[str, Sampled]]:
    if raw is None:
        return {}, {}
    if not isinstance(raw, Mapping):
        raise _problem(source, f"search must be a mapping of settings to values, got {raw!r}")
    grid: dict[str, tuple[Any, ...]] = {}
    sampled: dict[str, Sampled] = {}
    for name, values in raw.items():
        if name in TRIAL_OWNED:
            raise _problem(source, f"search cannot vary {name!r}: the sweep sets it for every "
                                   "trial")
        if name not in FIELDS:
            raise _unknown(name, tuple(FIELDS), "setting in search", source)
        if isinstance(values, Mapping):
            sampled[name] = _read_sampled(name, values, source)
        elif isinstance(values, list) and values:
            where = f"{source}'s search for {name!r}"
            grid[name] = tuple(_field_value(name, v, where) for v in values)
            twice = next((v for i, v in enumerate(grid[name]) if v in grid[name][:i]), None)
            if twice is not None:
                raise _problem(source, f"search for {name!r} lists {plain_value(twice)!r} twice: "
                                       "the grid would train the same trials again; list each "
                                       "value once (num_samples repeats the grid)")
        else:
            raise _problem(source, f"search for {name!r} must be a non-empty list (a grid) or "
                                   f"one of {', '.join(SAMPLERS)}, got {values!r}")
    return grid, sampled


def _read_seeds(data: Mapping[str, Any], source: str) -> tuple[int, ...]:
    if "seeds" in data and "num_seeds" in data:
        raise _problem(source, "give seeds or num_seeds, not both")
    if "num_seeds" in data:
        count = data["num_seeds"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SEEDS:
            raise _problem(source, f"num_seeds must be a whole number from 1 to {MAX_SEEDS}, "
                                   f"got {count!r}")
        return tuple(range(1, count + 1))
    raw = data.get("seeds", [1])
    if not isinstance(raw, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                            for s in raw):
        raise _problem(source, f"seeds must be a list of whole numbers, got {raw!r}")
    problem = seed_list_problem(tuple(raw))
    if problem:
        raise _problem(source, f"seeds {problem}")
    return tuple(raw)


def read_sweep_file(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; every problem is a ``ConfigError`` of one line."""
    path = Path(path)
    source = str(path)
    data = read_yaml_mapping(path, "sweep file")
    for key in data:
        if key not in KEYS:
            raise _unknown(key, KEYS, "sweep key", source)
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name or value_problem("run_name", name) or len(
            os.fsencode(name)) > NAME_MAX:
        raise _problem(source, f"name must be a folder name (no / or \\, not . or .., no "
                               f"control characters, at most {NAME_MAX} bytes), got {name!r}")
    samples = data.get("num_samples", 1)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise _problem(source, f"num_samples must be a positive whole number, got {samples!r}")
    for key, allowed in (("metric", METRICS), ("mode", MODES)):
        if data.get(key, allowed[0]) not in allowed:
            raise _problem(source, f"{key} must be one of {', '.join(allowed)}, "
                                   f"got {data[key]!r}")
    grid, sampled = _read_search(data.get("search"), source)
    spec = SweepSpec(name=name, source=source, base=_read_base(data.get("base"), source),
                     grid=grid, sampled=sampled, num_samples=samples,
                     seeds=_read_seeds(data, source), metric=data.get("metric", "iqm"),
                     mode=data.get("mode", "max"))
    check_trials(spec)
    return spec


# Up to this many trial configs are built to check a sweep file (each takes about 0.1 ms);
# a larger search has each of its values checked beside the others' first.
MAX_CHECKED = 20_000


def check_trials(spec: SweepSpec) -> None:
    """Raise the ``ConfigError`` of a trial whose config would not build (``total_timesteps``
    below ``learning_starts`` in some trials, say), naming its values, so that it is one line
    before Ray starts rather than a trial that fails, and is retried, in it."""
    for params in checked_points(spec):
        cfg = trial_config(spec, params, log_dir="runs", run_name="check")
        problem = network_problem(cfg, actor=cfg.actor is not None,
                                  critic=cfg.critic is not None)
        if problem:
            raise ConfigError(f"{problem} (in {trial_source(spec, params)})")


def checked_points(spec: SweepSpec) -> Iterator[dict[str, Any]]:
    """The searched values of the trials to check: every combination of the grid's values,
    the choices and the ends of each sampled range (a value between two ends that build
    builds too: the checks are bounds); past ``MAX_CHECKED`` combinations, each value beside
    the others' first."""
    values = {**spec.grid, **{name: s.values for name, s in spec.sampled.items()}}
    names = list(values)
    if math.prod(len(v) for v in values.values()) <= MAX_CHECKED:
        points: Iterable[tuple[Any, ...]] = itertools.product(*values.values())
    else:
        first = tuple(v[0] for v in values.values())
        points = ((*first[:i], value, *first[i + 1:])
                  for i, name in enumerate(names) for value in values[name])
    for point in points:
        yield dict(zip(names, point, strict=True))


def trial_source(spec: SweepSpec, params: Mapping[str, Any]) -> str:
    """``sweep.yaml, with {'q_lr': 0.1}``: where a trial's settings come from, for its line."""
    return f"{spec.source}, with {dict(params)!r}" if params else spec.source


def sweep_record(spec: SweepSpec) -> dict[str, Any]:
    """``spec`` as a sweep file holds it, with its base config file expanded into its base and
    file paths absolute: what a sweep folder keeps of the sweep it started (a sweep file that
    ``read_sweep_file`` reads as ``spec``)."""
    search: dict[str, Any] = {name: plain_value(values) for name, values in spec.grid.items()}
    for name, sampled in spec.sampled.items():
        search[name] = {sampled.kind: plain_value(sampled.values)}
    return {"name": spec.name, "base": plain_value(spec.base), "search": search,
            "num_samples": spec.num_samples, "seeds": list(spec.seeds),
            "metric": spec.metric, "mode": spec.mode}


def effective_base(base: dict[str, Any]) -> dict[str, Any]:
    """Every setting the trials take from ``base``: its own values and the defaults of the
    rest (those the sweep sets for each trial left out), so a default written out or left
    out is the same base."""
    values = {f.name: plain_value(field_default(f)) for f in FIELDS.values()
              if f.name not in TRIAL_OWNED}
    return {**values, **{k: plain_value(v) for k, v in base.items()}}


def trial_config(spec: SweepSpec, params: Mapping[str, Any], *, log_dir: str,
                 run_name: str) -> Config:
    """One trial's config: the base, then ``params`` (typed as their fields), the sweep's
    seeds as one group, and the trial's own folder ``log_dir/run_name``."""
    typed = coerce_mapping(params, f"the trial settings {dict(params)!r}")
    seeds = spec.seeds
    group = ({"seed": seeds[0], "num_seeds": len(seeds)}
             if seeds == tuple(range(seeds[0], seeds[0] + len(seeds)))
             else {"seeds": seeds, "num_seeds": len(seeds)})
    try:
        return Config(**{**spec.base, **typed, **group, "log_dir": log_dir,
                         "run_name": run_name})
    except ConfigError as err:
        raise ConfigError(f"{err} (in {trial_source(spec, params)})") from None
