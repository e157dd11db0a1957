"""The YAML config files: the shipped one tuned for an env's family, and reading one file;
the YAML loader every file and flag the project reads goes through (a key given twice is an
error, not the last value silently)."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.settings.config import coerce_mapping
from rl_graphstep.settings.fieldtypes import user_path

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

# Env-id base names of gymnasium's classic control tasks (Pendulum has a family of its own).
CLASSIC_ENVS: frozenset[str] = frozenset(
    {"CartPole", "Acrobot", "MountainCar", "MountainCarContinuous"})


def env_family(env_id: str) -> str | None:
    """The family whose shipped files suit ``env_id``: pendulum, mujoco, classic, or None."""
    base = env_id.rsplit("/", 1)[-1].split("-v")[0]
    if base == "Pendulum":
        return "pendulum"
    return "mujoco" if base in MUJOCO_ENVS else "classic" if base in CLASSIC_ENVS else None


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a YAML text gives one key twice, at ``first`` and at ``second``."""

    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        where = (f"lines {first.line + 1} and {second.line + 1}" if first.line != second.line
                 else f"line {first.line + 1}, columns {first.column + 1} and "
                      f"{second.column + 1}")
        super().__init__(f"key {key!r} appears twice ({where})")
        self.key = key


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, at any depth (the
    safe loader keeps the last value, so the line a user edited may be the one ignored)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Checked before the base class flattens `<<` merges, whose keys a mapping may
        # override by design.
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse one YAML document safely; a key given twice raises :class:`DuplicateKeyError`."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: builds plain values only


def default_config_file(env_id: str, algo: str = "sac") -> Traversable | None:
    """The shipped `configs/{algo}_{family}.yaml` tuned for env_id's family, or None (also for
    an unknown algo, which the algorithms' registry then reports, and for a family with no
    file of that algo: ppo_classic.yaml has no SAC twin)."""
    family = env_family(env_id)
    if family is None or not algo.isidentifier():
        return None
    path = configs_dir() / f"{algo}_{family}.yaml"
    return path if path.is_file() else None


def configs_dir() -> Traversable:
    """The shipped configs: package data when installed, the checkout's `configs/` when the
    package runs straight from a source tree (not installed). Missing, a run would silently
    train with the bare defaults instead of the tuned ones, so that is an error."""
    try:
        return importlib.resources.files("rl_graphstep.configs")
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2] / "configs"  # rl_graphstep/settings/
        if not (checkout / "sac_pendulum.yaml").is_file():
            raise FileNotFoundError(
                f"the shipped configs are missing: neither the package rl_graphstep.configs nor "
                f"{checkout} holds them; install the package (pip install -e .)") from None
        return checkout


def shipped_config_names() -> list[str]:
    """The shipped config files' names, without ``.yaml``."""
    return sorted(f.name.removesuffix(".yaml") for f in configs_dir().iterdir()
                  if f.name.endswith(".yaml"))


def config_file_path(text: str) -> Path | Traversable:
    """A ``--config`` value: the path of a YAML file, or, where no file of that name is here
    and it names no folder, a shipped file by its name (``sac_mujoco_parallel`` or
    ``sac_mujoco_parallel.yaml``), so an installed package's configs need no checkout; a
    name that is neither is one line listing the shipped names."""
    path = user_path(text)
    if path.exists() or "/" in text or os.sep in text:
        return path
    shipped = configs_dir() / (text if text.endswith(".yaml") else f"{text}.yaml")
    if shipped.is_file():
        return shipped
    raise ConfigError(f"config file {text!r} does not exist, and no shipped config has that "
                      f"name (shipped: {', '.join(shipped_config_names())})")


def read_config_file(path: Path | Traversable | str) -> dict[str, Any]:
    """Read, type-check and value-check one YAML config file (a partial mapping of fields),
    given as a path or (a string) as :func:`config_file_path` reads it. A file cannot resume
    a run: ``--resume`` keeps the run's own config, which the file's other settings (and,
    under it, the defaults) would otherwise silently replace."""
    if isinstance(path, str):
        path = config_file_path(path)
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
    path = user_path(path) if isinstance(path, str) else path
    name = str(path)
    if not path.is_file():
        what = "is not a file" if isinstance(path, Path) and path.exists() else "does not exist"
        raise ConfigError(f"{kind} {name!r} {what}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as err:
        raise ConfigError(f"{kind} {name!r}: {err}; keep one of them") from None
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
