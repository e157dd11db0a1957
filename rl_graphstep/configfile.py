"""The YAML config files: the shipped one tuned for an env's family, and reading one file."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.config import coerce_mapping
from rl_graphstep.errors import ConfigError

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11+; the package supports 3.10
    from importlib.resources.abc import Traversable

# Env-id base names (before "-vN") that share the MuJoCo default hyperparameters.
MUJOCO_ENVS: frozenset[str] = frozenset(
    {
        "Ant",
        "HalfCheetah",
        "Hopper",
        "Humanoid",
        "HumanoidStandup",
        "InvertedDoublePendulum",
        "InvertedPendulum",
        "Pusher",
        "Reacher",
        "Swimmer",
        "Walker2d",
    }
)



def default_config_file(env_id: str, algo: str = "sac") -> Traversable | None:
    """The shipped `configs/{algo}_{family}.yaml` tuned for env_id's family, or None (also for
    an unknown algo, which Config then reports)."""
    base = env_id.rsplit("/", 1)[-1].split("-v")[0]
    family = "pendulum" if base == "Pendulum" else "mujoco" if base in MUJOCO_ENVS else None
    if family is None or algo not in ALGORITHMS:
        return None
    path = _configs_dir() / f"{algo}_{family}.yaml"
    return path if path.is_file() else None


def _configs_dir() -> Traversable:
    """The shipped configs: package data when installed, the checkout's `configs/` when the
    package runs straight from a source tree (not installed)."""
    try:
        return importlib.resources.files("rl_graphstep.configs")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "configs"


def read_config_file(path: Path | Traversable | str) -> dict[str, Any]:
    """Read, type-check and value-check one YAML config file (a partial mapping of fields).
    A file cannot resume a run: ``--resume`` keeps the run's own config, which the file's
    other settings (and, under it, the defaults) would otherwise silently replace."""
    values = coerce_mapping(read_yaml_mapping(path), str(path))
    if values.get("resume") is not None:
        raise ConfigError(f"config file {str(path)!r} sets resume: a run is resumed with "
                          "--resume RUN on the command line, with its own config (override "
                          "single settings with their flags); remove the line")
    return values


def read_yaml_mapping(path: Path | Traversable | str, kind: str = "config file"
                      ) -> dict[str, Any]:
    """One YAML file's top-level mapping, unchecked (empty for an empty file); a missing file,
    bad YAML or another top level is one line naming the ``kind`` of file."""
    path = Path(path) if isinstance(path, str) else path
    name = str(path)
    if not path.is_file():
        what = "is not a file" if isinstance(path, Path) and path.exists() else "does not exist"
        raise ConfigError(f"{kind} {name!r} {what}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{kind} {name!r} is not valid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{kind} {name!r} cannot be read: {err}") from None
    if data is None:  # an empty file (or only comments) changes nothing
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{kind} {name!r} must be a mapping of key: value lines, "
            f"got a YAML {type(data).__name__}"
        )
    return data
